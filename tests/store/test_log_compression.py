"""IPC compression of the log (``MSPROBE_LOG_COMPRESSION``): the setting reaches the writer
process; a compressed log (lz4, zstd) reads back row for row as the uncompressed one
through every reader (LogReader, the uncompacted-log query, compaction, the tail reader);
a damaged or torn compressed batch is skipped and reported exactly as an uncompressed one."""
from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from store import log_frame as F
from store import schema as S
from store.compact import compact
from store.log_names import COMPRESSION_ENV, DEFAULT_COMPRESSION, log_compression
from store.log_reader import LogReader, find_log_files, read_log
from store.log_writer import LogWriter
from store.query import query
from store.records import Call, Leaf

REPO = Path(__file__).resolve().parents[2]
COMPRESSED = ["lz4", "zstd"]


# --- the setting -------------------------------------------------------------------------------
def test_the_setting_reads_each_value_and_defaults_to_lz4():
    assert DEFAULT_COMPRESSION == "lz4"
    assert log_compression({}) == "lz4"
    assert log_compression({COMPRESSION_ENV: ""}) == "lz4"
    assert log_compression({COMPRESSION_ENV: "none"}) is None
    assert log_compression({COMPRESSION_ENV: " LZ4 "}) == "lz4"
    assert log_compression({COMPRESSION_ENV: "Zstd"}) == "zstd"
    for bad in ("gzip", "snappy", "0", "lz4,zstd", "None!"):
        with pytest.raises(ValueError, match=f"{COMPRESSION_ENV}={bad!r}: expected one of none, lz4, zstd"):
            log_compression({COMPRESSION_ENV: bad})


def test_a_bad_compression_is_a_config_error_before_training(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from msprobe.core.errors import ConfigError
    from msprobe.pytorch import PrecisionDebugger

    monkeypatch.setenv(COMPRESSION_ENV, "gzip")
    with pytest.raises(ConfigError, match=COMPRESSION_ENV) as info:
        PrecisionDebugger(dump_path=str(tmp_path / "d"), task="statistics", level="L1")
    assert info.value.field == COMPRESSION_ENV and info.value.value == "gzip"
    assert info.value.allowed == ("none", "lz4", "zstd")
    assert not (tmp_path / "d").exists()


# --- a training run through the real writer process ---------------------------------------------
_TRAIN = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {repo!r})
    from msprobe.pytorch import PrecisionDebugger
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    debugger = PrecisionDebugger(dump_path={dump!r}, task="statistics", level="mix")
    x = torch.randn(8, 16)
    for _ in range(4):
        debugger.start(model)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        debugger.stop()
        debugger.step()
    debugger.close()
""")
SETTINGS = ["none", "lz4", "zstd"]
# the views' rows in one order
TENSORS_SQL = "SELECT * FROM tensors ORDER BY rank, step, seq, io, arg"
CALLS_SQL = "SELECT * FROM calls ORDER BY rank, step, seq"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same 4-step training run recorded with each setting (writer process), in
    parallel: ``{setting: dump path}``."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("runs")
    procs = {}
    for setting in SETTINGS:
        env = dict(os.environ, **{COMPRESSION_ENV: setting, "MSPROBE_WRITER": "process"})
        dump = root / setting
        procs[setting] = (dump, subprocess.Popen([sys.executable, "-c", _TRAIN.format(repo=str(REPO), dump=str(dump))],
                                                 env=env, stderr=subprocess.PIPE, text=True))
    for setting, (dump, proc) in procs.items():
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
    return {setting: dump for setting, (dump, _) in procs.items()}


def _log_rows(dump: Path) -> list[dict]:
    """Every row of the log, in file order, as Python values."""
    return read_log(dump).table.to_pylist()


@pytest.mark.parametrize("setting", COMPRESSED)
def test_a_compressed_log_reads_back_row_for_row(runs, setting):
    files = find_log_files(runs[setting])
    assert files
    for path in files:
        reader = LogReader(path)
        assert reader.read_new() and reader.finished and reader.verified and not reader.skipped
    plain = _log_rows(runs["none"])
    assert len(plain) > 300
    assert _log_rows(runs[setting]) == plain
    # the setting reached the writer: the same rows take far fewer bytes
    size = sum(p.stat().st_size for p in files)
    plain_size = sum(p.stat().st_size for p in find_log_files(runs["none"]))
    assert size < 0.75 * plain_size


@pytest.mark.parametrize("setting", COMPRESSED)
def test_a_compressed_log_gives_the_same_step_files(runs, setting):
    for step in range(4):
        for name in ("dump.json", "stack.json", "construct.json"):
            plain = (runs["none"] / f"step{step}" / "rank" / name).read_bytes()
            assert (runs[setting] / f"step{step}" / "rank" / name).read_bytes() == plain


@pytest.mark.parametrize("setting", COMPRESSED)
def test_query_over_the_log_then_over_the_parts_is_the_uncompressed_answer(runs, tmp_path, setting):
    answers = {}
    for name in ("none", setting):
        dump = tmp_path / name
        shutil.copytree(runs[name], dump)
        before = [query(dump, sql).to_pylist() for sql in (TENSORS_SQL, CALLS_SQL)]
        report = compact(dump)
        assert report.written and not report.skipped and report.pending == 0
        assert sum(report.rows) == read_log(dump).table.num_rows
        after = [query(dump, sql).to_pylist() for sql in (TENSORS_SQL, CALLS_SQL)]
        assert after == before
        answers[name] = before
    assert answers[setting] == answers["none"]
    assert len(answers["none"][0]) > 200


# --- damage, torn tails, the tail reader --------------------------------------------------------
def make_call(i: int, step: int) -> Call:
    return Call(
        step=step, kind="api_forward", name=f"Torch.op{i}.0.forward", api_type="Torch",
        keys=("input_args", "output"),
        leaves=(
            Leaf(io="input_args", path=(0,), leaf_kind="tensor", type="torch.Tensor",
                 dtype="torch.float32", shape=(4, i + 1), numel=4 * (i + 1), max=i + 0.5, min=-i - 0.25,
                 mean=i / 7, norm=0.3386 + i),
            Leaf(io="output", path=(0,), leaf_kind="value", value_json=f'{{"type":"int","value":{i}}}'),
        ),
    )


def write_log(dump: Path, compression):
    """8 batches of 32 calls (96 rows; steps 0..3, two batches per step): the file's bytes
    and the end offset of each message (schema first), taken after each flush."""
    writer = LogWriter(dump, 0, flush_rows=10**6, flush_interval_s=3600, compression=compression)
    ends = []
    for i in range(256):
        writer.append(make_call(i, step=i // 64))
        if i % 32 == 31:
            writer.flush()
            ends.append(writer.path.stat().st_size)
    writer.close()
    return writer.path.read_bytes(), ends


@pytest.fixture(scope="module", params=COMPRESSED)
def logs(request, tmp_path_factory):
    """``(compression, data, batch ranges, rows per batch)`` of a compressed log, the rows
    from the uncompressed log of the same calls (read by pyarrow, not by our reader)."""
    root = tmp_path_factory.mktemp("logs")
    plain, plain_ends = write_log(root / "none", None)
    data, ends = write_log(root / request.param, request.param)
    batches = list(pa.ipc.open_stream(plain))
    assert len(batches) == 8 and len(ends) == 8
    schema_end = len(F.schema_message())
    ranges = list(zip([schema_end] + ends[:-1], ends))
    # every batch message is smaller than its uncompressed twin: its buffers are compressed
    plain_ranges = list(zip([schema_end] + plain_ends[:-1], plain_ends))
    assert all(e - s < 0.6 * (pe - ps) for (s, e), (ps, pe) in zip(ranges, plain_ranges))
    return request.param, data, ranges, [b.to_pylist() for b in batches]


def read_damaged(tmp_path: Path, data: bytes):
    path = tmp_path / "damaged.arrows"
    path.write_bytes(data)
    reader = LogReader(path)
    return reader, [row for batch in reader.read_new() for row in batch.to_pylist()]


def flat(batches) -> list[dict]:
    return [row for batch in batches for row in batch]


def test_an_intact_compressed_log_reads_as_the_uncompressed_one(tmp_path, logs):
    _, data, _, batches = logs
    reader, got = read_damaged(tmp_path, data)
    assert got == flat(batches)
    assert reader.finished and reader.verified and not reader.skipped


@pytest.mark.parametrize("where", ["header", "body_start", "body_middle", "body_end"])
def test_a_damaged_compressed_batch_is_skipped_and_reported_exactly(tmp_path, logs, where):
    _, data, ranges, batches = logs
    start, end = ranges[3]  # batch 3: the second of step 1
    body = start + 8 + struct.unpack_from("<i", data, start + 4)[0]
    at = {"header": start + 40, "body_start": body + 1, "body_middle": (body + end) // 2,
          "body_end": end - 1}[where]
    damaged = bytearray(data)
    damaged[at] ^= 0x10
    reader, got = read_damaged(tmp_path, bytes(damaged))
    assert got == flat(batches[:3] + batches[4:])
    assert [(s.offset, s.end, s.steps) for s in reader.skipped] == [(start, end, (1, 2))]
    skip = reader.skipped[0]
    assert skip.reason.startswith("corrupt: checksum mismatch")
    if where != "header":  # a damaged body: the header still says how many rows were lost
        assert skip.rows == len(batches[3]) == 96
    assert reader.finished


def test_random_damage_to_a_compressed_log_loses_exactly_the_damaged_batch(tmp_path, logs):
    _, data, ranges, batches = logs
    rng = random.Random(7)
    for _ in range(150):
        damaged = bytearray(data)
        at = rng.randrange(ranges[0][0], ranges[-1][1])
        damaged[at] ^= 1 << rng.randrange(8)
        reader, got = read_damaged(tmp_path, bytes(damaged))
        hit = next(i for i, (start, end) in enumerate(ranges) if start <= at < end)
        assert got == flat(batches[:hit] + batches[hit + 1:]), at
        assert [(s.offset, s.end) for s in reader.skipped] == [ranges[hit]], at


def test_a_torn_compressed_tail_is_truncated_and_read_once_complete(tmp_path, logs):
    _, data, ranges, batches = logs
    start, end = ranges[-1]
    path = tmp_path / "live.arrows"
    path.write_bytes(data[:(start + end) // 2])  # the writer is in the middle of the last batch
    reader = LogReader(path)
    assert flat(b.to_pylist() for b in reader.read_new()) == flat(batches[:-1])
    assert [(s.offset, s.end) for s in reader.skipped] == [(start, None)]
    assert reader.skipped[0].reason.startswith("truncated")
    assert reader.offset == start
    path.write_bytes(data)  # the write completes, the end-of-stream marker follows
    assert flat(b.to_pylist() for b in reader.read_new()) == batches[-1]
    assert not reader.skipped and reader.finished


SEGMENT = 40 * 1024  # two steps of the calls below, before compression


def test_a_compressed_segment_holds_the_rows_of_an_uncompressed_one(tmp_path):
    """Segments are sized before compression: the same steps end the same files."""
    from store.records import Marker
    from store.export import StepFiles

    rows = {}
    for compression in (None, "lz4", "zstd"):
        dump = tmp_path / str(compression)
        writer = LogWriter(dump, 0, flush_rows=10**6, flush_interval_s=3600, segment_bytes=SEGMENT,
                           compression=compression)
        files = StepFiles(writer, dump)
        meta = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "rank_dir": "rank0"}
        for step in range(6):
            writer.append_marker(Marker(step=step, kind=S.MARKER_START, meta=meta))
            for i in range(40):
                writer.append(make_call(i, step))
            writer.append_marker(Marker(step=step, kind=S.MARKER_STEP_END, meta=meta))
            files.export(step, meta, True)
            files.end_step(step)
        writer.close()
        paths = find_log_files(dump)
        assert len(paths) >= 3
        rows[compression] = []
        for path in paths:  # (first step, last step, rows) of each file
            steps = pa.Table.from_batches(LogReader(path).read_new()).column(S.STEP).to_pylist()
            rows[compression].append((min(s for s in steps if s >= 0), max(steps), len(steps)))
    assert rows["lz4"] == rows[None] and rows["zstd"] == rows[None]


def test_ranks_written_with_different_settings_read_as_one_log(tmp_path):
    for rank, compression in enumerate((None, "lz4", "zstd")):
        with LogWriter(tmp_path, rank, compression=compression) as writer:
            for i in range(64):
                writer.append(make_call(i, step=0))
    table = read_log(tmp_path).table
    assert sorted(set(table.column(S.RANK).to_pylist())) == [0, 1, 2]
    per_rank = [table.filter(pc.equal(table.column(S.RANK), r)).drop_columns([S.RANK]).to_pylist()
                for r in range(3)]
    assert per_rank[1] == per_rank[0] and per_rank[2] == per_rank[0] and len(per_rank[0]) == 64 * 3
