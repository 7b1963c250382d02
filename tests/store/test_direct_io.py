"""store/direct_io.py: files written around the page cache hold exactly the pieces' bytes,
whatever their lengths against the alignment and the buffer; a file system that refuses
O_DIRECT gets the same file written the ordinary way; real write errors propagate."""
from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import store.direct_io as dio
import store.payload_writer as payload_writer_mod
from store.direct_io import ALIGN, DirectFileWriter
from store.errors import StoreWriteError
from store.payload_writer import PayloadReader, PayloadWriter, payload_dir

needs_o_direct = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT on this platform")


def _pieces(rng, lengths):
    return [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in lengths]


CHUNK = 4 * ALIGN
LENGTHS = [
    [1], [ALIGN - 1], [ALIGN], [ALIGN + 1], [CHUNK - 1], [CHUNK], [CHUNK + 1],
    [3, ALIGN - 3], [CHUNK - 7, 7, 1], [2 * CHUNK + 123], [0, 5, 0, ALIGN * 3 + 17, 0],
    [1000] * 37,
]


@pytest.mark.parametrize("lengths", LENGTHS, ids=lambda ls: "+".join(map(str, ls)))
def test_file_holds_exactly_the_pieces(tmp_path, lengths):
    rng = np.random.default_rng(sum(lengths))
    pieces = _pieces(rng, lengths)
    w = DirectFileWriter(chunk_bytes=CHUNK, min_direct_bytes=0)
    path = tmp_path / "f.bin"
    w.write(path, pieces)
    data = path.read_bytes()
    assert len(data) == sum(lengths)
    assert data == b"".join(pieces)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    # where the file system takes O_DIRECT, it was used; elsewhere the writer gave up on it
    assert (w.direct_files == 1) == w.direct
    # an existing longer file is truncated, not left with a tail
    path.write_bytes(b"\xff" * (sum(lengths) + 3 * ALIGN))
    w.write(path, pieces)
    assert path.read_bytes() == b"".join(pieces)
    w.close()
    w.close()


def test_memoryview_and_bytearray_pieces(tmp_path):
    a = np.arange(5000, dtype=np.float32)
    pieces = [memoryview(a), bytearray(b"head"), memoryview(a.tobytes())[3:1003]]
    w = DirectFileWriter(chunk_bytes=CHUNK, min_direct_bytes=0)
    w.write(tmp_path / "g.bin", pieces)
    assert (tmp_path / "g.bin").read_bytes() == a.tobytes() + b"head" + a.tobytes()[3:1003]


@pytest.mark.parametrize("min_direct", [0, 1 << 30], ids=["direct", "buffered"])
def test_pieces_from_a_generator(tmp_path, min_direct):
    """Pieces may come from any iterable, read once (the writer counts them first)."""
    rng = np.random.default_rng(5)
    pieces = _pieces(rng, [ALIGN + 3, 17, CHUNK])
    w = DirectFileWriter(chunk_bytes=CHUNK, min_direct_bytes=min_direct)
    w.write(tmp_path / "gen.bin", (p for p in pieces))
    assert (tmp_path / "gen.bin").read_bytes() == b"".join(pieces)
    w.close()


def test_small_files_are_written_buffered(tmp_path, monkeypatch):
    flags = []
    real_open = os.open
    monkeypatch.setattr(dio.os, "open", lambda p, f, *a: flags.append(f) or real_open(p, f, *a))
    w = DirectFileWriter(chunk_bytes=CHUNK, min_direct_bytes=100)
    w.write(tmp_path / "s.bin", [b"x" * 99])
    assert (tmp_path / "s.bin").read_bytes() == b"x" * 99
    assert w.direct_files == 0 and not any(f & getattr(os, "O_DIRECT", 0) for f in flags)


@needs_o_direct
@pytest.mark.parametrize("err", [errno.EINVAL, errno.EOPNOTSUPP])
def test_refused_o_direct_falls_back_once_and_for_all(tmp_path, monkeypatch, err):
    real_open = os.open
    tries = []

    def refusing_open(path, flags, *args):
        if flags & os.O_DIRECT:
            tries.append(path)
            raise OSError(err, "not on this file system")
        return real_open(path, flags, *args)

    monkeypatch.setattr(dio.os, "open", refusing_open)
    w = DirectFileWriter(chunk_bytes=CHUNK, min_direct_bytes=0)
    pieces = _pieces(np.random.default_rng(1), [CHUNK + 5, 77])
    w.write(tmp_path / "a", pieces)
    w.write(tmp_path / "b", pieces)
    assert (tmp_path / "a").read_bytes() == b"".join(pieces) == (tmp_path / "b").read_bytes()
    assert not w.direct and w.direct_files == 0 and len(tries) == 1  # not tried again


@needs_o_direct
def test_refusal_in_the_middle_rewrites_the_file_from_the_start(tmp_path, monkeypatch):
    real_write = os.write
    calls = []

    def write_then_refuse(fd, data):
        calls.append(len(data))
        if len(calls) == 2:
            raise OSError(errno.EINVAL, "refused after one chunk")
        return real_write(fd, data)

    monkeypatch.setattr(dio.os, "write", write_then_refuse)
    w = DirectFileWriter(chunk_bytes=CHUNK, min_direct_bytes=0)
    pieces = _pieces(np.random.default_rng(2), [3 * CHUNK + 11])
    w.write(tmp_path / "m", pieces)
    assert (tmp_path / "m").read_bytes() == b"".join(pieces) and not w.direct


@needs_o_direct
def test_other_write_errors_propagate(tmp_path, monkeypatch):
    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dio.os, "write", full)
    w = DirectFileWriter(chunk_bytes=CHUNK, min_direct_bytes=0)
    with pytest.raises(OSError) as info:
        w.write(tmp_path / "n", [b"y" * 10])
    assert info.value.errno == errno.ENOSPC and w.direct  # not mistaken for a refusal


@needs_o_direct
def test_short_unaligned_write_is_a_refusal(tmp_path, monkeypatch):
    real_write = os.write
    monkeypatch.setattr(dio.os, "write", lambda fd, data: real_write(fd, data[:100]) if len(data) > 100 else real_write(fd, data))
    w = DirectFileWriter(chunk_bytes=CHUNK, min_direct_bytes=0)
    pieces = _pieces(np.random.default_rng(3), [CHUNK])
    monkeypatch.setattr(dio, "write_buffered", lambda path, ps: _plain(path, ps))
    w.write(tmp_path / "u", pieces)
    assert (tmp_path / "u").read_bytes() == b"".join(pieces) and not w.direct


def _plain(path, pieces):
    with open(path, "wb") as fh:
        for p in pieces:
            fh.write(p)


@pytest.mark.parametrize("kw", [{"chunk_bytes": 0}, {"chunk_bytes": ALIGN + 1}, {"chunk_bytes": -ALIGN},
                                {"min_direct_bytes": -1}])
def test_bad_arguments(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        DirectFileWriter(**kw)


def test_payload_shards_written_direct_read_back_by_safetensors(tmp_path):
    """Shards large enough for O_DIRECT: the reader and the safetensors library read back
    every tensor's values (float64 sums over them checked against numpy's own)."""
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(n).astype(np.float32) for n in (300_000, 1, 4097, 250_001)]
    with PayloadWriter(tmp_path, rank=0, shard_bytes=1 << 30) as w:
        refs = [w.put(a.tobytes(), "torch.float32", a.shape) for a in arrays]
        files = w._files
    shards = sorted(payload_dir(tmp_path).iterdir())
    assert len(shards) == 1
    assert (files.direct_files == 1) == files.direct  # direct where the file system allows it
    loaded = load_file(str(shards[0]))
    r = PayloadReader(tmp_path)
    for a, ref in zip(arrays, refs):
        back = np.frombuffer(r.read(ref).data, np.float32)
        assert np.array_equal(back, a) and np.array_equal(loaded[ref.split(":")[1]], a)
        assert back.astype(np.float64).sum() == a.astype(np.float64).sum()
    assert os.path.getsize(shards[0]) == 8 + int.from_bytes(shards[0].read_bytes()[:8], "little") + sum(a.nbytes for a in arrays)


class _FullDisk:
    """``os`` for store.direct_io whose ``write`` fails with ENOSPC from the ``n``-th call on
    (other modules keep the real ``os.write``)."""

    def __init__(self, n: int) -> None:
        self.calls = 0
        self.n = n

    def __getattr__(self, name):
        return getattr(os, name)

    def write(self, fd, data):
        self.calls += 1
        if self.calls >= self.n:
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, data)


@needs_o_direct
@pytest.mark.parametrize("lengths,n", [([CHUNK + 10], 1), ([CHUNK + 10], 2), ([ALIGN + 1], 1)],
                         ids=["first-chunk", "after-a-chunk", "last-chunk-only"])
def test_failed_padded_write_leaves_the_buffer_closable(tmp_path, monkeypatch, lengths, n):
    """A write error in a full chunk or the padded last one, its exception kept (PayloadWriter keeps the
    shard thread's error, traceback and all): close() still releases the buffer instead of
    failing with BufferError, and a later write works."""
    disk = _FullDisk(n)
    monkeypatch.setattr(dio, "os", disk)
    w = DirectFileWriter(chunk_bytes=CHUNK, min_direct_bytes=0)
    pieces = _pieces(np.random.default_rng(5), lengths)
    with pytest.raises(OSError) as info:
        w.write(tmp_path / "f", pieces)
    assert info.value.errno == errno.ENOSPC and disk.calls == n and w.direct  # info keeps the error
    w.close()
    monkeypatch.setattr(dio, "os", os)
    w.write(tmp_path / "g", pieces)
    assert (tmp_path / "g").read_bytes() == b"".join(pieces)
    w.close()


@needs_o_direct
def test_payload_writer_with_full_disk_closes_with_the_write_error(tmp_path, monkeypatch):
    """The shard thread's O_DIRECT write fails (disk full): close() reports that error as a
    StoreWriteError (not the buffer's BufferError) and still removes the staging directory."""
    monkeypatch.setattr(dio, "os", _FullDisk(1))
    stage = (lambda path, p: Path(path).write_bytes(bytes(p.data)), "raw")
    w = PayloadWriter(tmp_path, rank=0, stage=stage)
    w.put(b"\x01" * (2 << 20), "torch.uint8", (2 << 20,))
    with pytest.raises(StoreWriteError, match="No space left"):
        w.flush()
    with pytest.raises(StoreWriteError, match="No space left"):
        w.close()
    assert not (tmp_path / ".msprobe" / "stage").exists() or list((tmp_path / ".msprobe" / "stage").iterdir()) == []
    assert not payload_dir(tmp_path).exists() or list(payload_dir(tmp_path).iterdir()) == []


def _aligned(rng, n, misalign=0):
    """``n`` random bytes starting at a page-aligned address (plus ``misalign``), as a
    read-only memoryview of a bytes object."""
    raw = rng.integers(0, 256, n + 2 * ALIGN, dtype=np.uint8).tobytes()
    address = np.frombuffer(raw, np.uint8).ctypes.data
    start = (-address) % ALIGN + misalign
    return memoryview(raw)[start:start + n]


# pieces: (length, page-aligned address?)
ZERO_COPY = [
    [(ALIGN, True)],
    [(3 * ALIGN + 5, True)],
    [(ALIGN, True), (2 * ALIGN, True), (7, False)],  # a header page, then payloads
    [(100, False), (2 * ALIGN, True)],                # offset not aligned: copied
    [(ALIGN - 100, False), (100, False), (5 * CHUNK + ALIGN, True), (33, False)],
    [(2 * ALIGN, True), (ALIGN, False)],              # second piece misaligned in memory: copied
    [(ALIGN - 1, True)],                              # less than a page: copied
]


@needs_o_direct
@pytest.mark.parametrize("spec", ZERO_COPY, ids=lambda s: "+".join(f"{n}{'a' if a else 'u'}" for n, a in s))
def test_page_aligned_pieces_are_written_without_the_copy(tmp_path, spec):
    """Whole pages of a page-aligned piece at a page-aligned file offset go to the device
    from the caller's memory (counted in zero_copy_bytes), whatever precedes or follows them;
    the file holds exactly the pieces either way."""
    rng = np.random.default_rng(len(spec))
    pieces = [_aligned(rng, n, 0 if a else 1) for n, a in spec]
    w = DirectFileWriter(chunk_bytes=CHUNK, min_direct_bytes=0)
    path = tmp_path / "z.bin"
    w.write(path, pieces)
    assert path.read_bytes() == b"".join(bytes(p) for p in pieces)
    if not w.direct:
        pytest.skip("this file system refuses O_DIRECT")
    expected, offset = 0, 0
    for n, a in spec:
        if a and n >= ALIGN and offset % ALIGN == 0:
            expected += n - n % ALIGN
        offset += n
    assert w.zero_copy_bytes == expected


def test_page_aligned_payloads_are_written_into_shards_without_the_copy(tmp_path, monkeypatch):
    """Page-aligned, whole-page payloads (the aligned snapshots of large tensors) put between
    others: the shard header is padded to whole pages, they come first in the data, their
    bytes go to the shard without the copy where O_DIRECT works, and the reader and the
    safetensors library return every payload's values. The header itself goes without the
    copy too when its bytes happen to start on a page (it is written at offset 0): the test
    looks at the header the writer made to know which."""
    heads = []
    encode = payload_writer_mod._encode_shard

    def spy(items):
        head, pieces = encode(items)
        heads.append(head)  # also keeps it (and its address) alive
        return head, pieces

    monkeypatch.setattr(payload_writer_mod, "_encode_shard", spy)
    rng = np.random.default_rng(9)
    arrays = [rng.standard_normal(n).astype(np.float32) for n in (1000, 1 << 18, 4097, 3 << 17, 5)]
    datas = []
    for a in arrays:
        if a.nbytes % ALIGN == 0:
            datas.append(_aligned_copy(a.tobytes()))
        else:
            datas.append(a.tobytes())
    with PayloadWriter(tmp_path, rank=0, shard_bytes=1 << 30) as w:
        refs = [w.put(d, "torch.float32", a.shape) for d, a in zip(datas, arrays)]
        files = w._files
    (shard,) = sorted(payload_dir(tmp_path).iterdir())
    raw = shard.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    assert (8 + length) % ALIGN == 0 and raw[8:8 + length].rstrip(b" ").endswith(b"}")
    header = json.loads(raw[8:8 + length])
    starts = {ref.split(":")[1]: header[ref.split(":")[1]]["data_offsets"][0] for ref in refs}
    aligned_keys = [ref.split(":")[1] for ref, a in zip(refs, arrays) if a.nbytes % ALIGN == 0]
    assert sorted(starts[k] for k in aligned_keys) == [0, arrays[1].nbytes]  # first, in put order
    loaded = load_file(str(shard))
    r = PayloadReader(tmp_path)
    for a, ref in zip(arrays, refs):
        assert np.array_equal(np.frombuffer(r.read(ref).data, np.float32), a)
        assert np.array_equal(loaded[ref.split(":")[1]], a)
    if files.direct:
        (head,) = heads
        head_on_page = np.frombuffer(head, np.uint8).__array_interface__["data"][0] % ALIGN == 0
        head_pages = len(head) - len(head) % ALIGN if head_on_page else 0
        assert files.zero_copy_bytes == arrays[1].nbytes + arrays[3].nbytes + head_pages


def _aligned_copy(data: bytes) -> memoryview:
    """``data`` in a fresh bytes object at a page-aligned address, as a read-only memoryview
    (what ``fused_stats.snapshot_at(..., align=4096)`` returns; filled with ctypes here,
    before anyone else sees the object)."""
    import ctypes

    buf = bytes(len(data) + ALIGN)
    address = np.frombuffer(buf, np.uint8).__array_interface__["data"][0]
    start = (-address) % ALIGN
    ctypes.memmove(address + start, data, len(data))
    return memoryview(buf)[start:start + len(data)]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_does_not_write_into_the_parents_buffer(tmp_path):
    """A process forked after a writer made its aligned buffer (the per-thread writer of
    msprobe.pytorch.ptfile survives fork in the forking thread) copies its pieces into a
    buffer of its own: a child's write leaves the parent's buffer, and so a file the parent
    writes at the same time, untouched (an anonymous ``mmap`` is MAP_SHARED by default: two
    processes writing at once wrote each other's bytes, files with a bad CRC-32)."""
    w = DirectFileWriter(chunk_bytes=CHUNK, min_direct_bytes=0)
    w.write(tmp_path / "parent.bin", [b"\x11" * (3 * ALIGN + 5)])
    if w._array is None:
        pytest.skip("this file system refuses O_DIRECT: no aligned buffer")
    before = bytes(w._array[:4 * ALIGN])
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            w.write(tmp_path / "child.bin", [b"\xab" * (3 * ALIGN + 5)])
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (tmp_path / "child.bin").read_bytes() == b"\xab" * (3 * ALIGN + 5)
    assert bytes(w._array[:4 * ALIGN]) == before  # the child's bytes did not reach the parent
    w.close()


@needs_o_direct
def test_a_refusal_is_remembered_per_file_system(tmp_path, monkeypatch):
    """One writer serves every dump path of its thread: a file system that refuses O_DIRECT
    (tmpfs, say) gets buffered files without being asked again, while files on another file
    system still go around the page cache."""
    refusing, accepting = tmp_path / "tmpfs", tmp_path / "disk"
    refusing.mkdir()
    accepting.mkdir()
    devices = {str(refusing): 101, str(accepting): 202}
    monkeypatch.setattr(dio, "_device", lambda path: devices[os.path.dirname(os.path.abspath(path))])
    real_open = os.open
    tries = []

    def open_(path, flags, *args):
        if flags & os.O_DIRECT:
            tries.append(os.path.dirname(path))
            if os.path.dirname(path) == str(refusing):
                raise OSError(errno.EINVAL, "not on this file system")
        return real_open(path, flags, *args)

    monkeypatch.setattr(dio.os, "open", open_)
    w = DirectFileWriter(chunk_bytes=CHUNK, min_direct_bytes=0)
    pieces = _pieces(np.random.default_rng(7), [CHUNK + 9])
    for name in ("a", "b"):
        w.write(refusing / name, pieces)
        w.write(accepting / name, pieces)
    for d in (refusing, accepting):
        for name in ("a", "b"):
            assert (d / name).read_bytes() == b"".join(pieces)
    assert tries == [str(refusing), str(accepting), str(accepting)]  # the refusing one asked once
    assert w.direct_files == 2 and not w.direct
    w.direct = True  # a caller's reset forgets the refusals
    assert w.direct
