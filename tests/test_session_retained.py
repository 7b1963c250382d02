"""Steps that record nothing leave no rows behind in the log writer's memory, and
start() writes the skeleton without taking rows (the start marker is still flushed)."""
from __future__ import annotations

import json
import threading

import pytest
import torch

from msprobe.pytorch import PrecisionDebugger
from store import schema as S
from store.log_reader import read_log
from store.log_writer import LogWriter
from store.records import Call, Leaf, Marker

@pytest.fixture(autouse=True)
def _log_in_this_process(monkeypatch):
    """These tests look into the session's own log writer (the writer process's is the same
    class, tests/store/test_writer_process.py)."""
    monkeypatch.setenv("MSPROBE_WRITER", "inprocess")


META = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "rank_dir": "rank"}


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
    dbg.close()
    rows = read_log(tmp_path / "d").table.to_pylist()
    markers = [(r["step"], r["kind"]) for r in rows if r["row"] == "marker"]
    assert markers == [(s, k) for s in range(5) for k in ("start", "stop", "step_end")]
    for step in range(5):  # every step exported with its own input
        data = json.loads((tmp_path / "d" / f"step{step}" / "rank" / "dump.json").read_text())["data"]
        assert data["Functional.linear.0.forward"]["input_args"][0]["Max"] == float(step)


def _call(step: int, name: str) -> Call:
    return Call(step=step, kind="api_forward", name=name, api_type="Torch",
                leaves=(Leaf(io="output", path=(0,), leaf_kind="none"),))


def test_drop_step_rows_keeps_other_steps(tmp_path):
    """LogWriter.drop_step_rows forgets the retained rows of one step only, also inside one
    flushed batch holding rows of steps 0, 1 and 2 (the other steps keep their rows and
    their Python columns)."""
    with LogWriter(tmp_path, 0, flush_rows=10**6, flush_interval_s=3600) as writer:
        writer.append(_call(0, "Torch.a.0.forward"))
        writer.append_marker(Marker(step=1, kind="start", meta=META))
        writer.append(_call(1, "Torch.b.0.forward"))
        writer.append(_call(2, "Torch.c.0.forward"))
        writer.flush()
        assert len(writer._retained) == 1
        writer.drop_step_rows(1)
        assert writer.take_step(1).num_rows == 0
        rows0 = writer.take_step(0)
        assert rows0.column(S.NAME).to_pylist() == ["Torch.a.0.forward", "Torch.a.0.forward"]
        assert rows0.column(S.ROW).to_pylist() == ["call", "leaf"]
        rows2 = writer.take_step(2)
        assert rows2.column(S.NAME).to_pylist() == ["Torch.c.0.forward", "Torch.c.0.forward"]
        assert writer._retained == []


class _SignallingLock:
    """A session lock wrapper: sets ``waiting`` when a thread other than ``owner`` asks for it."""

    def __init__(self, inner, owner):
        self.inner, self.owner, self.waiting = inner, owner, threading.Event()

    def __enter__(self):
        if threading.current_thread() is not self.owner:
            self.waiting.set()
        self.inner.acquire()
        return self

    def __exit__(self, *exc):
        self.inner.release()


def test_entry_racing_step_end_is_neither_logged_nor_retained(tmp_path):
    """An entry of step 0 emitted by another thread that passed Session.emit's open_step
    check while step() held the session lock is dropped once it gets the lock: not appended
    after step 0's step_end marker (offline export of step 0 would then differ from the live
    one), not kept in the writer's retained rows for the rest of the run."""
    model = torch.nn.Linear(2, 2)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    session = dbg.session
    dbg.start(model)
    model(torch.ones(1, 2))
    dbg.stop()
    lock = session._lock = _SignallingLock(session._lock, threading.current_thread())
    late = threading.Thread(target=session.emit, args=(_call(0, "Torch.late.0.forward"),))
    with lock:
        late.start()
        assert lock.waiting.wait(10)  # the thread passed open_step(0) and waits for the lock
        dbg.step()
    late.join(10)
    for _ in range(2):  # two more steps, each exported completely
        dbg.start(model)
        model(torch.ones(1, 2))
        dbg.stop()
        dbg.step()
    writer = session._writer
    retained = [r for part in writer._retained for r in part.rows().to_pylist()]
    dbg.close()
    names = [r[S.NAME] for r in read_log(tmp_path / "d").table.to_pylist()
             if r[S.ROW] == S.ROW_CALL and r[S.STEP] == 0]
    assert retained == [] and "Torch.late.0.forward" not in names
    assert names == ["Functional.linear.0.forward"]
