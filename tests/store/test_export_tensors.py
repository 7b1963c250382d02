"""store.export.export_tensors: tensor files from payload shards through a framework-free
callback; duplicates hard-linked (copied where links fail); missing shards skipped."""
from __future__ import annotations

import logging
import os

import pytest

from store import schema as S
from store.export import export_tensors
from store.log_writer import LogWriter
from store.payload_writer import PayloadReader, PayloadWriter
from store.records import Call, Leaf


def write_raw(path, payload):
    path.write_bytes(f"{payload.dtype}|{list(payload.shape)}|".encode() + payload.data)


def make_rows(tmp_path, refs):
    leaves = tuple(Leaf(io="output", path=(i,), leaf_kind=S.LEAF_TENSOR, type="torch.Tensor", dtype="torch.uint8",
                        shape=(2,), payload=ref, data_name=f"Torch.x.0.forward.output.{i}.pt")
                   for i, ref in enumerate(refs))
    with LogWriter(tmp_path, rank=0) as w:
        w.append(Call(step=0, kind=S.API_FORWARD, name="Torch.x.0.forward", api_type="Torch",
                      keys=("output",), leaves=leaves))
        return w.take_step(0)


def test_files_and_hard_links(tmp_path):
    with PayloadWriter(tmp_path, rank=0) as pw:
        refs = [pw.put(b"ab", "torch.uint8", (2,)), pw.put(b"cd", "torch.uint8", (2,)),
                pw.put(b"ab", "torch.uint8", (2,))]
    assert refs[0] == refs[2]
    rows = make_rows(tmp_path, refs)
    out = tmp_path / "out"
    done: set = set()
    names = export_tensors(rows, PayloadReader(tmp_path), write_raw, out, done=done)
    assert names == [f"Torch.x.0.forward.output.{i}.pt" for i in range(3)]
    files = [out / n for n in names]
    assert [f.read_bytes() for f in files] == [b"torch.uint8|[2]|ab", b"torch.uint8|[2]|cd", b"torch.uint8|[2]|ab"]
    assert files[0].stat().st_ino == files[2].stat().st_ino != files[1].stat().st_ino
    assert oct(files[0].stat().st_mode & 0o777) == oct(0o640)
    # names already done are skipped (live export at stop() then step())
    assert export_tensors(rows, PayloadReader(tmp_path), write_raw, out, done=done) == []


def test_copy_when_links_fail(tmp_path, monkeypatch):
    with PayloadWriter(tmp_path, rank=0) as pw:
        refs = [pw.put(b"ab", "torch.uint8", (2,))] * 2
    rows = make_rows(tmp_path, refs)

    def no_link(*a, **k):
        raise OSError("links not supported")

    monkeypatch.setattr(os, "link", no_link)
    out = tmp_path / "out"
    export_tensors(rows, PayloadReader(tmp_path), write_raw, out)
    a, b = out / "Torch.x.0.forward.output.0.pt", out / "Torch.x.0.forward.output.1.pt"
    assert a.read_bytes() == b.read_bytes() and a.stat().st_ino != b.stat().st_ino


def test_missing_shard_is_skipped(tmp_path, caplog):
    rows = make_rows(tmp_path, ["rank0.1.2.00000.safetensors:" + "0" * 32])
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        assert export_tensors(rows, PayloadReader(tmp_path), write_raw, tmp_path / "out") == []
    assert "unreadable" in caplog.text


def test_export_over_existing_files_replaces_them_with_links(tmp_path):
    """A second export into the same directory (a re-run, ``msprobe export`` over a live
    dump) replaces stale files: the duplicate becomes a link to the new first file."""
    with PayloadWriter(tmp_path, rank=0) as pw:
        refs = [pw.put(b"ab", "torch.uint8", (2,))] * 2
    rows = make_rows(tmp_path, refs)
    out = tmp_path / "out"
    out.mkdir()
    for i in range(2):
        (out / f"Torch.x.0.forward.output.{i}.pt").write_bytes(b"stale")
    assert len(export_tensors(rows, PayloadReader(tmp_path), write_raw, out)) == 2
    a, b = out / "Torch.x.0.forward.output.0.pt", out / "Torch.x.0.forward.output.1.pt"
    assert a.read_bytes() == b.read_bytes() == b"torch.uint8|[2]|ab"
    assert os.path.samefile(a, b)
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_copy_replaces_an_existing_file_when_links_fail(tmp_path, monkeypatch):
    with PayloadWriter(tmp_path, rank=0) as pw:
        refs = [pw.put(b"cd", "torch.uint8", (2,))] * 2
    rows = make_rows(tmp_path, refs)
    out = tmp_path / "out"
    out.mkdir()
    (out / "Torch.x.0.forward.output.1.pt").write_bytes(b"stale")

    def no_link(*a, **k):
        raise PermissionError("links not allowed here")

    monkeypatch.setattr(os, "link", no_link)
    export_tensors(rows, PayloadReader(tmp_path), write_raw, out)
    b = out / "Torch.x.0.forward.output.1.pt"
    assert b.read_bytes() == b"torch.uint8|[2]|cd" and oct(b.stat().st_mode & 0o777) == oct(0o640)
    assert sorted(p.name for p in out.iterdir()) == ["Torch.x.0.forward.output.0.pt", "Torch.x.0.forward.output.1.pt"]


def test_leftover_temporary_link_is_not_written_through(tmp_path):
    """A temporary name left behind as a hard link to another tensor file (a process killed
    between ``os.link(source, tmp)`` and ``os.replace(tmp, target)`` of a duplicate) must not
    be opened for writing: truncating it would rewrite that other file's bytes in place."""
    with PayloadWriter(tmp_path, rank=0) as pw:
        ref = pw.put(b"cd", "torch.uint8", (2,))
    out = tmp_path / "out"
    out.mkdir()
    other = out / "Torch.x.0.forward.output.0.pt"  # exported earlier (not in these rows)
    other.write_bytes(b"torch.uint8|[2]|ab")
    os.link(other, out / ".Torch.x.0.forward.output.1.pt.tmp")
    leaf = Leaf(io="output", path=(1,), leaf_kind=S.LEAF_TENSOR, type="torch.Tensor", dtype="torch.uint8",
                shape=(2,), payload=ref, data_name="Torch.x.0.forward.output.1.pt")
    with LogWriter(tmp_path, rank=0) as w:
        w.append(Call(step=0, kind=S.API_FORWARD, name="Torch.x.0.forward", api_type="Torch",
                      keys=("output",), leaves=(leaf,)))
        rows = w.take_step(0)
    assert export_tensors(rows, PayloadReader(tmp_path), write_raw, out) == ["Torch.x.0.forward.output.1.pt"]
    assert (out / "Torch.x.0.forward.output.1.pt").read_bytes() == b"torch.uint8|[2]|cd"
    assert other.read_bytes() == b"torch.uint8|[2]|ab"  # untouched
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


def test_failed_rename_of_a_temporary_link_leaves_nothing(tmp_path, monkeypatch):
    """_link_or_copy over an existing file: when the rename fails, the temporary link is
    removed (and the error raised), so no hard link to the source stays under a temporary name."""
    from store import export as export_mod

    source, target = tmp_path / "a.pt", tmp_path / "b.pt"
    source.write_bytes(b"new")
    target.write_bytes(b"old")

    def no_replace(*a, **k):
        raise OSError("rename refused")

    monkeypatch.setattr(os, "replace", no_replace)
    with pytest.raises(OSError, match="rename refused"):
        export_mod._link_or_copy(source, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "b.pt"]
    assert source.stat().st_nlink == 1 and target.read_bytes() == b"old"
