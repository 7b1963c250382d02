"""save_tensor writes torch.save's zip layout itself: torch.load(weights_only=True) (and
mmap=True) returns the tensor bit for bit in its dtype; Python's zipfile checks every
CRC-32 (zlib, computed independently of the writer); the data record starts at a multiple
of 64; ZIP64 records are read too; tensors the fast writer does not handle fall back to
torch.save."""
from __future__ import annotations

import ctypes
import math
import pickle
import struct
import zipfile
import zlib

import pytest
import torch

from msprobe.pytorch.payload import write_pt
from msprobe.pytorch import ptfile
from msprobe.pytorch.ptfile import _values_template, save_tensor, save_values
import store.direct_io as dio
from store.direct_io import thread_writer
from store.payload_writer import Payload


def raw(t: torch.Tensor) -> bytes:
    t = t.contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()) if t.numel() else b""


CASES = {
    "f32": lambda: torch.randn(3, 5),
    "bf16": lambda: torch.randn(4, 3).to(torch.bfloat16),
    "f16": lambda: (torch.randn(7) * 1000).to(torch.float16),
    "f64_nan_inf_negzero": lambda: torch.tensor([float("nan"), float("inf"), -0.0, 1e-310], dtype=torch.float64),
    "i64": lambda: torch.arange(-6, 6).reshape(2, 2, 3),
    "u16": lambda: torch.tensor([0, 1, 65535], dtype=torch.uint16),
    "u32": lambda: torch.tensor([0, 4294967295], dtype=torch.uint32),
    "i8": lambda: torch.tensor([-128, 127], dtype=torch.int8),
    "bool": lambda: torch.tensor([[True, False, True]]),
    "c64": lambda: torch.complex(torch.randn(3), torch.randn(3)),
    "f8": lambda: torch.tensor([0.5, -2.0, 448.0]).to(torch.float8_e4m3fn),
    "zero_dim": lambda: torch.tensor(-3.25),
    "empty": lambda: torch.empty(0, 4),
}


@pytest.mark.parametrize("zip64", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_loads_bit_exact_with_weights_only(tmp_path, case, zip64):
    torch.manual_seed(3)
    t = CASES[case]()
    path = tmp_path / "t.pt"
    save_tensor(path, t, force_zip64=zip64)
    with zipfile.ZipFile(path) as zf:
        assert zf.testzip() is None  # every CRC-32 matches the bytes stored
        names = zf.namelist()
        assert names == ["archive/data.pkl", "archive/.format_version", "archive/.storage_alignment",
                         "archive/byteorder", "archive/data/0", "archive/version"]
        assert zf.read("archive/data/0") == raw(t)
        info = zf.getinfo("archive/data/0")
    with open(path, "rb") as fh:  # data offset: local header, name and extra field
        fh.seek(info.header_offset)
        head = fh.read(30)
        name_len, extra_len = struct.unpack("<HH", head[26:30])
    assert (info.header_offset + 30 + name_len + extra_len) % 64 == 0
    # zipfile checks the central directory's CRC-32; the local header's (filled in at a
    # fixed offset of the cached template) must be the same: zlib of the stored bytes
    assert struct.unpack("<I", head[14:18])[0] == info.CRC == zlib.crc32(raw(t))
    for mmap in (False, True):
        got = torch.load(path, weights_only=True, mmap=mmap)
        assert got.dtype == t.dtype and got.shape == t.shape and not got.requires_grad
        assert raw(got) == raw(t)


def test_same_layout_as_torch_save_for_the_pickle(tmp_path):
    """data.pkl is what torch.save pickles for the same tensor (read back with zipfile)."""
    t = torch.randn(2, 3).to(torch.bfloat16)
    save_tensor(tmp_path / "a.pt", t)
    torch.save(t, tmp_path / "b.pt")
    with zipfile.ZipFile(tmp_path / "a.pt") as a, zipfile.ZipFile(tmp_path / "b.pt") as b:
        assert a.read("archive/data.pkl") == b.read("b/data.pkl")
        assert a.read("archive/data/0") == b.read("b/data/0")
        assert a.read("archive/version") == b.read("b/version")


def test_non_contiguous_and_offset_tensors_fall_back_to_torch_save(tmp_path):
    base = torch.arange(12.0).reshape(3, 4)
    for i, t in enumerate([base.t(), base[1], base[:, ::2]]):
        path = tmp_path / f"{i}.pt"
        save_tensor(path, t)
        got = torch.load(path, weights_only=True)
        assert torch.equal(got, t) and got.stride() == t.stride()


def test_wrong_data_length_is_refused(tmp_path):
    with pytest.raises(ValueError, match="bytes"):
        save_tensor(tmp_path / "x.pt", torch.zeros(4), data=b"\x00" * 3)


def test_write_pt_from_a_payload(tmp_path):
    values = torch.tensor([[1.0, -2.5], [3.0, float("nan")]], dtype=torch.float16)
    write_pt(tmp_path / "p.pt", Payload(data=bytearray(raw(values)), dtype="torch.float16", shape=(2, 2)))
    write_pt(tmp_path / "e.pt", Payload(data=b"", dtype="torch.int32", shape=(0, 3)))
    got = torch.load(tmp_path / "p.pt", weights_only=True)
    assert got.dtype == torch.float16 and raw(got) == raw(values)
    empty = torch.load(tmp_path / "e.pt", weights_only=True)
    assert empty.dtype == torch.int32 and empty.shape == (0, 3)


def test_fallbacks_with_data_write_the_data_not_the_placeholder(tmp_path, monkeypatch):
    """When the fast writer cannot pickle (a torch it does not know), torch.save writes the
    given bytes, not the uninitialised placeholder tensor's memory."""
    import msprobe.pytorch.ptfile as ptfile

    def unknown(_t):
        raise pickle.PicklingError("unknown storage")

    monkeypatch.setattr(ptfile, "_records_before", unknown)
    values = torch.tensor([[1.5, -2.0, 3.25]], dtype=torch.bfloat16)
    save_tensor(tmp_path / "a.pt", torch.empty(1, 3, dtype=torch.bfloat16), raw(values))
    got = torch.load(tmp_path / "a.pt", weights_only=True)
    assert got.dtype == torch.bfloat16 and got.shape == (1, 3) and raw(got) == raw(values)
    base = torch.zeros(2, 4)
    save_tensor(tmp_path / "b.pt", base.t(), raw(torch.arange(8.0).reshape(4, 2)))  # non-contiguous placeholder
    assert torch.equal(torch.load(tmp_path / "b.pt", weights_only=True), torch.arange(8.0).reshape(4, 2))


@pytest.mark.parametrize("dtype,shape", [(torch.float32, (3, 5)), (torch.bfloat16, (7,)), (torch.int64, ()),
                                         (torch.float16, (0, 4)), (torch.complex64, (2, 2)), (torch.bool, (9,))])
def test_save_values_writes_the_same_file_as_save_tensor(tmp_path, dtype, shape):
    """save_values (the exporter's path, pickle made once per dtype and shape) writes the
    bytes save_tensor writes for a tensor holding the values, every time."""
    t = (torch.randn(shape, dtype=torch.float64) * 100).to(dtype)
    data = raw(t)
    save_tensor(tmp_path / "ref.pt", t.clone())
    for i in range(2):  # the second file comes from the cached pickle and zip records
        save_values(tmp_path / f"v{i}.pt", dtype, shape, data)
        assert (tmp_path / f"v{i}.pt").read_bytes() == (tmp_path / "ref.pt").read_bytes()
    got = torch.load(tmp_path / "v1.pt", weights_only=True)
    assert got.dtype == dtype and got.shape == shape and raw(got) == data


def test_save_values_pickles_once_per_dtype_and_shape(tmp_path, monkeypatch):
    _values_template.cache_clear()
    pickled = []
    real = ptfile._records_before
    monkeypatch.setattr(ptfile, "_records_before", lambda t: pickled.append((t.dtype, tuple(t.shape))) or real(t))
    for i in range(3):
        save_values(tmp_path / f"a{i}.pt", torch.float32, (2, 3), bytes(24))
        save_values(tmp_path / f"b{i}.pt", torch.float32, (3, 2), bytes(24))
    assert pickled == [(torch.float32, (2, 3)), (torch.float32, (3, 2))]
    assert torch.equal(torch.load(tmp_path / "b2.pt", weights_only=True), torch.zeros(3, 2))


def test_save_values_refuses_a_wrong_length_and_falls_back_where_it_cannot_pickle(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="24 bytes"):
        save_values(tmp_path / "x.pt", torch.float32, (2, 3), bytes(23))
    _values_template.cache_clear()
    monkeypatch.setattr(ptfile, "_records_before", lambda t: (_ for _ in ()).throw(pickle.PicklingError("no")))
    values = torch.tensor([1.5, -2.0])
    save_values(tmp_path / "f.pt", torch.float32, (2,), raw(values))  # through torch.save
    assert torch.equal(torch.load(tmp_path / "f.pt", weights_only=True), values)
    _values_template.cache_clear()


def test_a_failed_template_is_not_kept(tmp_path, monkeypatch):
    """A template that could not be made (pickling failed, say under a fake-tensor mode) is
    made again for the next file of that dtype and shape, which then gets the fast path;
    both files hold the values."""
    _values_template.cache_clear()
    real = ptfile._records_before
    calls = []

    def flaky(t):
        calls.append(tuple(t.shape))
        if len(calls) == 1:
            raise pickle.PicklingError("not here")
        return real(t)

    monkeypatch.setattr(ptfile, "_records_before", flaky)
    fallback = []
    real_save_tensor = ptfile.save_tensor
    monkeypatch.setattr(ptfile, "save_tensor", lambda *a, **k: fallback.append(1) or real_save_tensor(*a, **k))
    first, second = torch.tensor([1.5, -2.0, 3.25]), torch.tensor([-0.5, 8.0, 0.125])
    try:
        save_values(tmp_path / "a.pt", torch.float32, (3,), raw(first))   # fails: torch.save's fallback
        save_values(tmp_path / "b.pt", torch.float32, (3,), raw(second))  # tried again: the template
        save_values(tmp_path / "c.pt", torch.float32, (3,), raw(first))   # from the cache
    finally:
        _values_template.cache_clear()
    # the failed template, torch.save's own pickle for a.pt, the template made for b.pt (kept for c.pt)
    assert calls == [(3,), (3,), (3,)] and fallback == [1]
    for name, values in (("a.pt", first), ("b.pt", second), ("c.pt", first)):
        assert torch.equal(torch.load(tmp_path / name, weights_only=True), values), name


@pytest.mark.parametrize("fallback", [False, True], ids=["pickle", "torch.save"])
@pytest.mark.parametrize("shape", [(2, 3), (0, 3)])
def test_save_values_ignores_the_callers_default_device(tmp_path, monkeypatch, shape, fallback):
    """A training script may make another device the default (``torch.set_default_device``,
    ``with torch.device(...)``); the exporter then runs under it in the training thread. The
    file still holds a CPU tensor with the values (the cached pickle is made from a CPU
    tensor, whichever thread and device context asks first; so is torch.save's tensor)."""
    values = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape) * 1.5 - 2
    if fallback:
        monkeypatch.setattr(ptfile, "_records_before", lambda t: (_ for _ in ()).throw(pickle.PicklingError("no")))
    _values_template.cache_clear()
    try:
        with torch.device("meta"):
            save_values(tmp_path / "m.pt", torch.float32, shape, raw(values))
        save_values(tmp_path / "c.pt", torch.float32, shape, raw(values))  # from the cache
    finally:
        _values_template.cache_clear()
    for name in ("m.pt", "c.pt"):
        got = torch.load(tmp_path / name, weights_only=True)
        assert got.device.type == "cpu" and got.shape == shape and torch.equal(got, values), name


def test_save_values_files_of_one_shape_with_other_values(tmp_path):
    """Files of one dtype and shape share the cached zip records; each still carries its own
    data CRC-32 (zipfile checks it against zlib) and equals save_tensor's file."""
    _values_template.cache_clear()
    for i in range(3):
        t = torch.randn(33, 5) * (i + 1)
        save_values(tmp_path / f"v{i}.pt", torch.float32, (33, 5), raw(t))
        save_tensor(tmp_path / f"r{i}.pt", t)
        assert (tmp_path / f"v{i}.pt").read_bytes() == (tmp_path / f"r{i}.pt").read_bytes()
        with zipfile.ZipFile(tmp_path / f"v{i}.pt") as z:
            assert z.testzip() is None
            assert z.getinfo("archive/data/0").CRC == zlib.crc32(raw(t))
        assert torch.equal(torch.load(tmp_path / f"v{i}.pt", weights_only=True), t)


# --- files of 1 MiB of data or more: written around the page cache (O_DIRECT) -------------
@pytest.mark.parametrize("numel", [1 << 18, (1 << 18) + 3, 3 * (1 << 18) + 1021])
def test_large_files_written_direct_are_the_buffered_bytes(tmp_path, monkeypatch, numel):
    """A file of >= 1 MiB of data goes through the thread's DirectFileWriter (aligned
    chunks, padded last chunk, then truncated to its length); its bytes equal the buffered
    write's, every CRC-32 matches and torch.load returns the values bit for bit."""
    torch.manual_seed(numel)
    t = torch.randn(numel)
    # a writer of its own: the thread's may carry a refusal from another file system
    monkeypatch.setattr(dio._THREAD, "writer", dio.DirectFileWriter(), raising=False)
    writer = thread_writer()
    before = writer.direct_files
    save_values(tmp_path / "direct.pt", t.dtype, tuple(t.shape), raw(t))
    save_tensor(tmp_path / "direct_t.pt", t)
    if writer.direct:  # the file system does O_DIRECT (ext4, xfs; not tmpfs)
        assert writer.direct_files == before + 2
    buffered = dio.DirectFileWriter()
    buffered.direct = False  # as where the file system refuses O_DIRECT
    monkeypatch.setattr(dio._THREAD, "writer", buffered, raising=False)
    save_values(tmp_path / "buffered.pt", t.dtype, tuple(t.shape), raw(t))
    direct = (tmp_path / "direct.pt").read_bytes()
    assert direct == (tmp_path / "buffered.pt").read_bytes() == (tmp_path / "direct_t.pt").read_bytes()
    with zipfile.ZipFile(tmp_path / "direct.pt") as zf:
        assert zf.testzip() is None
        assert zf.read("archive/data/0") == raw(t)
        info = zf.getinfo("archive/data/0")
    name_len, extra_len = struct.unpack("<HH", direct[info.header_offset + 26:info.header_offset + 30])
    assert (info.header_offset + 30 + name_len + extra_len) % 4096 == 0  # the data starts on a page
    assert raw(torch.load(tmp_path / "direct.pt", weights_only=True)) == raw(t)
    assert (tmp_path / "direct.pt").stat().st_mode & 0o777 == 0o640


def test_large_files_where_o_direct_is_refused_are_written_buffered(tmp_path, monkeypatch):
    """A file system that answers EINVAL to O_DIRECT (tmpfs): the same file, written the
    ordinary way, and later files go straight there."""
    import errno
    import os as _os

    real_open = _os.open
    refused = []

    def fake_open(path, flags, *args, **kwargs):
        if flags & getattr(_os, "O_DIRECT", 0):
            refused.append(path)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(dio.os, "open", fake_open)
    monkeypatch.setattr(dio._THREAD, "writer", dio.DirectFileWriter(), raising=False)
    t = torch.arange(float(1 << 18))
    for name in ("a.pt", "b.pt"):
        save_values(tmp_path / name, t.dtype, tuple(t.shape), raw(t))
        assert raw(torch.load(tmp_path / name, weights_only=True)) == raw(t)
    assert len(refused) == (1 if hasattr(_os, "O_DIRECT") else 0)  # tried once, then remembered
    assert thread_writer().direct is False


def test_each_thread_writes_large_files_with_its_own_buffer(tmp_path):
    """Threads writing large files at once (the payload writer, an exporter) do not share
    the aligned buffer: every file holds its own tensor."""
    import threading

    tensors = [torch.full((1 << 18,), float(i)) + torch.arange(float(1 << 18)) for i in range(4)]
    writers = []

    def work(i):
        writers.append(thread_writer())
        for k in range(3):
            save_values(tmp_path / f"{i}.{k}.pt", torch.float32, (1 << 18,), raw(tensors[i]))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len({id(w) for w in writers}) == 4
    for i in range(4):
        for k in range(3):
            assert torch.equal(torch.load(tmp_path / f"{i}.{k}.pt", weights_only=True), tensors[i])
