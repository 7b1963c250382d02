"""store.log_reader: incremental reads, torn tails, garbage; read_log over several files."""
from __future__ import annotations

import os
import random

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import schema as S
from store.errors import LogNotFoundError
from store.log_reader import LogReader, Skipped, read_log
from store.log_writer import LogWriter
from store.records import Call, Leaf, Marker


def make_call(i: int, step: int = 0) -> Call:
    return Call(
        step=step, kind="api_forward", name=f"Torch.op{i}.0.forward", api_type="Torch",
        keys=("input_args", "output"),
        leaves=(
            Leaf(io="input_args", path=(0,), leaf_kind="tensor", type="torch.Tensor",
                 dtype="torch.float32", shape=(i, 2), numel=2 * i, max=float(i), min=-float(i),
                 mean=0.0, norm=float(i)),
            Leaf(io="output", path=(0,), leaf_kind="value", value_json=f'{{"type":"int","value":{i}}}'),
        ),
    )


def write_log(dump, n_calls: int, *, close: bool = True):
    """One call per flushed batch. Returns (path, batch end offsets, the batches)."""
    writer = LogWriter(dump, 0, flush_rows=1)
    ends = []
    for i in range(n_calls):
        writer.append(make_call(i))
        ends.append(os.path.getsize(writer.path))
    path = writer.path
    if close:
        writer.close()
    full = LogReader(path).read_new()
    assert len(full) == n_calls
    return path, ends, full


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    return write_log(tmp_path_factory.mktemp("log"), 6)


def check_prefixes(path, data: bytes, cuts, ends: list[int], full):
    """Check the reader on ``data`` truncated at each of ``cuts`` (one file, truncated
    further and further: rewriting a file is slow on some file systems)."""
    path.write_bytes(data)
    readers = []
    for cut in sorted(set(cuts), reverse=True):
        os.truncate(path, cut)
        readers.append(check_prefix(path, data, cut, ends, full))
    return readers


def check_prefix(path, data: bytes, cut: int, ends: list[int], full):
    reader = LogReader(path)
    batches = reader.read_new()
    complete = sum(1 for end in ends if end <= cut)
    assert len(batches) == complete, cut
    if batches:  # batches before the damage come back whole
        assert batches[-1].equals(full[len(batches) - 1])
    clean = cut in ends or cut in (0, S.LOG_SCHEMA.serialize().size, len(data))
    if clean:
        assert reader.skipped == [], cut
    else:
        assert len(reader.skipped) == 1, cut
        skip = reader.skipped[0]
        assert skip.path == str(path)
        schema_end = S.LOG_SCHEMA.serialize().size
        assert skip.offset == (ends[complete - 1] if complete else (schema_end if cut >= schema_end else 0))
        assert skip.reason.startswith("truncated"), skip.reason
    return reader


def test_truncated_at_every_byte_near_the_end_and_sampled_elsewhere(tmp_path, log):
    source, ends, full = log
    data = source.read_bytes()
    assert len(data) == ends[-1] + 8  # end-of-stream marker
    target = tmp_path / "cut.arrows"
    last = ends[-2]  # the last batch message starts here
    cuts = (
        list(range(last - 4, last + 300))  # every byte: its header, metadata start
        + list(range(len(data) - 300, len(data) + 1))  # every byte: body end, end-of-stream
        + list(range(0, len(data), 17))  # sampled elsewhere
        + ends
    )
    check_prefixes(target, data, cuts, ends, full)


def test_truncated_in_the_middle_of_the_first_message(tmp_path, log):
    source, ends, full = log
    data = source.read_bytes()
    target = tmp_path / "cut.arrows"
    cuts = (1, 4, 7, 8, 9, 100, ends[0] // 2, ends[0] - 1)
    readers = check_prefixes(target, data, cuts, ends, full)
    assert [r.skipped[0].reason.split(":")[0] for r in readers] == ["truncated"] * len(cuts)


def test_read_new_is_incremental_and_resumes_after_a_torn_tail(tmp_path, log):
    source, ends, full = log
    data = source.read_bytes()
    target = tmp_path / "growing.arrows"
    target.write_bytes(b"")
    reader = LogReader(target)
    assert reader.read_new() == [] and reader.skipped == []
    got: list[pa.RecordBatch] = []
    rng = random.Random(7)
    size = 0
    while size < len(data):
        size = min(len(data), size + rng.randint(1, 900))
        target.write_bytes(data[:size])
        new = reader.read_new()
        got.extend(new)
        assert len(got) == sum(1 for end in ends if end <= size)
        assert reader.offset <= size
    assert len(got) == len(full)
    assert all(a.equals(b) for a, b in zip(got, full))
    assert reader.finished and reader.skipped == []
    assert reader.read_new() == []


def test_live_writer_read_incrementally(tmp_path):
    writer = LogWriter(tmp_path, 0, flush_rows=1)
    writer.append(make_call(1))
    reader = LogReader(writer.path)
    assert [b.num_rows for b in reader.read_new()] == [3]
    assert reader.read_new() == []
    writer.append(make_call(2))
    writer.append(make_call(3))
    second = reader.read_new()
    assert [b.column(S.NAME)[0].as_py() for b in second] == ["Torch.op2.0.forward", "Torch.op3.0.forward"]
    writer.close()
    assert reader.read_new() == [] and reader.finished


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"", None),
        (b"\x00" * 3, "truncated: incomplete message header"),
        (b"PK\x03\x04garbage-garbage-garbage", "corrupt: no message continuation marker"),
        (b"\xff\xff\xff\xff\x07\x00\x00\x00abcdefg", "corrupt: invalid message metadata length 7"),
        (b"\xff\xff\xff\xff\x10\x00\x00\x00abc", "truncated: incomplete message metadata (3 of 16"),
        (b"\xff\xff\xff\xff\x10\x00\x00\x00" + b"\x01" * 16, "corrupt:"),
        (b"\xff\xff\xff\xff\x00\x00\x00\x00trailing", "corrupt: 8 bytes after the end-of-stream"),
    ],
)
def test_damaged_files_never_raise(tmp_path, content, reason):
    path = tmp_path / "bad.arrows"
    path.write_bytes(content)
    reader = LogReader(path)
    assert reader.read_new() == []
    if reason is None:
        assert reader.skipped == []
    else:
        assert len(reader.skipped) == 1
        assert reader.skipped[0].offset in (0, 8)
        assert reader.skipped[0].reason.startswith(reason), reader.skipped[0].reason


def test_garbage_after_valid_batches(tmp_path, log):
    source, ends, full = log
    data = source.read_bytes()
    path = tmp_path / "g.arrows"
    path.write_bytes(data[: ends[2]] + os.urandom(300))
    reader = LogReader(path)
    assert len(reader.read_new()) == 3
    assert reader.skipped[0].offset == ends[2]


def test_missing_file_is_reported_not_raised(tmp_path):
    reader = LogReader(tmp_path / "gone.arrows")
    assert reader.read_new() == []
    assert reader.skipped[0].reason.startswith("unreadable")


def test_other_schema_is_reported(tmp_path):
    path = tmp_path / "other.arrows"
    table = pa.table({"a": [1, 2]})
    with pa.ipc.new_stream(str(path), table.schema) as writer:
        writer.write_table(table)
    reader = LogReader(path)
    assert reader.read_new() == []
    assert "missing column 'rank'" in reader.skipped[0].reason


def test_other_format_version_is_reported(tmp_path):
    path = tmp_path / "v9.arrows"
    schema = S.LOG_SCHEMA.with_metadata({S.FORMAT_KEY: b"9"})
    with pa.ipc.new_stream(str(path), schema) as writer:
        writer.write_table(schema.empty_table())
    reader = LogReader(path)
    assert reader.read_new() == []
    assert reader.skipped[0].reason.startswith("unsupported: log format version '9'")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, 10**9), st.integers(1, 255)), min_size=1, max_size=4))
def test_random_byte_flips_never_raise(tmp_path, log, flips):
    source, ends, full = log
    data = bytearray(source.read_bytes())
    for where, xor in flips:
        data[where % len(data)] ^= xor
    path = tmp_path / "flipped.arrows"
    path.write_bytes(bytes(data))
    reader = LogReader(path)
    batches = reader.read_new()
    assert len(batches) <= len(full)
    for batch in batches:
        assert batch.schema.equals(S.LOG_SCHEMA)


def test_read_log_combines_files_and_ranks(tmp_path):
    meta = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
            "rank_dir": "rank0"}
    with LogWriter(tmp_path, 0) as w0, LogWriter(tmp_path, 1) as w1:
        w0.append_marker(Marker(step=0, kind="start", meta=meta))
        w0.append(make_call(1))
        w1.append(make_call(2))
    with LogWriter(tmp_path, 0) as again:  # a second file of rank 0
        again.append(make_call(3, step=1))
    contents = read_log(tmp_path)
    assert len(contents.files) == 3
    table = contents.table
    assert table.schema.equals(S.LOG_SCHEMA)
    rows = list(zip(*(table.column(c).to_pylist() for c in (S.RANK, S.SEQ, S.ROW, S.NAME))))
    assert sorted(r for r in rows if r[2] == "call") == [
        (0, 1, "call", "Torch.op1.0.forward"),
        (0, 2, "call", "Torch.op3.0.forward"),  # seq 0 of the second file, shifted past 1
        (1, 0, "call", "Torch.op2.0.forward"),
    ]
    assert contents.skipped == ()


def test_read_log_reports_skips(tmp_path):
    path, ends, _ = write_log(tmp_path, 3)
    data = path.read_bytes()
    path.write_bytes(data[: ends[1] + 5])
    contents = read_log(tmp_path)
    assert contents.table.num_rows == 6
    assert contents.skipped == (
        Skipped(str(path), ends[1], "truncated: incomplete message header (5 of 8 bytes)", None, None, (0, None)),
    )


def test_read_log_without_log(tmp_path):
    with pytest.raises(LogNotFoundError, match="no msprobe log found"):
        read_log(tmp_path)
    with pytest.raises(LogNotFoundError, match="does not exist"):
        read_log(tmp_path / "nope")
    (tmp_path / ".msprobe" / "log").mkdir(parents=True)
    (tmp_path / ".msprobe" / "log" / "rank0.1.1.arrows").write_bytes(b"")
    contents = read_log(tmp_path)
    assert contents.table.num_rows == 0 and contents.table.schema.equals(S.LOG_SCHEMA)


def test_mapped_reads_equal_copied_reads(tmp_path, log, monkeypatch):
    """Large reads map the file instead of copying it (store.log_reader._MAP_AT_LEAST);
    with the threshold at 0 every read maps: same batches, same torn-tail report, same
    incremental reading of an appended file as the copying path."""
    import store.log_reader as R

    source, ends, full = log
    data = source.read_bytes()
    torn = tmp_path / "torn.arrows"
    torn.write_bytes(data[: ends[3] + 5])
    copied = LogReader(torn)
    copied_batches = copied.read_new()
    monkeypatch.setattr(R, "_MAP_AT_LEAST", 0)
    mapped = LogReader(torn)
    mapped_batches = mapped.read_new()
    assert len(mapped_batches) == len(copied_batches) == 4
    assert all(a.equals(b) for a, b in zip(mapped_batches, full))
    assert mapped.skipped == copied.skipped and mapped.skipped[0].offset == ends[3]
    assert mapped.offset == copied.offset == ends[3]
    whole = LogReader(source).read_new()
    assert len(whole) == len(full) and all(a.equals(b) for a, b in zip(whole, full))
    # appended in pieces (never rewritten in place: mapped batches stay valid)
    grown = tmp_path / "grown.arrows"
    grown.write_bytes(b"")
    reader = LogReader(grown)
    got: list[pa.RecordBatch] = []
    for start, stop in zip([0, *ends[:-1]], ends):
        with open(grown, "ab") as handle:
            handle.write(data[start:stop])
        got.extend(reader.read_new())
        assert reader.skipped == []
    with open(grown, "ab") as handle:
        handle.write(data[ends[-1]:])
    assert reader.read_new() == [] and reader.finished
    assert len(got) == len(full) and all(a.equals(b) for a, b in zip(got, full))
