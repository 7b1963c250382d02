"""Damaged payload shards: a truncated or corrupted shard, or a damaged
header, gives a PayloadDamagedError naming shard and key (never another exception); the
exporter skips just those tensor files, writes every other one and logs each skip."""
from __future__ import annotations

import logging
import struct

import pytest

from store.errors import PayloadDamagedError, StoreError
from store.export import export_tensors
from store.payload_writer import PayloadReader, PayloadWriter, content_key, payload_dir

A = (b"\x00\x00\x80\x3f" * 4, "torch.float32", (4,))   # four 1.0
B = (b"\x00\x00\x00\x40" * 6, "torch.float32", (2, 3))  # six 2.0


def shard_with_two(tmp_path):
    with PayloadWriter(tmp_path, rank=0) as writer:
        refs = [writer.put(*A), writer.put(*B)]
    (shard,) = payload_dir(tmp_path).iterdir()
    return shard, refs


def test_intact_shard_reads_back(tmp_path):
    shard, refs = shard_with_two(tmp_path)
    reader = PayloadReader(tmp_path)
    assert reader.read(refs[0]).data == A[0] and reader.read(refs[1]).shape == (2, 3)
    assert refs[1].endswith(content_key(*B))


def test_flipped_data_byte_is_detected_by_the_content_key(tmp_path):
    shard, refs = shard_with_two(tmp_path)
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0x01  # last byte belongs to the last tensor's data
    shard.write_bytes(bytes(raw))
    reader = PayloadReader(tmp_path)
    damaged = [ref for ref in refs if _fails(reader, ref)]
    assert len(damaged) == 1
    with pytest.raises(PayloadDamagedError, match=r"is corrupted: its bytes do not match their key"):
        reader.read(damaged[0])


def _fails(reader, ref) -> bool:
    try:
        reader.read(ref)
    except PayloadDamagedError:
        return True
    return False


def test_truncated_shard_keeps_the_payloads_before_the_cut(tmp_path):
    shard, refs = shard_with_two(tmp_path)
    raw = shard.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    data_start = 8 + length
    shard.write_bytes(raw[: data_start + 16])  # the first payload (16 bytes) stays whole
    reader = PayloadReader(tmp_path)
    readable = [ref for ref in refs if not _fails(reader, ref)]
    assert len(readable) == 1 and reader.read(readable[0]).data in (A[0], B[0])
    with pytest.raises(PayloadDamagedError, match="truncated"):
        reader.read(next(ref for ref in refs if ref not in readable))


@pytest.mark.parametrize("content, words", [
    (b"", "truncated: 0 of 8"),
    (b"\x05\x00", "truncated: 2 of 8"),
    (struct.pack("<Q", 12) + b'{"a": [1, 2', "damaged header"),
    (struct.pack("<Q", 4) + b"\xff\xfe\xfd\xfc", "damaged header"),
    (struct.pack("<Q", 2) + b"[]", "damaged header"),
    (struct.pack("<Q", 10**12), "damaged header"),
])
def test_damaged_header_is_a_clear_error(tmp_path, content, words):
    shard, refs = shard_with_two(tmp_path)
    shard.write_bytes(content)
    reader = PayloadReader(tmp_path)
    for ref in refs:
        with pytest.raises(PayloadDamagedError, match=words):
            reader.read(ref)


def test_damaged_header_entry_is_a_clear_error(tmp_path):
    shard, refs = shard_with_two(tmp_path)
    raw = shard.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = raw[8:8 + length].replace(b'"data_offsets":[', b'"data_offsets":["x",', 1)
    shard.write_bytes(struct.pack("<Q", len(header)) + header + raw[8 + length:])
    reader = PayloadReader(tmp_path)
    errors = 0
    for ref in refs:
        try:
            reader.read(ref)
        except PayloadDamagedError as exc:
            errors += 1
            assert "damaged header entry" in str(exc)
    assert errors == 1


def test_exporter_skips_damaged_payloads_and_writes_the_rest(tmp_path, caplog):
    import pyarrow as pa

    from store import schema as S

    shard, refs = shard_with_two(tmp_path)
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0x01
    shard.write_bytes(bytes(raw))
    reader = PayloadReader(tmp_path)
    bad = next(ref for ref in refs if _fails(reader, ref))
    good = next(ref for ref in refs if ref != bad)
    refs_all = [good, bad, "no-colon", "missing.safetensors:" + "0" * 32]
    names = [f"t{i}.pt" for i in range(len(refs_all))]
    n = len(refs_all)
    columns = {field.name: pa.nulls(n, field.type) for field in S.LOG_SCHEMA}
    columns[S.ROW] = pa.array([S.ROW_LEAF] * n, S.LOG_SCHEMA.field(S.ROW).type)
    columns[S.DATA_NAME] = pa.array(names, S.LOG_SCHEMA.field(S.DATA_NAME).type)
    columns[S.PAYLOAD] = pa.array(refs_all, S.LOG_SCHEMA.field(S.PAYLOAD).type)
    rows = pa.table(columns)
    written = {}

    def write_tensor(path, payload):
        path.write_bytes(payload.data)
        written[path.name] = payload.data

    caplog.set_level(logging.WARNING, logger="msprobe")
    export_tensors(rows, reader, write_tensor, tmp_path / "out")
    assert sorted((tmp_path / "out").iterdir()) == [tmp_path / "out" / "t0.pt"]
    assert (tmp_path / "out" / "t0.pt").read_bytes() in (A[0], B[0])
    skipped = [r.getMessage() for r in caplog.records if "not exported" in r.getMessage()]
    assert len(skipped) == 3 and all(isinstance(m, str) for m in skipped)
    assert any("is corrupted" in m for m in skipped)
    assert issubclass(PayloadDamagedError, StoreError)


def test_content_key_is_xxh3_128_of_dtype_shape_and_bytes():
    import xxhash

    expected = "x" + xxhash.xxh3_128(b"torch.float32|[2, 3]|" + B[0]).hexdigest()
    assert content_key(*B) == expected and len(expected) == 33
    assert content_key(B[0], "torch.float32", (3, 2)) != expected  # the shape is part of it
    assert content_key(B[0], "torch.int32", (2, 3)) != expected    # and so is the dtype


def _written_without_xxhash(tmp_path, monkeypatch):
    """A shard written where the xxhash package is missing: SHA-256 keys."""
    import store.payload_writer as pw

    monkeypatch.setattr(pw, "_xxh3_128", None)
    with PayloadWriter(tmp_path, rank=0) as writer:
        refs = [writer.put(*A), writer.put(*B)]
    monkeypatch.undo()
    return refs


def test_without_xxhash_keys_are_sha256_and_still_verified(tmp_path, monkeypatch):
    """SHA-256 keys (no xxhash, or shards of earlier versions) read and verify; a flipped
    byte in them is detected."""
    import hashlib

    refs = _written_without_xxhash(tmp_path, monkeypatch)
    assert refs[1].split(":")[1] == hashlib.sha256(b"torch.float32|[2, 3]|" + B[0]).hexdigest()
    assert PayloadReader(tmp_path).read(refs[1]).data == B[0]
    (shard,) = payload_dir(tmp_path).iterdir()
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0x01
    shard.write_bytes(bytes(raw))
    assert sum(_fails(PayloadReader(tmp_path), ref) for ref in refs) == 1


def test_xxh3_key_without_xxhash_is_a_clear_error(tmp_path, monkeypatch):
    import store.payload_writer as pw

    with PayloadWriter(tmp_path, rank=0) as writer:
        ref = writer.put(*A)
    monkeypatch.setattr(pw, "_xxh3_128", None)
    with pytest.raises(StoreError, match="needs the xxhash package"):
        pw.key_matches(ref.split(":")[1], *A)
    assert PayloadReader(tmp_path, verify=False).read(ref).data == A[0]


def test_shard_with_blake2b_keys_of_older_dumps_reads_and_verifies(tmp_path):
    """Shards written before SHA-256 keys (32 hex digits of BLAKE2b-128) stay readable,
    and a flipped byte in them is still detected."""
    import hashlib

    from store.payload_writer import _encode_shard

    key = hashlib.blake2b(b"torch.float32|[4]|" + A[0], digest_size=16).hexdigest()
    head, pieces = _encode_shard([(key, A[1], A[2], A[0])])
    directory = payload_dir(tmp_path)
    directory.mkdir(parents=True)
    shard = directory / "rank0.1.2.00000.safetensors"
    shard.write_bytes(head + b"".join(pieces))
    ref = f"{shard.name}:{key}"
    assert PayloadReader(tmp_path).read(ref).data == A[0]
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0x80
    shard.write_bytes(bytes(raw))
    with pytest.raises(PayloadDamagedError, match="corrupted"):
        PayloadReader(tmp_path).read(ref)


def test_live_reader_without_verification_returns_the_stored_bytes(tmp_path):
    """verify=False (the live exporter, reading shards it just wrote) skips the hash pass:
    a flipped byte comes back as stored; truncation is still an error."""
    shard, refs = shard_with_two(tmp_path)
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0x01
    shard.write_bytes(bytes(raw))
    fast = PayloadReader(tmp_path, verify=False)
    got = [fast.read(ref).data for ref in refs]
    assert sorted(got) == sorted([A[0], B[0][:-1] + bytes([B[0][-1] ^ 0x01])]) or \
        sorted(got) == sorted([A[0][:-1] + bytes([A[0][-1] ^ 0x01]), B[0]])
    assert all(isinstance(data, bytearray) for data in got)
    shard.write_bytes(bytes(raw[:-1]))
    with pytest.raises(PayloadDamagedError, match="truncated"):
        for ref in refs:
            PayloadReader(tmp_path, verify=False).read(ref)
