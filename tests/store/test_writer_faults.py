"""LogWriter faults beyond disk full: the log file deleted while written,
and a forked child that must never write into its parent's log."""
from __future__ import annotations

import os

import pytest

from store.errors import StoreWriteError
from store.log_reader import LogReader
from store.log_writer import LogWriter
from store.records import Call, Leaf

CALL = Call(step=0, kind="api_forward", name="Torch.add.0.forward", api_type="Torch", keys=("output",),
            leaves=(Leaf(io="output", path=(0,), leaf_kind="value", value_json='{"type":"int","value":1}'),))


def test_deleted_log_file_is_a_fault_at_the_next_flush(tmp_path):
    writer = LogWriter(tmp_path, 0, flush_rows=1)
    writer.append(CALL)
    path = writer.path
    os.unlink(path)
    with pytest.raises(StoreWriteError, match="deleted while being written"):
        writer.append(CALL)
    assert writer.failed
    writer.close()  # no second error
    assert not path.exists()


def test_forked_child_never_writes_into_the_parent_log(tmp_path):
    writer = LogWriter(tmp_path, 0, flush_rows=1)
    writer.append(CALL)
    size = writer.path.stat().st_size
    pid = os.fork()
    if pid == 0:  # child: appends, flushes and closes must not touch the file
        code = 0
        try:
            writer.append(CALL)
            writer.flush(fsync=True)
            writer.close()
            code = 0 if writer.path.stat().st_size == size else 1
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert writer.path.stat().st_size == size
    writer.append(CALL)
    writer.close()
    reader = LogReader(writer.path)
    rows = sum(b.num_rows for b in reader.read_new())
    assert rows == 4 and reader.skipped == [] and reader.finished
