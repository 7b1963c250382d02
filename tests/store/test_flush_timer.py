"""store.log_writer flush timer: rows older than ``flush_interval_s`` reach the file without
another append; the timer thread ends at close() (and when a writer is dropped), never
writes after close(), and a fault it hits is raised once from the next call."""
from __future__ import annotations

import gc
import os
import threading
import time

import pytest

from store import schema as S
from store.errors import StoreWriteError
from store.log_reader import LogReader
from store.log_writer import LogWriter
from store.records import Call, Leaf, Marker
from test_log_writer import FlakyFile

LEAF = Leaf(io="output", path=(0,), leaf_kind="tensor", type="torch.Tensor", dtype="torch.float32",
            shape=(2,), numel=2, max=3.5, min=-1.25, mean=1.125, norm=3.716517186,
            requires_grad=False, has_nan=False, has_inf=False)
CALL = Call(step=0, kind="api_forward", name="Torch.add.0.forward", api_type="Torch",
            keys=("output",), leaves=(LEAF,))


def file_rows(writer: LogWriter) -> list[dict]:
    """Every complete row in ``writer``'s file now (none before the file exists)."""
    if writer.path is None:
        return []
    reader = LogReader(writer.path)
    return [row for batch in reader.read_new() for row in batch.to_pylist()]


def wait_until(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def new_threads(make):
    """``(result of make(), the threads it started)``."""
    before = set(threading.enumerate())
    result = make()
    return result, [t for t in threading.enumerate() if t not in before]


def test_rows_reach_the_file_without_another_append(tmp_path):
    writer, (timer,) = new_threads(lambda: LogWriter(tmp_path, 2, flush_rows=10_000, flush_interval_s=0.2))
    assert timer.daemon and timer.name == "msprobe-log-flush"
    seq = writer.append(CALL)
    writer.append_marker(Marker(step=0, kind=S.MARKER_START, meta={"a": 1}))
    assert wait_until(lambda: len(file_rows(writer)) == 3)  # no append, flush or close since
    rows = file_rows(writer)
    call, leaf, marker = rows
    assert (call[S.ROW], call[S.SEQ], call[S.NAME], call[S.RANK]) == (
        S.ROW_CALL, seq, "Torch.add.0.forward", 2)
    assert (leaf[S.ROW], leaf[S.MAX], leaf[S.MIN], leaf[S.MEAN], leaf[S.NORM], leaf[S.SHAPE]) == (
        S.ROW_LEAF, 3.5, -1.25, 1.125, 3.716517186, [2])
    assert (marker[S.ROW], marker[S.SEQ], marker[S.META]) == (S.ROW_MARKER, seq + 1, '{"a":1}')
    # a second burst after the timed flush is flushed too, as a second batch
    writer.append(CALL)
    assert wait_until(lambda: len(file_rows(writer)) == 5)
    assert [r[S.SEQ] for r in file_rows(writer)] == [0, 0, 1, 2, 2]
    writer.close()
    assert not timer.is_alive()  # close() joins it


def test_timed_rows_stay_available_to_take_step(tmp_path):
    writer = LogWriter(tmp_path, 0, flush_rows=10_000, flush_interval_s=0.1)
    writer.append(CALL)
    assert wait_until(lambda: len(file_rows(writer)) == 2)
    table = writer.take_step(0)
    assert table.column(S.NAME).to_pylist() == ["Torch.add.0.forward"] * 2
    assert table.column(S.MAX).to_pylist() == [None, 3.5]
    writer.close()


def test_nothing_is_written_after_close(tmp_path):
    writer, (timer,) = new_threads(lambda: LogWriter(tmp_path, 0, flush_rows=10_000, flush_interval_s=0.05))
    writer.append(CALL)
    writer.close()
    assert not timer.is_alive()
    size = writer.path.stat().st_size
    assert writer.append(CALL) == -1
    time.sleep(0.3)  # six intervals
    assert writer.path.stat().st_size == size
    assert [r[S.SEQ] for r in file_rows(writer)] == [0, 0]


def test_no_thread_for_interval_zero_or_infinite(tmp_path):
    for interval in (0.0, float("inf")):
        writer, started = new_threads(
            lambda: LogWriter(tmp_path / str(interval), 0, flush_interval_s=interval))
        assert started == []
        writer.close()


def test_a_dropped_writer_lets_its_timer_end(tmp_path):
    writer, (timer,) = new_threads(lambda: LogWriter(tmp_path, 0, flush_interval_s=3600))
    writer.append(CALL)
    del writer
    gc.collect()
    timer.join(timeout=20)
    assert not timer.is_alive()


@pytest.mark.parametrize("next_call", ["append", "close"])
def test_a_fault_of_the_timer_is_raised_once_by_the_next_call(tmp_path, next_call):
    files = []

    def opener(path):
        files.append(FlakyFile(path))
        return files[-1]

    writer, (timer,) = new_threads(
        lambda: LogWriter(tmp_path, 0, flush_rows=10_000, flush_interval_s=0.3, _open=opener))
    writer.append(CALL)
    writer.flush()
    files[0].full = True
    writer.append(CALL)
    assert wait_until(lambda: writer.failed)  # the timer's flush hit the full disk
    timer.join(timeout=20)
    assert not timer.is_alive()  # a failed writer's timer ends
    with pytest.raises(StoreWriteError, match="No space left on device"):
        getattr(writer, next_call)(*((CALL,) if next_call == "append" else ()))
    assert writer.append(CALL) == -1  # once: later calls are no-ops
    writer.flush()
    writer.close()
    assert [r[S.SEQ] for r in file_rows(writer)] == [0, 0]  # the batch before the fault


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_the_lock_is_held_does_not_hang(tmp_path):
    """The timer (or any thread) may hold the writer's lock mid-flush when the process
    forks; the child's copy of the writer gets a fresh lock and writes nothing."""
    writer = LogWriter(tmp_path, 0, flush_rows=10_000, flush_interval_s=3600)
    writer.append(CALL)
    writer.flush()
    size = writer.path.stat().st_size
    writer.append(CALL)
    holding, release = threading.Event(), threading.Event()

    def hold():
        with writer._lock:
            holding.set()
            release.wait(20)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(20)
    pid = os.fork()
    if pid == 0:  # the child: append, flush, close, then leave without running pytest's exit
        code = 1
        try:
            writer.append(CALL)
            writer.flush()
            writer.close()
            code = 0
        finally:
            os._exit(code)
    release.set()
    holder.join()
    deadline = time.monotonic() + 20
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on the writer's lock")
    assert os.waitstatus_to_exitcode(status) == 0
    assert writer.path.stat().st_size == size  # the child wrote nothing into the parent's log
    writer.close()
    assert [r[S.SEQ] for r in file_rows(writer)] == [0, 0, 1, 1]
