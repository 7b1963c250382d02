"""LogWriter.flush(fsync=True, background=True): the step-end fsync runs on a helper thread."""
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
    first = writer._sync_thread
    assert first is not None
    writer.append(_call("Torch.add.1.forward"))
    writer.flush(True, background=True)  # waits for the first one
    assert not first.is_alive()
    writer.close()
    assert writer._sync_thread is None
    inode = os.stat(writer.path).st_ino
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
    monkeypatch.undo()
    writer.append(_call("Torch.add.1.forward"))
    with pytest.raises(StoreWriteError, match="Input/output error"):
        writer.flush(True, background=True)
    writer.close()  # already failed: a no-op
    # the second batch reached the file before the failed fsync was noticed (not synced)
    assert _call_names(tmp_path) == ["Torch.add.0.forward", "Torch.add.1.forward"]
    writer.append(_call("Torch.add.2.forward"))  # failed writers drop appends
    assert writer.flush() is None
