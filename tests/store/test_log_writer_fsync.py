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
