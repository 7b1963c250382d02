"""Log format 2: every batch is verified by its CRC-32; damage is skipped exactly, reported,
never read as data; format-1 logs are read and called unverified."""
from __future__ import annotations

import io
import random
import struct
import zlib

import pyarrow as pa
import pytest

from store import log_frame as F
from store import schema as S
from store.log_reader import LogReader, read_log
from store.log_writer import LogWriter
from store.records import Call, Leaf


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


def message_ranges(data: bytes) -> list[tuple[int, int]]:
    """``(start, end)`` byte range of every IPC message of ``data`` (schema first, the
    end-of-stream marker last), by the stream framing of a clean file."""
    ranges, pos = [], 0
    while pos < len(data):
        length = struct.unpack_from("<i", data, pos + 4)[0]
        if length == 0:
            ranges.append((pos, pos + 8))
            break
        source = pa.BufferReader(pa.py_buffer(data[pos:]))
        pa.ipc.read_message(source)
        ranges.append((pos, pos + source.tell()))
        pos += source.tell()
    return ranges


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    """A closed log of 8 batches (2 calls each, steps 0..3), its bytes, its batches as any
    Arrow reader gives them, and the byte range of each message."""
    dump = tmp_path_factory.mktemp("log")
    writer = LogWriter(dump, 0, flush_rows=10**6, flush_interval_s=3600)
    for i in range(16):
        writer.append(make_call(i, step=i // 4))
        if i % 2:
            writer.flush()
    writer.close()
    data = writer.path.read_bytes()
    batches = list(pa.ipc.open_stream(data))
    ranges = message_ranges(data)
    assert len(batches) == 8 and len(ranges) == 10
    return data, batches, ranges


def rows(batches) -> list[dict]:
    return pa.Table.from_batches(batches, schema=S.LOG_SCHEMA).to_pylist() if batches else []


def read_damaged(tmp_path, data: bytes):
    path = tmp_path / "damaged.arrows"
    path.write_bytes(data)
    reader = LogReader(path)
    return reader, reader.read_new()


def test_every_batch_carries_the_crc32_of_its_message(log):
    data, batches, ranges = log
    reader = pa.ipc.open_stream(data)
    assert reader.schema.metadata[S.FORMAT_KEY] == b"2"
    assert reader.schema.metadata[S.CHECKSUM_ALGORITHM_KEY] == b"crc32"
    for (start, end), (_, custom) in zip(ranges[1:-1], reader.iter_batches_with_custom_metadata()):
        stored = custom[F.CHECKSUM_KEY]
        message = data[start:end]
        at = message.index(stored)
        # zlib's CRC-32 of the message with the digits read as "00000000"
        assert int(stored, 16) == zlib.crc32(message[:at] + b"00000000" + message[at + 8:])


def test_a_flipped_value_is_never_read_the_batch_is_skipped_and_the_next_ones_read(tmp_path, log):
    data, batches, ranges = log
    norm = struct.pack("<d", 0.3386 + 6)  # the norm of call 6 (batch 3, step 1)
    at = data.index(norm)
    damaged = bytearray(data)
    damaged[at + 6] ^= 0x01
    reader, got = read_damaged(tmp_path, bytes(damaged))
    assert rows(got) == rows(batches[:3] + batches[4:])
    start, end = ranges[4]  # message 4 is batch 3 (message 0 is the schema)
    assert [(s.offset, s.end, s.rows, s.steps) for s in reader.skipped] == [(start, end, 6, (1, 2))]
    assert reader.skipped[0].reason.startswith("corrupt: checksum mismatch")
    assert reader.verified is True and reader.finished
    assert reader.skipped[0].describe() == (
        f"skipped {tmp_path / 'damaged.arrows'} at byte {start} (to byte {end}, 6 rows by its header, "
        f"steps 1 to 2): {reader.skipped[0].reason}")


@pytest.mark.parametrize("where", ["continuation", "metadata_length", "row_count_area", "body_end"])
def test_damage_to_a_batch_header_is_skipped_exactly(tmp_path, log, where):
    data, batches, ranges = log
    start, end = ranges[3]  # batch 2
    at = {"continuation": start + 1, "metadata_length": start + 5, "row_count_area": start + 40,
          "body_end": end - 1}[where]
    damaged = bytearray(data)
    damaged[at] ^= 0x10
    reader, got = read_damaged(tmp_path, bytes(damaged))
    assert rows(got) == rows(batches[:2] + batches[3:])
    assert len(reader.skipped) == 1
    skip = reader.skipped[0]
    assert (skip.offset, skip.end) == (start, end)


def test_a_damaged_schema_message_loses_no_batch(tmp_path, log):
    data, batches, ranges = log
    name = data.index(b"norm", 0, ranges[0][1])  # a column name in the schema message
    damaged = bytearray(data)
    damaged[name] ^= 0x02
    reader, got = read_damaged(tmp_path, bytes(damaged))
    assert rows(got) == rows(batches)
    assert [(s.offset, s.end) for s in reader.skipped] == [ranges[0]]
    assert reader.skipped[0].reason.startswith("corrupt")


def test_a_flipped_format_version_loses_no_batch(tmp_path, log):
    data, batches, ranges = log
    digit = data.index(b"\x01\x00\x00\x002\x00", 0, ranges[0][1]) + 4  # the flatbuffer string "2"
    damaged = bytearray(data)
    damaged[digit] ^= 0x01  # "2" -> "3"
    reader, got = read_damaged(tmp_path, bytes(damaged))
    assert rows(got) == rows(batches)
    assert "unsupported: log format version '3'" in reader.skipped[0].reason


def test_the_same_file_read_incrementally_skips_the_damage_and_goes_on(tmp_path, log):
    data, batches, ranges = log
    damaged = bytearray(data)
    damaged[ranges[2][0] + 100] ^= 0x80  # batch 1
    path = tmp_path / "growing.arrows"
    reader = LogReader(path)
    seen, skips = [], []
    for cut in (ranges[1][1], ranges[2][1] - 3, ranges[3][1], ranges[6][1], len(data)):
        path.write_bytes(bytes(damaged[:cut]))
        seen += reader.read_new()
        skips += reader.skipped
    assert rows(seen) == rows(batches[:1] + batches[2:])
    # while the damaged message is the file's tail it is reported up to the end (it may
    # be a message still being written); once a verified message follows, its exact range
    assert {s.offset for s in skips} == {ranges[2][0]}
    assert skips[-1].end == ranges[2][1] and reader.skipped == [] and reader.finished


def test_a_torn_tail_after_a_damaged_batch_is_truncated(tmp_path, log):
    data, batches, ranges = log
    damaged = bytearray(data[: ranges[5][0] + 30])  # batch 4 torn
    damaged[ranges[3][0] + 300] ^= 0x04  # batch 2 damaged
    reader, got = read_damaged(tmp_path, bytes(damaged))
    assert rows(got) == rows(batches[:2] + batches[3:4])
    assert [(s.offset, s.end, s.reason.split(":")[0]) for s in reader.skipped] == [
        (ranges[3][0], ranges[3][1], "corrupt"), (ranges[5][0], None, "truncated")]
    assert reader.offset == ranges[5][0]  # a live writer may still complete it


def test_a_batch_without_checksum_in_a_format_2_log_is_not_read(tmp_path, log):
    data, batches, ranges = log
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, S.LOG_SCHEMA) as writer:  # format-2 schema, batches unsealed
        writer.write_batch(batches[0])
    reader, got = read_damaged(tmp_path, sink.getvalue())
    assert got == [] and reader.skipped[0].reason == "corrupt: no checksum in the message metadata"


def test_format_1_logs_are_read_and_called_unverified(tmp_path, log):
    data, batches, ranges = log
    log_dir = tmp_path / S.STORE_DIR / S.LOG_DIR
    log_dir.mkdir(parents=True)
    old = S.LOG_SCHEMA.with_metadata({S.FORMAT_KEY: b"1"})
    path = log_dir / "rank0.1.2.arrows"
    with pa.ipc.new_stream(str(path), old) as writer:
        for batch in batches:
            writer.write_batch(pa.RecordBatch.from_arrays(batch.columns, schema=old))
    contents = read_log(tmp_path)
    assert contents.table.to_pylist() == rows(batches)
    assert contents.skipped == () and contents.unverified == (str(path),)
    assert contents.notices() == [
        f"unverified {path}: log format 1 has no checksums; damage in it may go unnoticed"]


def test_a_log_written_from_batches_reads_back(tmp_path, log):
    data, batches, ranges = log
    sink = io.BytesIO()
    F.write_batches(sink, batches, compression="lz4")
    reader, got = read_damaged(tmp_path, sink.getvalue())
    assert rows(got) == rows(batches) and reader.skipped == [] and reader.verified


def test_write_batches_refuses_another_schema():
    with pytest.raises(ValueError, match="log schema"):
        F.write_batches(io.BytesIO(), [pa.record_batch({"a": [1]})])


def expected_after_flip(batches, ranges, at: int) -> list:
    """The batches a reader must return after damage at byte ``at``: all but the one whose
    message holds ``at``."""
    hit = next(i for i, (start, end) in enumerate(ranges) if start <= at < end)
    return [b for i, b in enumerate(batches) if i + 1 != hit]


@pytest.mark.parametrize("width", [1, 4])
def test_random_bit_flips_and_words_are_detected_or_harmless(tmp_path, log, width):
    """Flip one bit (width 1) or overwrite one aligned 4-byte word with random bits (width
    4) at 300 random places: the reader returns exactly the batches whose messages are
    intact, and reports a skip that covers the damaged byte."""
    data, batches, ranges = log
    rng = random.Random(44 + width)
    for _ in range(300):
        damaged = bytearray(data)
        if width == 1:
            at = rng.randrange(len(data))
            damaged[at] ^= 1 << rng.randrange(8)
            changed = [at]
        else:
            at = rng.randrange(len(data) // 4) * 4
            word = rng.getrandbits(32).to_bytes(4, "little")
            changed = [at + k for k in range(4) if damaged[at + k] != word[k]]
            damaged[at:at + 4] = word
            if not changed:
                continue
        reader, got = read_damaged(tmp_path, bytes(damaged))
        assert rows(got) == rows(expected_after_flip(batches, ranges, changed[0])), at
        assert any(s.offset <= changed[0] < (s.end or len(data)) for s in reader.skipped), at


META = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None}


def write_ranks(dump, ranks, meta_extra):
    from store.records import Marker

    for rank in ranks:
        with LogWriter(dump, rank) as writer:
            writer.append_marker(Marker(step=0, kind="start", meta={**META, "rank_dir": f"rank{rank}", **meta_extra}))
            writer.append(make_call(rank, step=0))


def test_a_rank_the_run_recorded_without_a_log_is_reported(tmp_path):
    write_ranks(tmp_path, [0, 1], {"world_size": 3})
    contents = read_log(tmp_path)
    assert contents.missing_ranks == (2,)
    assert contents.notices() == [
        "skipped rank 2: no readable log, although the run recorded it (world size or config rank list in the markers)"]


@pytest.mark.parametrize("extra, missing", [({"world_size": 3, "ranks": [0, 1]}, ()),  # config rank list
                                            ({}, ()),  # no torch.distributed: nothing expected
                                            ({"world_size": 2}, ())])
def test_ranks_not_expected_are_not_reported(tmp_path, extra, missing):
    write_ranks(tmp_path, [0, 1], extra)
    assert read_log(tmp_path).missing_ranks == missing


@pytest.mark.parametrize("metas, expected", [
    (['{"world_size": 3}', '{"world_size": 4}'], {0, 1, 2, 3}),       # the largest world size
    (['{"world_size": 4, "ranks": [1, 3]}'], {1, 3}),                  # the config's rank list wins
    (['[1, 2]', 'not json', None, '{"world_size": "3"}'], set()),       # no usable meta: nothing expected
])
def test_expected_ranks_come_from_the_markers_meta(metas, expected):
    from store.log_reader import expected_ranks

    table = pa.table({S.ROW: [S.ROW_MARKER] * len(metas) + [S.ROW_CALL],
                      S.META: metas + ['{"world_size": 9}']},          # a call row's meta is not read
                     schema=pa.schema([S.LOG_SCHEMA.field(S.ROW), S.LOG_SCHEMA.field(S.META)]))
    assert expected_ranks(table) == expected


def test_a_log_cut_between_batches_is_unfinished_not_silent(tmp_path, log):
    data, batches, ranges = log
    log_dir = tmp_path / S.STORE_DIR / S.LOG_DIR
    log_dir.mkdir(parents=True)
    path = log_dir / "rank0.1.2.arrows"
    path.write_bytes(data[: ranges[5][1]])  # 5 whole batches, no end-of-stream marker
    contents = read_log(tmp_path)
    assert contents.table.to_pylist() == rows(batches[:5]) and contents.skipped == ()
    assert contents.unfinished == (str(path),)
    assert contents.notices() == [
        f"unfinished {path}: no end-of-stream marker: the process writing it was killed or is still running; "
        "rows it had not flushed are not in it"]
    path.write_bytes(data)
    assert read_log(tmp_path).unfinished == ()


def test_iter_new_yields_verified_batches_one_at_a_time(tmp_path, log):
    data, batches, ranges = log
    damaged = bytearray(data)
    damaged[ranges[4][0] + 200] ^= 0x20  # batch 3 (steps 1)
    path = tmp_path / "it.arrows"
    path.write_bytes(bytes(damaged))
    reader = LogReader(path)
    seen = []
    for batch in reader.iter_new():
        seen.append((batch, reader.offset))
    # each batch arrives with the offset just past its own message
    assert [offset for _, offset in seen] == [end for _, end in ranges[1:4] + ranges[5:9]]
    assert rows([b for b, _ in seen]) == rows(batches[:3] + batches[4:])
    (skip,) = reader.skipped
    assert (skip.offset, skip.end, skip.steps) == (ranges[4][0], ranges[4][1], (1, 2))
    assert reader.finished and reader.offset == len(data)
