"""store.tensor_names: short deterministic names for data_names over the file-name limit,
mapping.csv content, and export_tensors writing through it (live in pieces == offline)."""
from __future__ import annotations

import hashlib

import pytest

from store import schema as S
from store.export import export_tensors
from store.log_writer import LogWriter
from store.payload_writer import PayloadReader, PayloadWriter
from store.records import Call, Leaf
from store.tensor_names import disk_name, name_limit, read_mapping, tensor_file_path, tmp_name, update_mapping


def test_disk_name_rule():
    assert disk_name("a" * 255) == "a" * 255                      # at the limit: unchanged
    long = "b" * 256 + ".pt"
    want = "b" * (255 - 20) + "." + hashlib.sha256(long.encode()).hexdigest()[:16] + ".pt"
    assert disk_name(long) == want and len(want) == 255
    assert disk_name(long) == disk_name(long)                      # deterministic
    assert disk_name("b" * 256 + ".npy") != disk_name(long)
    # multi-byte UTF-8: cut on a character boundary, length counted in bytes
    name = "é" * 200 + ".pt"                                       # 403 bytes
    got = disk_name(name)
    assert len(got.encode()) <= 255 and got.startswith("é" * 117) and got.endswith(".pt")
    assert len(disk_name("c" * 100 + ".pt", limit=64).encode()) == 64
    with pytest.raises(ValueError, match="too small"):
        disk_name("c" * 100, limit=20)
    assert len(tmp_name("d" * 255).encode()) == 255 and tmp_name("x.pt") == ".x.pt.tmp"


def test_name_limit(tmp_path):
    assert 14 <= name_limit(tmp_path) <= 255
    assert name_limit(tmp_path / "missing") == 255


def test_update_mapping_merges_sorted(tmp_path):
    assert update_mapping(tmp_path, {}) is False and not (tmp_path / "mapping.csv").exists()
    assert update_mapping(tmp_path, {"z.pt": "Z", "m,1.pt": "M"}) is True
    assert update_mapping(tmp_path, {"z.pt": "Z"}) is False       # nothing new: not rewritten
    assert update_mapping(tmp_path, {"a.pt": "A"}) is True
    assert (tmp_path / "mapping.csv").read_text() == 'file_name,data_name\nA,a.pt\nM,"m,1.pt"\nZ,z.pt\n'
    assert read_mapping(tmp_path) == {"a.pt": "A", "m,1.pt": "M", "z.pt": "Z"}
    assert tensor_file_path(tmp_path, "m,1.pt") == tmp_path / "M"
    (tmp_path / "mapping.csv").write_text("file_name,data_name\n../evil,x.pt\nonly-one-field\nA,a.pt\n")
    assert read_mapping(tmp_path) == {"a.pt": "A"}


def raw(path, payload):
    path.write_bytes(payload.data)


def test_export_in_two_calls_equals_one(tmp_path):
    names = ["L" * 300 + f".{i}.pt" for i in range(3)] + ["short.pt"]
    with PayloadWriter(tmp_path, rank=0) as pw:
        refs = [pw.put(b"p%d" % (i % 2), "torch.uint8", (2,)) for i in range(4)]
    with LogWriter(tmp_path, rank=0) as w:
        leaves = tuple(Leaf(io="output", path=(i,), leaf_kind=S.LEAF_TENSOR, type="torch.Tensor",
                            dtype="torch.uint8", shape=(2,), payload=ref, data_name=n)
                       for i, (n, ref) in enumerate(zip(names, refs)))
        w.append(Call(step=0, kind=S.API_FORWARD, name="T.x.0.forward", api_type="T", keys=("output",),
                      leaves=leaves))
        rows = w.take_step(0)
    reader = PayloadReader(tmp_path)
    one, two = tmp_path / "one", tmp_path / "two"
    assert export_tensors(rows, reader, raw, one) == names
    done: set = set()
    first_two = [n in names[:2] for n in rows[S.DATA_NAME].to_pylist()]  # as at a first stop()
    assert export_tensors(rows.filter(first_two), reader, raw, two, done=done) == names[:2]
    assert read_mapping(two) == {n: disk_name(n) for n in names[:2]}
    assert export_tensors(rows, reader, raw, two, done=done) == names[2:]
    assert (one / "mapping.csv").read_bytes() == (two / "mapping.csv").read_bytes()
    mapping = read_mapping(one)
    assert mapping == {n: disk_name(n) for n in names[:3]}
    for i, n in enumerate(names):
        assert tensor_file_path(one, n).read_bytes() == b"p%d" % (i % 2)
        assert tensor_file_path(two, n).read_bytes() == b"p%d" % (i % 2)
