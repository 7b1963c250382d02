"""Issue 5: steps that record nothing leave no rows behind in the log writer's memory, and
start() writes the skeleton without taking rows (the start marker is still flushed)."""
from __future__ import annotations

import json

import torch

from msprobe.pytorch import PrecisionDebugger
from store.log_reader import read_log


def test_empty_steps_leave_no_retained_rows(tmp_path):
    model = torch.nn.Linear(2, 2)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    for _ in range(3):  # started and stopped, but no call was recorded
        dbg.start(model)
        dbg.stop()
        dbg.step()
    writer = dbg.session._writer
    assert writer._retained == [] and writer._pending_rows == 0
    dbg.start(model)  # the skeleton of step 3: files with no data, the start marker on disk
    for name in ("dump.json", "stack.json", "construct.json"):
        doc = json.loads((tmp_path / "d" / "step3" / "rank" / name).read_text())
        assert (doc["data"] if name == "dump.json" else doc) == {}
    rows = read_log(tmp_path / "d").table
    markers = [(r["step"], r["kind"]) for r in rows.to_pylist() if r["row"] == "marker"]
    assert markers == [(s, k) for s in range(3) for k in ("start", "stop", "step_end")] + [(3, "start")]
    model(torch.ones(1, 2))
    dbg.stop()
    dbg.step()
    dbg.close()
    data = json.loads((tmp_path / "d" / "step3" / "rank" / "dump.json").read_text())["data"]
    assert list(data) == ["Functional.linear.0.forward"]
