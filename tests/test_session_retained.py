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


def test_recorded_steps_leave_no_retained_rows(tmp_path):
    """The step_end marker is flushed after the step's last take: step() forgets it, so a
    long run keeps no batch per step in memory (it kept one small batch per step before)."""
    model = torch.nn.Linear(2, 2)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    for step in range(5):
        dbg.start(model)
        model(torch.full((1, 2), float(step)))
        dbg.stop()
        dbg.step()
        writer = dbg.session._writer
        assert writer._retained == [] and writer._pending_rows == 0
        assert writer.take_step_rows(None).num_entry_rows == 0
    dbg.close()
    rows = read_log(tmp_path / "d").table.to_pylist()
    markers = [(r["step"], r["kind"]) for r in rows if r["row"] == "marker"]
    assert markers == [(s, k) for s in range(5) for k in ("start", "stop", "step_end")]
    for step in range(5):  # every step exported with its own input
        data = json.loads((tmp_path / "d" / f"step{step}" / "rank" / "dump.json").read_text())["data"]
        assert data["Functional.linear.0.forward"]["input_args"][0]["Max"] == float(step)


def test_drop_step_rows_keeps_other_steps(tmp_path):
    """LogWriter.drop_step_rows forgets the retained rows of one step only."""
    from store.log_writer import LogWriter
    from store.records import Marker

    meta = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "rank_dir": "rank"}
    with LogWriter(tmp_path, 0, flush_rows=1, flush_interval_s=3600) as writer:
        for step in (0, 1, 2):
            writer.append_marker(Marker(step=step, kind="start", meta=meta))
        writer.drop_step_rows(1)
        assert writer.take_step_rows(1).table().num_rows == 0
        assert writer.take_step_rows(0).table().column("step").to_pylist() == [0]
        assert writer.take_step_rows(None).table().column("step").to_pylist() == [2]
