"""store/payload_writer.py: content-addressed safetensors shards, read back through the
reader and through the safetensors library itself."""
from __future__ import annotations

import os
import signal
import stat
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from store.errors import StoreError, StoreWriteError
from store.payload_writer import PayloadReader, PayloadWriter, content_key, payload_dir


def test_round_trip_and_dedup(tmp_path):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([1 + 2j, -3j], dtype=np.complex64)
    with PayloadWriter(tmp_path, rank=0) as w:
        ra = w.put(a.tobytes(), "torch.float32", (2, 3))
        rb = w.put(b.tobytes(), "torch.complex64", (2,))
        assert w.put(a.tobytes(), "torch.float32", (2, 3)) == ra       # identical bytes: stored once
        assert w.put(a.tobytes(), "torch.int32", (2, 3)) != ra         # same bytes, other dtype
        assert w.stored_bytes == 24 + 16 + 24 and w.referenced_bytes == 24 * 3 + 16
    r = PayloadReader(tmp_path)
    pa_, pb = r.read(ra), r.read(rb)
    assert (pa_.dtype, pa_.shape, pa_.data) == ("torch.float32", (2, 3), a.tobytes())
    assert (pb.dtype, pb.shape) == ("torch.complex64", (2,))
    assert np.array_equal(np.frombuffer(pb.data, np.complex64), b)
    shards = sorted(payload_dir(tmp_path).iterdir())
    assert len(shards) == 1 and stat.S_IMODE(shards[0].stat().st_mode) == 0o640
    # a plain safetensors file: the library reads the float tensor under its content key
    loaded = load_file(str(shards[0]))
    key = ra.split(":")[1]
    assert key == content_key(a.tobytes(), "torch.float32", (2, 3))
    assert np.array_equal(loaded[key], a)
    assert loaded[rb.split(":")[1]].dtype == np.uint8  # complex stored as bytes


def test_shard_rollover_and_tiny_queue(tmp_path):
    with PayloadWriter(tmp_path, rank=3, queue_size=1, shard_bytes=10) as w:
        refs = [w.put(bytes([i]) * 8, "torch.uint8", (8,)) for i in range(5)]
    shards = {ref.split(":")[0] for ref in refs}
    assert len(shards) >= 3 and all(s.startswith("rank3.") for s in shards)
    r = PayloadReader(tmp_path)
    assert [r.read(ref).data for ref in refs] == [bytes([i]) * 8 for i in range(5)]


def test_flush_makes_shard_visible_and_empty_tensor(tmp_path):
    w = PayloadWriter(tmp_path, rank=0)
    ref = w.put(b"", "torch.float16", (0, 4))
    with pytest.raises(FileNotFoundError):
        PayloadReader(tmp_path).read(ref)
    w.flush()
    p = PayloadReader(tmp_path).read(ref)
    assert (p.data, p.shape) == (b"", (0, 4))
    w.close()
    w.close()  # idempotent
    with pytest.raises(StoreWriteError, match="closed"):
        w.put(b"x", "torch.uint8", (1,))


def test_background_failure_is_reported(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    w = PayloadWriter(blocker, rank=0)
    w.put(b"abcd", "torch.float32", (1,))
    with pytest.raises(StoreWriteError, match="payload writer failed"):
        w.flush()
    with pytest.raises(StoreWriteError):
        w.put(b"efgh", "torch.float32", (1,))
    with pytest.raises(StoreWriteError):
        w.close()


@pytest.mark.parametrize("ref", ["nocolon", "../x:abc", "shard:"])
def test_bad_reference(tmp_path, ref):
    with pytest.raises((StoreError, FileNotFoundError)):
        PayloadReader(tmp_path).read(ref)


def test_bad_bounds(tmp_path):
    with pytest.raises(ValueError, match="queue_size"):
        PayloadWriter(tmp_path, rank=0, queue_size=0)
    with pytest.raises(ValueError, match="shard_bytes"):
        PayloadWriter(tmp_path, rank=0, shard_bytes=0)


def test_pending_bytes_bound_blocks_put_until_the_writer_catches_up(tmp_path):
    import threading

    gate = threading.Event()
    staged = []

    def slow_stager(path, payload):
        gate.wait(5)
        staged.append(bytes(payload.data))
        path.write_bytes(bytes(payload.data))

    w = PayloadWriter(tmp_path, rank=0, pending_bytes=64, stage=(slow_stager, "raw"))
    w.put(b"a" * 40, "torch.uint8", (40,))  # taken by the writer, which waits at the gate
    done = threading.Event()
    t = threading.Thread(target=lambda: (w.put(b"b" * 40, "torch.uint8", (40,)), done.set()))
    t.start()
    assert not done.wait(0.3)  # 40 + 40 > 64 bytes pending: blocked
    gate.set()
    assert done.wait(5)
    t.join()
    w.close()
    assert staged == [b"a" * 40, b"b" * 40]


def test_forgotten_key_is_stored_again_and_the_shard_stays_valid(tmp_path):
    a, b = np.arange(4, dtype=np.float32), np.ones(4, dtype=np.float32)
    with PayloadWriter(tmp_path, rank=0, index_size=1) as w:
        ra = w.put(a.tobytes(), "torch.float32", (4,))
        w.put(b.tobytes(), "torch.float32", (4,))  # a forgotten
        ra2 = w.put(a.tobytes(), "torch.float32", (4,))
    assert ra2 == ra  # same shard, same key: one copy in it
    (shard,) = payload_dir(tmp_path).iterdir()
    loaded = load_file(str(shard))  # the safetensors library accepts the file
    assert len(loaded) == 2 and np.array_equal(loaded[ra.split(":")[1]], a)
    assert PayloadReader(tmp_path).read(ra).data == a.tobytes()


@pytest.mark.parametrize("kw", [{"pending_bytes": 0}, {"index_size": 0}])
def test_bad_memory_bounds(tmp_path, kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        PayloadWriter(tmp_path, rank=0, **kw)


def test_flush_without_shards_returns_while_the_shard_is_written(tmp_path, monkeypatch):
    """flush(shards=False) returns once the payloads are staged, while the shard thread is
    still writing; wait_written (and a reader given it as before_read) waits for the shard;
    the reader then reads the bytes that were put."""
    release, writing = threading.Event(), threading.Event()
    real = PayloadWriter._write_shard

    def slow_write(self, index, items):
        writing.set()
        assert release.wait(10)
        real(self, index, items)

    monkeypatch.setattr(PayloadWriter, "_write_shard", slow_write)
    staged = []
    w = PayloadWriter(tmp_path, rank=0, stage=(lambda path, p: staged.append(bytes(p.data)) or Path(path).write_bytes(b""), "raw"))
    a = np.arange(10, dtype=np.float64)
    ref = w.put(a.tobytes(), "torch.float64", (10,))
    w.flush(shards=False)
    assert staged == [a.tobytes()]               # staged before flush returned
    assert writing.wait(10)
    shard_dir = payload_dir(tmp_path)              # the shard is not written yet
    assert not shard_dir.exists() or not any(p.name.endswith(".safetensors") for p in shard_dir.iterdir())
    reader = PayloadReader(tmp_path, verify=True, before_read=w.wait_written)
    got = []
    t = threading.Thread(target=lambda: got.append(reader.read(ref)))
    t.start()
    t.join(0.3)
    assert t.is_alive() and not got              # the reader waits for the shard
    release.set()
    t.join(10)
    assert np.array_equal(np.frombuffer(got[0].data, np.float64), a)
    w.wait_written()                             # returns: the shard is on disk
    w.close()


def test_shard_thread_failure_is_reported_by_wait_written_and_put(tmp_path, monkeypatch):
    def failing(self, index, items):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(PayloadWriter, "_write_shard", failing)
    w = PayloadWriter(tmp_path, rank=0)
    w.put(b"\x00" * 8, "torch.float64", (1,))
    with pytest.raises(StoreWriteError, match="No space left"):
        w.flush(shards=False)  # raises here when the shard thread failed already
        w.wait_written()
    with pytest.raises(StoreWriteError, match="No space left"):
        w.put(b"\x01" * 8, "torch.float64", (1,))
    with pytest.raises(StoreWriteError):
        w.close()


def test_shard_holding_only_an_empty_payload_is_not_overwritten_later(tmp_path):
    """An empty tensor (0 bytes) is the only payload before a flush: its shard is written
    then, and payloads put after the flush go to a new shard, so that both references stay
    readable (a later shard of the same name would replace the file without the key)."""
    b = np.arange(4, dtype=np.float32)
    with PayloadWriter(tmp_path, rank=0) as w:
        empty_ref = w.put(b"", "torch.float32", (0, 3))
        w.flush()
        ref = w.put(b.tobytes(), "torch.float32", (4,))
        w.flush()
    r = PayloadReader(tmp_path)
    got = r.read(empty_ref)
    assert (bytes(got.data), got.dtype, got.shape) == (b"", "torch.float32", (0, 3))
    assert np.array_equal(np.frombuffer(r.read(ref).data, np.float32), b)
    assert empty_ref.split(":")[0] != ref.split(":")[0]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_close_in_a_forked_child_returns_and_leaves_the_parents_files(tmp_path):
    """A child forked while the writer runs (a user's fork; the interpreter exit runs
    PrecisionDebugger's atexit close there) has no writer threads: close() returns at once
    instead of waiting for them forever, and removes none of the parent's staged files."""
    stage = (lambda path, p: Path(path).write_bytes(bytes(p.data)), "raw")
    w = PayloadWriter(tmp_path, rank=0, stage=stage)
    a = np.arange(8, dtype=np.float64)
    ref = w.put(a.tobytes(), "torch.float64", (8,))
    w.flush(shards=False)  # staged
    staged = sorted(p for p in (tmp_path / ".msprobe" / "stage").rglob("*.raw"))
    assert len(staged) == 1
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            w.close()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 5
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("close() in the forked child hung")
        time.sleep(0.02)
    assert os.waitstatus_to_exitcode(status) == 0
    assert staged[0].read_bytes() == a.tobytes()  # the parent's staged file is still there
    w.close()
    assert np.array_equal(np.frombuffer(PayloadReader(tmp_path).read(ref).data, np.float64), a)


def test_close_while_shards_queue_behind_a_slow_write_writes_them_all(tmp_path, monkeypatch):
    """Many sealed shards wait behind a slow shard write (the shard queue full, the writer
    thread blocked on it) when close() is called, with flush(shards=False) in between and
    a wait_written on another thread: close() returns once every shard is written, in
    order, and every reference reads back its values."""
    real = PayloadWriter._write_shard
    order = []

    def slow(self, index, items):
        time.sleep(0.02)
        order.append(index)
        real(self, index, items)

    monkeypatch.setattr(PayloadWriter, "_write_shard", slow)
    w = PayloadWriter(tmp_path, rank=0, shard_bytes=1000, queue_size=2, pending_bytes=3000)
    arrays = [np.full(300, i, np.float64) for i in range(20)]  # 2400 bytes each: one shard per put
    refs = []
    for i, a in enumerate(arrays):
        refs.append(w.put(a.tobytes(), "torch.float64", a.shape))
        if i % 7 == 0:
            w.flush(shards=False)
    waiter_errors = []

    def waiter():
        try:
            w.wait_written()
        except StoreWriteError as exc:
            waiter_errors.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    w.close()
    t.join(10)
    assert not t.is_alive() and waiter_errors == []
    w.wait_written()  # after close(): every shard is on disk, nothing failed
    assert order == sorted(order) == list(range(20))
    r = PayloadReader(tmp_path)
    for ref, a in zip(refs, arrays):
        assert np.array_equal(np.frombuffer(r.read(ref).data, np.float64), a)


def _in_thread(fn, timeout=20.0):
    """Run ``fn`` on a helper thread; ``(finished, exception)`` after at most ``timeout`` s
    (a hang fails the test instead of the whole suite)."""
    out = {}

    def body():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["exc"] = exc

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(timeout)
    return not t.is_alive(), out.get("exc")


class _FailingQueue:
    """The shard queue of a writer whose staging thread dies handing over its first shard."""

    def __init__(self, real):
        self.real, self.failed = real, False

    def put(self, item):
        if item is not None and not self.failed:
            self.failed = True
            raise RuntimeError("staging thread killed")
        self.real.put(item)

    def get(self):
        return self.real.get()


def test_a_dead_staging_thread_fails_flush_and_close_instead_of_hanging(tmp_path):
    w = PayloadWriter(tmp_path, rank=0)
    w._shard_queue = _FailingQueue(w._shard_queue)
    w.put(np.arange(4, dtype=np.float32).tobytes(), "torch.float32", (4,))
    finished, exc = _in_thread(w.flush)
    assert finished, "flush() hung after the writer's thread died"
    assert isinstance(exc, StoreWriteError) and "staging thread killed" in str(exc)
    finished, exc = _in_thread(lambda: w.put(b"x" * 8, "torch.uint8", (8,)))
    assert finished and isinstance(exc, StoreWriteError)
    finished, exc = _in_thread(w.wait_written)
    assert finished and isinstance(exc, StoreWriteError)
    finished, exc = _in_thread(w.close)
    assert finished, "close() hung after the writer's thread died"
    assert isinstance(exc, StoreWriteError)
    assert not w._thread.is_alive() and not w._shard_thread.is_alive()


def test_flush_in_a_process_without_the_threads_fails_instead_of_hanging(tmp_path):
    """A forked child has the writer object but not its threads: waiting would never end.
    Here the threads are stopped under the writer (it still believes itself open)."""
    w = PayloadWriter(tmp_path, rank=0)
    w._queue.put(("stop", -1, None))
    w._thread.join(10)
    w._shard_thread.join(10)
    assert not w._thread.is_alive() and not w._shard_thread.is_alive()
    w.put(np.ones(3, dtype=np.float32).tobytes(), "torch.float32", (3,))
    finished, exc = _in_thread(w.flush)
    assert finished, "flush() hung without the writer's threads"
    assert isinstance(exc, StoreWriteError) and "stopped unexpectedly" in str(exc)
    finished, exc = _in_thread(w.close)
    assert finished and isinstance(exc, StoreWriteError)


def test_a_memoryview_released_after_put_is_still_written(tmp_path):
    """The writer keeps a byte memoryview of a ``bytes`` object without copying it, yet
    the caller may release the view it passed once put() returns (``with memoryview(b) as
    mv: w.put(mv, ...)``): the shard still holds the bytes and the writer does not fail."""
    data = bytes(range(256)) * 64
    with PayloadWriter(tmp_path, rank=0) as w:
        with memoryview(data) as mv:
            ref = w.put(mv, "torch.uint8", (len(data),))
        with memoryview(data) as mv:
            part = mv[256:]
            ref2 = w.put(part, "torch.uint8", (len(data) - 256,))
            part.release()
        w.flush()
    r = PayloadReader(tmp_path)
    assert bytes(r.read(ref).data) == data
    assert bytes(r.read(ref2).data) == data[256:]
