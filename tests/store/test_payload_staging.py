"""Staged tensor files (live export): the payload writer's thread writes each new payload
as a tensor file while the step runs; the exporter moves it into place instead of reading
the shard; files never moved are removed at the third flush after staging and at close; a failing
stager costs nothing but the shortcut."""
from __future__ import annotations

import os
import threading

import pyarrow as pa

from store import schema as S
from store.export import export_tensors
from store.payload_writer import PayloadReader, PayloadWriter, stage_dir


def write_raw(path, payload):
    """Tensor-file writer of these tests: the bytes, prefixed by dtype and shape."""
    with open(path, "wb") as fh:
        fh.write(f"{payload.dtype}|{list(payload.shape)}|".encode() + bytes(payload.data))


def staged_files(root):
    d = stage_dir(root)
    return sorted(p.name for p in d.rglob("*") if p.is_file()) if d.exists() else []


def payload_rows(ref, *names):
    """Log rows of tensor leaves named ``names`` (data_name), all holding payload ``ref``."""
    return pa.Table.from_pylist([{S.ROW: S.ROW_LEAF, S.SEQ: 0, S.DATA_NAME: name, S.PAYLOAD: ref} for name in names],
                                schema=S.LOG_SCHEMA)


def test_staged_file_holds_the_payload_and_is_moved_once(tmp_path):
    threads = []

    def writer(path, payload):
        threads.append(threading.current_thread().name)
        write_raw(path, payload)

    with PayloadWriter(tmp_path, rank=0, stage=(writer, "raw")) as w:
        ref = w.put(b"\x01\x02\x03\x04", "torch.float32", (1,))
        assert w.put(b"\x01\x02\x03\x04", "torch.float32", (1,)) == ref  # stored and staged once
        w.flush()
        key = ref.split(":")[1]
        assert staged_files(tmp_path) == [f"{key}.raw"]
        assert threads == ["msprobe-payload-writer"]
        reader = PayloadReader(tmp_path, verify=False, stage=w.staging)
        target = tmp_path / "t.raw"
        assert reader.take_staged(ref, target) is True
        assert target.read_bytes() == b"torch.float32|[1]|\x01\x02\x03\x04"
        assert oct(target.stat().st_mode & 0o777) == oct(0o640)
        assert reader.take_staged(ref, tmp_path / "u.raw") is False  # already moved
        assert PayloadReader(tmp_path).take_staged(ref, tmp_path / "v.raw") is False  # offline reader: never
    assert staged_files(tmp_path) == []
    assert not stage_dir(tmp_path).exists()  # the writer's staging directories are gone too


def test_two_writers_on_one_dump_path_stage_apart(tmp_path):
    """Two ranks storing the same bytes: each writer's staged file is its own."""
    with PayloadWriter(tmp_path, rank=0, stage=(write_raw, "raw")) as w0, \
            PayloadWriter(tmp_path, rank=1, stage=(write_raw, "raw")) as w1:
        r0, r1 = w0.put(b"same", "torch.uint8", (4,)), w1.put(b"same", "torch.uint8", (4,))
        w0.flush()
        w1.flush()
        assert w0.staging[0] != w1.staging[0]
        assert PayloadReader(tmp_path, verify=False, stage=w0.staging).take_staged(r0, tmp_path / "a.raw")
        assert PayloadReader(tmp_path, verify=False, stage=w1.staging).take_staged(r1, tmp_path / "b.raw")
    assert (tmp_path / "a.raw").read_bytes() == (tmp_path / "b.raw").read_bytes() == b"torch.uint8|[4]|same"


def test_unmoved_staged_files_are_removed_three_flushes_later_and_at_close(tmp_path):
    w = PayloadWriter(tmp_path, rank=0, stage=(write_raw, "raw"))
    a = w.put(b"a" * 8, "torch.uint8", (8,)).split(":")[1]
    w.flush()  # the exports after this flush and the next may move a
    assert staged_files(tmp_path) == [f"{a}.raw"]
    b = w.put(b"b" * 8, "torch.uint8", (8,)).split(":")[1]
    w.flush()
    assert staged_files(tmp_path) == sorted([f"{a}.raw", f"{b}.raw"])
    w.flush()  # a was not moved: removed now
    assert staged_files(tmp_path) == [f"{b}.raw"]
    w.flush()
    assert staged_files(tmp_path) == []
    c = w.put(b"c" * 8, "torch.uint8", (8,)).split(":")[1]
    w.flush()
    assert staged_files(tmp_path) == [f"{c}.raw"]
    w.close()
    assert staged_files(tmp_path) == []


def test_failing_stager_leaves_nothing_and_the_export_writes_the_file(tmp_path):
    def broken(path, payload):
        with open(path, "wb") as fh:
            fh.write(b"half")
        raise OSError("disk full")

    with PayloadWriter(tmp_path, rank=0, stage=(broken, "raw")) as w:
        ref = w.put(b"\x00\x00\x80\x3f", "torch.float32", (1,))
        w.flush()
        assert staged_files(tmp_path) == []
        reader = PayloadReader(tmp_path, verify=False, stage=w.staging)
        assert export_tensors(payload_rows(ref, "x.raw"), reader, write_raw, tmp_path / "out") == ["x.raw"]
    assert (tmp_path / "out" / "x.raw").read_bytes() == b"torch.float32|[1]|\x00\x00\x80\x3f"


def test_export_moves_the_staged_file_and_links_duplicates(tmp_path):
    with PayloadWriter(tmp_path, rank=0, stage=(write_raw, "raw")) as w:
        ref = w.put(b"\x07" * 4, "torch.int32", (1,))
        w.flush()
        reader = PayloadReader(tmp_path, verify=False, stage=w.staging)
        assert export_tensors(payload_rows(ref, "a.raw", "b.raw"), reader, write_raw, tmp_path / "out") == ["a.raw", "b.raw"]
        assert staged_files(tmp_path) == []
    a, b = tmp_path / "out" / "a.raw", tmp_path / "out" / "b.raw"
    assert a.read_bytes() == b.read_bytes() == b"torch.int32|[1]|" + b"\x07" * 4
    assert os.path.samefile(a, b)


def test_later_export_links_to_the_file_moved_earlier_without_reading_the_shard(tmp_path):
    """stop() exports a payload's first file; step() exports another name of the same
    payload: a hard link to the first file (the shard is not needed: it is deleted here)."""
    with PayloadWriter(tmp_path, rank=0, stage=(write_raw, "raw")) as w:
        ref = w.put(b"\x05" * 8, "torch.int64", (1,))
        w.flush()
        reader = PayloadReader(tmp_path, verify=False, stage=w.staging)
        assert export_tensors(payload_rows(ref, "fwd.raw"), reader, write_raw, tmp_path / "step0") == ["fwd.raw"]
        for shard in (tmp_path / ".msprobe" / "payload").iterdir():
            shard.unlink()
        assert export_tensors(payload_rows(ref, "bwd.raw"), reader, write_raw, tmp_path / "step0") == ["bwd.raw"]
        assert export_tensors(payload_rows(ref, "next.raw"), reader, write_raw, tmp_path / "step1") == ["next.raw"]
    first = tmp_path / "step0" / "fwd.raw"
    assert first.read_bytes() == b"torch.int64|[1]|" + b"\x05" * 8
    assert os.path.samefile(first, tmp_path / "step0" / "bwd.raw")
    assert os.path.samefile(first, tmp_path / "step1" / "next.raw")
    assert PayloadReader(tmp_path).earlier_file(ref) is None  # offline reader: never


def test_link_source_removed_falls_back_to_the_payload(tmp_path):
    """The file an earlier live export moved into place was deleted since: the next file
    of that payload is written from the shard instead of failing."""
    with PayloadWriter(tmp_path, rank=0, stage=(write_raw, "raw")) as w:
        ref = w.put(b"\x03" * 4, "torch.int32", (1,))
        w.flush()
        reader = PayloadReader(tmp_path, verify=False, stage=w.staging)
        assert export_tensors(payload_rows(ref, "a.raw"), reader, write_raw, tmp_path / "s0") == ["a.raw"]
        (tmp_path / "s0" / "a.raw").unlink()
        assert reader.earlier_file(ref) == os.fspath(tmp_path / "s0" / "a.raw")
        assert export_tensors(payload_rows(ref, "b.raw"), reader, write_raw, tmp_path / "s1") == ["b.raw"]
    assert (tmp_path / "s1" / "b.raw").read_bytes() == b"torch.int32|[1]|" + b"\x03" * 4
