"""store.log_writer: write through LogWriter, read back through LogReader, check every column."""
from __future__ import annotations

import errno
import json
import math
import os
import time
import stat
import threading

import pytest

from store import schema as S
from store.errors import StoreWriteError
from store.log_reader import LogReader, read_log
from store.log_writer import LogWriter, log_file_name, other_process_logs, parse_log_file_name
from store.records import Call, Leaf, Marker, Stack

META = {"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None,
        "rank_dir": "rank3"}

TENSOR = Leaf(
    io="input_args", path=(0, "k"), leaf_kind="tensor", type="torch.Tensor", dtype="torch.float16",
    shape=(2, 3), numel=6, max=math.inf, min=-1.5, mean=math.nan, norm=7.25, max_finite=2.0,
    min_finite=-1.5, crc32="8e0be875", requires_grad=True, has_nan=True, has_inf=True,
    data_name="Torch.add.0.forward.input.0.k.pt", payload="shard0:abc",
)
VALUE = Leaf(io="input_kwargs", path=("alpha",), leaf_kind="value", type="int",
             value_json='{"type":"int","value":2}')
NULL = Leaf(io="output", path=(), leaf_kind="none")
CALL = Call(step=4, kind="api_forward", name="Torch.add.0.forward", api_type="Torch",
            parent="Module.m.M.forward.0", stack_id=99, is_recompute=False,
            keys=("input_args", "input_kwargs", "is_recompute", "output"),
            leaves=(TENSOR, VALUE, NULL))

NULL_LEAF_COLUMNS = {
    S.TYPE: None, S.DTYPE: None, S.SHAPE: None, S.NUMEL: None, S.MAX: None, S.MIN: None,
    S.MEAN: None, S.NORM: None, S.MAX_FINITE: None, S.MIN_FINITE: None, S.CRC32: None,
    S.REQUIRES_GRAD: None, S.HAS_NAN: None, S.HAS_INF: None, S.DATA_NAME: None,
    S.PAYLOAD: None, S.VALUE_JSON: None,
}
NO_LEAF = {S.IO: None, S.PATH: None, S.ARG: None, S.LEAF_KIND: None, **NULL_LEAF_COLUMNS}
NO_CALL = {S.PARENT: None, S.STACK_ID: None, S.IS_RECOMPUTE: None, S.KEYS: None}


def rows_of(path):
    reader = LogReader(path)
    batches = reader.read_new()
    assert reader.skipped == []
    rows = [row for batch in batches for row in batch.to_pylist()]
    return rows


def nan_safe(row):
    return {k: ("nan" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}


def test_every_column_round_trips(tmp_path):
    with LogWriter(tmp_path, 3) as writer:
        assert writer.append_marker(Marker(step=4, kind="start", meta=META)) == 0
        writer.append_stack(Stack(stack_id=99, frames=("File a.py, line 1, in f, \n g()", "File b")))
        assert writer.append(CALL) == 1
        assert writer.path is None  # nothing flushed yet
    rows = rows_of(writer.path)
    assert len(rows) == 6
    call_common = {S.RANK: 3, S.STEP: 4, S.SEQ: 1, S.KIND: "api_forward",
                   S.NAME: "Torch.add.0.forward", S.API_TYPE: "Torch"}
    expected = [
        {S.ROW: "call", **call_common, S.PARENT: "Module.m.M.forward.0", S.STACK_ID: 99,
         S.IS_RECOMPUTE: False,
         S.KEYS: '["input_args","input_kwargs","is_recompute","output"]',
         **NO_LEAF, S.FRAMES: None, S.META: None},
        {S.ROW: "leaf", **call_common, **NO_CALL, S.IO: "input_args", S.PATH: '[0,"k"]',
         S.ARG: "0.k", S.LEAF_KIND: "tensor", S.TYPE: "torch.Tensor", S.DTYPE: "torch.float16",
         S.SHAPE: [2, 3], S.NUMEL: 6, S.MAX: math.inf, S.MIN: -1.5, S.MEAN: "nan", S.NORM: 7.25,
         S.MAX_FINITE: 2.0, S.MIN_FINITE: -1.5, S.CRC32: "8e0be875", S.REQUIRES_GRAD: True,
         S.HAS_NAN: True, S.HAS_INF: True, S.DATA_NAME: "Torch.add.0.forward.input.0.k.pt",
         S.PAYLOAD: "shard0:abc", S.VALUE_JSON: None, S.FRAMES: None, S.META: None},
        {S.ROW: "leaf", **call_common, **NO_CALL, S.IO: "input_kwargs", S.PATH: '["alpha"]',
         S.ARG: "alpha", S.LEAF_KIND: "value", **NULL_LEAF_COLUMNS, S.TYPE: "int",
         S.VALUE_JSON: '{"type":"int","value":2}', S.FRAMES: None, S.META: None},
        {S.ROW: "leaf", **call_common, **NO_CALL, S.IO: "output", S.PATH: "[]", S.ARG: "",
         S.LEAF_KIND: "none", **NULL_LEAF_COLUMNS, S.FRAMES: None, S.META: None},
        {S.ROW: "stack", S.RANK: 3, S.STEP: -1, S.SEQ: -1, S.KIND: None, S.NAME: None,
         S.API_TYPE: None, **NO_CALL, S.STACK_ID: 99, **NO_LEAF,
         S.FRAMES: ["File a.py, line 1, in f, \n g()", "File b"], S.META: None},
        {S.ROW: "marker", S.RANK: 3, S.STEP: 4, S.SEQ: 0, S.KIND: "start", S.NAME: None,
         S.API_TYPE: None, **NO_CALL, **NO_LEAF, S.FRAMES: None,
         S.META: '{"task":"statistics","level":"mix","framework":"pytorch","dump_data_dir":null,'
                 '"rank_dir":"rank3"}'},
    ]
    assert [nan_safe(row) for row in rows] == expected
    assert all(list(row) == list(S.COLUMNS) for row in rows)
    assert json.loads(rows[-1][S.META]) == META


def test_log_file_name_location_and_modes(tmp_path):
    old = os.umask(0)
    try:
        with LogWriter(tmp_path / "dump", 7, flush_rows=1) as writer:
            writer.append(CALL)
            path = writer.path
    finally:
        os.umask(old)
    log_dir = tmp_path / "dump" / ".msprobe" / "log"
    assert path.parent == log_dir
    assert path.name.startswith(f"rank7.{os.getpid()}.") and path.name.endswith(".arrows")
    assert log_file_name(7, 1, 2) == "rank7.1.2.arrows"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    for directory in (tmp_path / "dump", log_dir.parent, log_dir):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o750


def test_other_process_logs_counts_only_this_rank_of_other_processes(tmp_path):
    """The earlier-run check of the session (one listing, names only): logs of the same
    rank from other pids count; other ranks, this process's own logs, stray names don't."""
    dump = tmp_path / "dump"
    assert other_process_logs(dump, 0) == []            # no dump path yet
    log_dir = dump / ".msprobe" / "log"
    log_dir.mkdir(parents=True)
    assert other_process_logs(dump, 0) == []            # empty log directory
    me, other = os.getpid(), os.getpid() + 1
    mine = log_file_name(0, me, time.time_ns())  # made by this process (after store was imported)
    names = [log_file_name(0, other, 5), log_file_name(0, other + 1, 3), log_file_name(1, other, 4),
             mine, "rank0.x.1.arrows", "rank0.7.1.arrows.tmp", "notes.txt"]
    for name in names:
        (log_dir / name).write_bytes(b"")
    assert other_process_logs(dump, 0) == sorted([log_file_name(0, other, 5), log_file_name(0, other + 1, 3)])
    assert other_process_logs(dump, 1) == [log_file_name(1, other, 4)]
    assert other_process_logs(dump, 2) == []
    assert other_process_logs(dump, 0, pid=other, since_ns=0) == sorted([log_file_name(0, other + 1, 3), mine])
    # a rerun with this process's pid (common in containers): its log is older than this process
    earlier_same_pid = log_file_name(0, me, 7)
    (log_dir / earlier_same_pid).write_bytes(b"")
    assert earlier_same_pid in other_process_logs(dump, 0) and mine not in other_process_logs(dump, 0)
    assert parse_log_file_name(log_file_name(-1, 12, 34)) == (-1, 12, 34)
    assert parse_log_file_name("rank0.x.1.arrows") is None


def test_other_process_logs_of_an_unreadable_directory_is_empty(tmp_path, monkeypatch):
    log_dir = tmp_path / "dump" / ".msprobe" / "log"
    log_dir.mkdir(parents=True)
    (log_dir / log_file_name(0, os.getpid() + 1, 1)).write_bytes(b"")

    def denied(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(os, "scandir", denied)
    assert other_process_logs(tmp_path / "dump", 0) == []
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.undo()
    assert other_process_logs(blocker, 0) == []        # not a directory


def test_nothing_is_visible_before_the_flush(tmp_path):
    writer = LogWriter(tmp_path, 0, flush_rows=100, flush_interval_s=3600)
    writer.append(CALL)
    assert writer.path is None
    assert not (tmp_path / ".msprobe").exists()
    writer.flush()
    assert len(rows_of(writer.path)) == 4
    writer.append(CALL)
    assert len(rows_of(writer.path)) == 4  # second call still buffered
    writer.flush(fsync=True)
    assert [r[S.SEQ] for r in rows_of(writer.path)] == [0, 0, 0, 0, 1, 1, 1, 1]
    writer.close()


def test_flush_on_row_count_and_on_interval(tmp_path):
    writer = LogWriter(tmp_path / "a", 0, flush_rows=8, flush_interval_s=3600)
    writer.append(CALL)  # 4 rows pending
    assert writer.path is None
    writer.append(CALL)  # 8 rows: flushed
    assert len(rows_of(writer.path)) == 8
    writer.close()

    timed = LogWriter(tmp_path / "b", 0, flush_rows=10_000, flush_interval_s=0.0)
    timed.append(CALL)
    assert len(rows_of(timed.path)) == 4
    timed.close()


def test_stack_written_once_per_id(tmp_path):
    with LogWriter(tmp_path, 0) as writer:
        writer.append_stack(Stack(stack_id=1, frames=("a",)))
        writer.append_stack(Stack(stack_id=1, frames=("a",)))
        writer.append_stack(Stack(stack_id=2, frames=()))
        assert writer.stacks() == {1: ("a",), 2: ()}
    contents = read_log(tmp_path)
    assert contents.table.column(S.ROW).to_pylist() == ["stack", "stack"]
    assert contents.stacks == {1: ("a",), 2: ()}


def test_take_step_returns_and_forgets_rows_of_one_step(tmp_path):
    with LogWriter(tmp_path, 0, flush_rows=1) as writer:
        writer.append_marker(Marker(step=0, kind="start", meta=META))
        writer.append_stack(Stack(stack_id=5, frames=("f",)))
        writer.append(Call(step=0, kind="api_forward", name="A.0", api_type="A"))
        writer.append(Call(step=1, kind="api_forward", name="B.0", api_type="B",
                           leaves=(VALUE,)))
        writer.append_marker(Marker(step=0, kind="step_end", meta=META))
        step0 = writer.take_step(0)
        assert step0.schema == S.LOG_SCHEMA
        assert step0.column(S.ROW).to_pylist() == ["marker", "call", "marker"]
        assert step0.column(S.SEQ).to_pylist() == [0, 1, 3]
        assert writer.take_step(0).num_rows == 0
        step1 = writer.take_step(1)
        assert step1.column(S.ROW).to_pylist() == ["call", "leaf"]
        assert writer.take_step(1).num_rows == 0
        writer.append(Call(step=2, kind="api_forward", name="C.0", api_type="C"))
        writer.append(Call(step=3, kind="api_forward", name="D.0", api_type="D"))
        everything = writer.take_step(None)
        assert everything.column(S.NAME).to_pylist() == ["C.0", "D.0"]
        assert writer.take_step(None).num_rows == 0
        assert writer.stacks() == {5: ("f",)}
    # taking never touches the file
    assert len(read_log(tmp_path).table) == 8


def test_close_is_idempotent_and_later_appends_are_no_ops(tmp_path):
    writer = LogWriter(tmp_path, 0)
    with writer:
        writer.append(CALL)
    assert writer.closed
    writer.close()
    assert writer.append(CALL) == -1
    assert writer.append_marker(Marker(step=0, kind="stop", meta=META)) == -1
    writer.flush()
    reader = LogReader(writer.path)
    assert sum(b.num_rows for b in reader.read_new()) == 4
    assert reader.finished and reader.skipped == []


def test_close_without_rows_creates_nothing(tmp_path):
    LogWriter(tmp_path / "d", 0).close()
    assert not (tmp_path / "d").exists()


def test_bad_options_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="flush_rows: got 0; allowed: an int >= 1"):
        LogWriter(tmp_path, 0, flush_rows=0)
    with pytest.raises(ValueError, match="flush_interval_s: got -1"):
        LogWriter(tmp_path, 0, flush_interval_s=-1)


class FlakyFile:
    """A file object whose writes fail with ENOSPC once ``full`` is set."""

    def __init__(self, path):
        self.inner = open(path, "xb")
        self.full = False
        self.write_calls = 0

    def write(self, data):
        self.write_calls += 1
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.inner.write(data)

    def flush(self):
        self.inner.flush()

    def fileno(self):
        return self.inner.fileno()

    def close(self):
        self.inner.close()

    @property
    def closed(self):
        return self.inner.closed


def test_disk_full_raises_once_then_writer_is_a_no_op(tmp_path):
    files = []

    def opener(path):
        files.append(FlakyFile(path))
        return files[0]

    writer = LogWriter(tmp_path, 0, flush_rows=1, _open=opener)
    assert writer.append(CALL) == 0
    files[0].full = True
    with pytest.raises(StoreWriteError, match="No space left on device") as caught:
        writer.append(CALL)
    assert isinstance(caught.value.__cause__, OSError)
    assert caught.value.__cause__.errno == errno.ENOSPC
    assert writer.failed
    calls_before = files[0].write_calls
    assert writer.append(CALL) == -1
    writer.append_stack(Stack(stack_id=1, frames=()))
    writer.flush(fsync=True)
    writer.close()
    writer.close()
    assert files[0].write_calls == calls_before
    # what was flushed before the fault stays readable
    reader = LogReader(writer.path)
    batches = reader.read_new()
    assert [b.num_rows for b in batches] == [4]
    # rows appended before the fault are still available for live export
    assert writer.take_step(4).column(S.SEQ).to_pylist() == [0] * 4 + [1] * 4


def test_open_failure_raises_once(tmp_path):
    def opener(path):
        raise PermissionError(errno.EACCES, "Permission denied", path)

    writer = LogWriter(tmp_path, 0, flush_rows=1, _open=opener)
    with pytest.raises(StoreWriteError, match="Permission denied"):
        writer.append(CALL)
    assert writer.append(CALL) == -1
    writer.close()
    assert writer.failed


def test_unconvertible_record_raises_once(tmp_path):
    bad = Call(step=0, kind="api_forward", name="X", api_type="X",
               leaves=(Leaf(io="o", path=(), leaf_kind="tensor", shape=("not", "ints")),))
    writer = LogWriter(tmp_path, 0)
    writer.append(bad)
    with pytest.raises(StoreWriteError, match="converting records"):
        writer.flush()
    writer.close()
    assert writer.failed


def test_concurrent_appends_get_unique_seqs(tmp_path):
    writer = LogWriter(tmp_path, 0, flush_rows=64)
    seqs: list[int] = []
    lock = threading.Lock()

    def work():
        mine = [writer.append(CALL) for _ in range(300)]
        with lock:
            seqs.extend(mine)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    writer.close()
    assert sorted(seqs) == list(range(1200))
    table = read_log(tmp_path).table
    assert table.num_rows == 1200 * 4
    call_seqs = [s for s, r in zip(table.column(S.SEQ).to_pylist(), table.column(S.ROW).to_pylist())
                 if r == "call"]
    assert sorted(call_seqs) == list(range(1200))


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_compressed_log_reads_back(tmp_path, compression):
    with LogWriter(tmp_path / compression, 0, compression=compression) as writer:
        for _ in range(50):
            writer.append(CALL)
    table = read_log(tmp_path / compression).table
    assert table.num_rows == 200
    assert table.column(S.CRC32).to_pylist().count("8e0be875") == 50
    with LogWriter(tmp_path / "plain", 0) as plain:
        for _ in range(50):
            plain.append(CALL)
    assert writer.path.stat().st_size < plain.path.stat().st_size


def test_unknown_compression_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="compression: got 'gzip'; allowed: None, 'lz4', 'zstd'"):
        LogWriter(tmp_path, 0, compression="gzip")


def test_leaf_path_given_as_a_list_is_written_like_a_tuple(tmp_path):
    # the writer's path cache is keyed by the (hashable) tuple; a list path takes the slow way
    leaves = (Leaf(io="input_args", path=[0, "k"], leaf_kind="none"),
              Leaf(io="input_args", path=(0, "k"), leaf_kind="none"))
    with LogWriter(tmp_path, 0) as writer:
        writer.append(Call(step=0, kind="api_forward", name="Torch.add.0.forward", api_type="Torch",
                           keys=("input_args",), leaves=leaves))
    rows = [row for row in rows_of(writer.path) if row[S.ROW] == "leaf"]
    assert [(row[S.PATH], row[S.ARG]) for row in rows] == [('[0,"k"]', "0.k")] * 2


def test_one_leaf_given_as_the_leaves_is_rejected_at_append(tmp_path):
    """A Leaf is a tuple of its 20 fields: ``leaves=leaf`` (a missing comma) must not be
    taken as 20 leaves. append raises at once, records nothing and the writer keeps working."""
    with LogWriter(tmp_path, 0) as writer:
        bad = Call(step=0, kind="api_forward", name="Torch.neg.0.forward", api_type="Torch", keys=("output",),
                   leaves=NULL)
        with pytest.raises(TypeError, match="one Leaf"):
            writer.append(bad)
        assert not writer.failed
        good = Call(step=0, kind="api_forward", name="Torch.neg.1.forward", api_type="Torch", keys=("output",),
                    leaves=(NULL,))
        assert writer.append(good) == 0  # the rejected call took no seq
        writer.flush()
        path = writer.path
    rows = rows_of(path)
    assert [(r[S.ROW], r[S.NAME], r[S.SEQ]) for r in rows] == [
        (S.ROW_CALL, "Torch.neg.1.forward", 0), (S.ROW_LEAF, "Torch.neg.1.forward", 0)]
    assert rows[1][S.IO] == "output" and rows[1][S.PATH] == "[]" and rows[1][S.LEAF_KIND] == "none"


@pytest.mark.parametrize("count", [1, 2, 9])
def test_marker_only_batch_bytes(tmp_path, count):
    """A flush of markers only (start() and step() flush a lone marker) leaves most columns
    all-null, which the writer takes from its cache of null columns: the IPC bytes equal
    those of the same rows built by pyarrow from Python dicts, for cached (up to 8 rows) and
    uncached sizes, and a second batch from the cache holds its own values."""
    import pyarrow as pa

    with LogWriter(tmp_path, 5, flush_rows=100, flush_interval_s=3600) as writer:
        for i in range(count):
            writer.append_marker(Marker(step=i, kind="stop", meta=dict(META, n=i)))
        batch = writer._build_batch().batch
        again = [writer.append_marker(Marker(step=0, kind="start", meta=META)), writer._build_batch()][1].batch
    rows = [{name: None for name in S.LOG_SCHEMA.names} for _ in range(count)]
    for i, row in enumerate(rows):
        row.update({S.RANK: 5, S.ROW: "marker", S.STEP: i, S.SEQ: i, S.KIND: "stop",
                    S.META: json.dumps(dict(META, n=i), separators=(",", ":"))})
    expected = pa.RecordBatch.from_pylist(rows, schema=S.LOG_SCHEMA)
    assert batch.serialize().to_pybytes() == expected.serialize().to_pybytes()
    assert again.column(S.SEQ).to_pylist() == [count] and again.column(S.FRAMES).to_pylist() == [None]
