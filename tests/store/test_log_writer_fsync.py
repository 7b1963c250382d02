"""LogWriter.flush(fsync=True, background=True): the step-end fsync runs on a helper thread
(one per writer, started at the first background fsync, ended by close())."""
from __future__ import annotations

import os

from store import schema as S
from store.log_reader import read_log
from store.log_writer import LogWriter
from store.records import Call, Leaf


def _call(seq_name: str) -> Call:
    return Call(step=0, kind="api_forward", name=seq_name, api_type="Torch", keys=("output",),
                leaves=(Leaf(io="output", path=(0,), leaf_kind="tensor", type="torch.Tensor",
                             dtype="torch.float32", shape=(2,), numel=2, max=1.0, min=0.0, mean=0.5, norm=1.0),))


def _call_names(dump) -> list:
    table = read_log(dump).table
    return [n for n, r in zip(table[S.NAME].to_pylist(), table[S.ROW].to_pylist()) if r == S.ROW_CALL]


def test_background_fsync_syncs_and_close_waits(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.fstat(fd).st_ino), real_fsync(fd)))
    writer = LogWriter(tmp_path, 0)
    writer.append(_call("Torch.add.0.forward"))
    writer.flush(True, background=True)
    assert writer._syncer.started
    thread = writer._syncer._thread
    inode = os.stat(writer.path).st_ino
    writer.append(_call("Torch.add.1.forward"))
    writer.flush(True, background=True)  # waits for the first one
    assert synced.count(inode) >= 1
    assert writer._syncer._thread is thread  # one thread for every background fsync
    writer.close()
    assert not writer._syncer.started and not thread.is_alive()
    assert synced.count(inode) == 3  # two background fsyncs and the one of close()
    assert _call_names(tmp_path) == ["Torch.add.0.forward", "Torch.add.1.forward"]


def test_background_fsync_failure_is_raised_at_the_next_flush(tmp_path, monkeypatch):
    import pytest

    from store.errors import StoreWriteError

    writer = LogWriter(tmp_path, 0)
    writer.append(_call("Torch.add.0.forward"))

    def broken(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    writer.flush(True, background=True)  # returns at once
    writer.append(_call("Torch.add.1.forward"))
    with pytest.raises(StoreWriteError, match="Input/output error"):
        writer.flush(True, background=True)
    monkeypatch.undo()  # only now: the helper thread may not have reached its fsync before
    writer.close()  # already failed: a no-op
    # the second batch reached the file before the failed fsync was noticed (not synced)
    assert _call_names(tmp_path) == ["Torch.add.0.forward", "Torch.add.1.forward"]
    writer.append(_call("Torch.add.2.forward"))  # failed writers drop appends
    assert writer.flush() is None


def test_background_fsync_helper(tmp_path, monkeypatch):
    """BackgroundFsync: one thread for every descriptor, a failure returned once, stop ends
    the thread after the descriptor it holds, no submit afterwards."""
    import pytest

    from store.bg_fsync import BackgroundFsync

    syncer = BackgroundFsync("test-fsync")
    path = tmp_path / "f"
    path.write_bytes(b"x")
    assert syncer.wait() is None and not syncer.started
    for _ in range(3):
        syncer.submit(os.open(path, os.O_RDONLY))
        assert syncer.wait() is None
    thread = syncer._thread
    assert thread.is_alive()

    def broken(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken)
    fd = os.open(path, os.O_RDONLY)
    syncer.submit(fd)
    error = syncer.wait()
    assert isinstance(error, OSError) and error.errno == 28
    assert syncer.wait() is None  # reported once
    with pytest.raises(OSError):
        os.fstat(fd)  # closed by the helper
    monkeypatch.undo()
    syncer.submit(os.open(path, os.O_RDONLY))
    syncer.stop()  # after the descriptor it was handed
    assert not thread.is_alive() and not syncer.started and syncer.wait() is None
    with pytest.raises(RuntimeError):
        syncer.submit(-1)


def _close_within(writer, seconds: float = 10.0) -> None:
    """close() on another thread; fails (instead of hanging the suite) when it blocks."""
    import threading

    done = []
    closer = threading.Thread(target=lambda: (writer.close(), done.append(True)), daemon=True)
    closer.start()
    closer.join(seconds)
    assert done, "LogWriter.close() blocked"


def test_no_helper_thread_fsyncs_in_the_caller_and_close_does_not_hang(tmp_path, monkeypatch):
    """Thread.start failing (no thread left) at the first background fsync: the fsync is
    done in the caller (no exception into step(), no leaked descriptor), and the writer
    stays usable: a later background fsync starts the thread, close() returns."""
    import threading

    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    writer = LogWriter(tmp_path, 0)
    writer.append(_call("Torch.add.0.forward"))
    writer.flush()  # the log file is open from here on
    synced.clear()
    real_start = threading.Thread.start

    def no_thread(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    open_fds = len(os.listdir("/proc/self/fd"))
    writer.flush(True, background=True)  # must not raise
    assert len(os.listdir("/proc/self/fd")) == open_fds  # the duplicate was closed
    assert synced and not writer.failed and not writer._syncer.started
    monkeypatch.setattr(threading.Thread, "start", real_start)
    writer.append(_call("Torch.add.1.forward"))
    writer.flush(True, background=True)
    assert writer._syncer.started
    _close_within(writer)
    assert not writer.failed
    assert _call_names(tmp_path) == ["Torch.add.0.forward", "Torch.add.1.forward"]


def test_a_writer_dropped_without_close_ends_its_helper_thread(tmp_path):
    import gc

    writer = LogWriter(tmp_path, 0)
    writer.append(_call("Torch.add.0.forward"))
    writer.flush(True, background=True)
    thread = writer._syncer._thread
    assert thread.is_alive()
    del writer
    gc.collect()
    thread.join(10)
    assert not thread.is_alive()


def test_the_helper_thread_ends_when_its_writer_is_collected_on_that_thread(tmp_path):
    """A writer in a reference cycle collected by a garbage collection that runs on its own
    helper thread while it holds the helper's lock: the finalizer's stop() must not
    deadlock (the lock is reentrant)."""
    import threading

    from store.bg_fsync import BackgroundFsync

    syncer = BackgroundFsync("test-fsync")
    path = tmp_path / "f"
    path.write_bytes(b"x")
    syncer.submit(os.open(path, os.O_RDONLY))
    assert syncer.wait() is None
    thread = syncer._thread
    done = []

    def collect_while_holding_the_lock():
        with syncer._cond:  # as the helper thread holds it when a collection runs the finalizer
            syncer.stop(join=False)
            done.append(True)

    worker = threading.Thread(target=collect_while_holding_the_lock, daemon=True)
    worker.start()
    worker.join(10)
    assert done, "stop() deadlocked on the helper's lock"
    thread.join(10)
    assert not thread.is_alive() and not syncer.started


def test_a_forked_child_dropping_the_writer_does_not_touch_the_parents_helper(tmp_path):
    """fork() while another thread of the parent holds the helper's lock: the child's copy
    of the lock stays locked forever; the child dropping the writer must not stop (lock)
    the helper, which is the parent's."""
    import gc
    import threading

    writer = LogWriter(tmp_path, 0)
    writer.append(_call("Torch.add.0.forward"))
    writer.flush(True, background=True)
    held, release = threading.Event(), threading.Event()

    def hold():
        with writer._syncer._cond:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    held.wait(10)
    pid = os.fork()
    if pid == 0:  # child: must exit promptly
        try:
            del writer
            gc.collect()
        finally:
            os._exit(0)
    release.set()
    holder.join(10)
    deadline = __import__("time").monotonic() + 10
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if __import__("time").monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child hung dropping the writer")
        __import__("time").sleep(0.02)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    writer.close()
    assert _call_names(tmp_path) == ["Torch.add.0.forward"]
