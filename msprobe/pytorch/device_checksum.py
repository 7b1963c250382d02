"""summary_mode xor on the device: the 64-bit XOR fold of a tensor's C-order bytes
(:func:`msprobe.core.checksum.xor64`) computed with tensor operations, gathered at the flush
point with the device statistics (:mod:`msprobe.pytorch.deferred`), without a host
synchronisation per tensor.

At record time a tensor's bytes, in its own dtype and C order, are copied into a zeroed row
of a staging matrix of its device (one kernel). A tensor of ``w`` 8-byte words (the last one
zero-padded, as :func:`~msprobe.core.checksum.xor64` pads it) goes to the matrix of rows of
``P`` words, ``P`` the power of two at least ``w``; zero words do not change an XOR. At the
flush point (or when a matrix is full) a matrix of ``k`` rows is folded in ``log2(P)``
kernels, each XOR-ing the two halves of every row at once, into ``k`` int64 words. Such a
matrix holds :data:`CHUNK_WORDS` words (2 MiB; a larger tensor gets a matrix of its own),
so at most one matrix per padded length and device is open: a memory budget of about
``19 x 2 MiB`` per device plus 8 bytes per pending tensor.

The host receives each word as two int32 halves (exact in float64, the gathered layout).
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Optional

import torch

from msprobe.pytorch.payload import readable
from msprobe.pytorch.stats import OPAQUE_DTYPES

#: words (8 bytes) of one staging matrix; a tensor of more words gets a matrix of its own
CHUNK_WORDS = 1 << 18
#: tensors of more bytes keep the host checksum (one copy to the host each): their padded
#: rows and the CRC-32's lookups (32 bytes per 4-byte word, transient) would cost device
#: memory out of proportion, and their own transfer dwarfs a launch
MAX_BYTES = 16 << 20

_LOCK = threading.Lock()  # the tables' caches below grow under it


@dataclass(frozen=True, slots=True)
class XorRow:
    """A tensor staged in an :class:`XorBatch`: row ``index`` of ``chunk``."""

    chunk: "_XorChunk"
    index: int


class _XorChunk:
    """Rows of ``width`` int64 words (zeroed), filled from the first; ``result`` (``used``
    int64 words on the device) once folded."""

    __slots__ = ("rows", "width", "used", "result", "_typed")

    def __init__(self, device: torch.device, width: int, capacity: int) -> None:
        self.rows = torch.zeros((capacity, width), dtype=torch.int64, device=device)
        self.width = width
        self.used = 0
        self.result: Optional[torch.Tensor] = None
        self._typed: dict[torch.dtype, torch.Tensor] = {}  # the rows' memory as a 1-d tensor of a dtype

    @property
    def full(self) -> bool:
        return self.used == self.rows.shape[0]

    def put(self, x: torch.Tensor, nbytes: int) -> XorRow:
        """Copy the C-order bytes of ``x`` (``nbytes`` of them) into the next row."""
        typed = self._typed.get(x.dtype)
        if typed is None:  # (a row holds whole elements: its width is at least one element)
            typed = self._typed[x.dtype] = self.rows.view(-1).view(torch.uint8).view(x.dtype)
        shape = tuple(x.shape)
        stride, step = [], 1
        for size in reversed(shape):
            stride.append(step)
            step *= size
        start = self.used * self.width * 8 // x.element_size()
        typed.as_strided(shape, tuple(reversed(stride)), start + typed.storage_offset()).copy_(x)
        self.used += 1
        return XorRow(self, self.used - 1)

    def fold(self) -> None:
        """XOR the words of every row into one (``log2(width)`` kernels); frees the rows."""
        if self.result is None:
            x = self.rows[:self.used]
            width = self.width
            while width > 1:
                width //= 2
                x = torch.bitwise_xor(x[:, :width], x[:, width:])
            self.result = x.reshape(-1)
            self.rows = None
            self._typed.clear()


def stageable(t: torch.Tensor) -> bool:
    """Whether :meth:`XorBatch.stage` takes ``t``: a non-empty strided tensor whose bytes a
    copy kernel reads (not quantized, not one of PyTorch's bit-packed or unsigned
    sub-byte dtypes, no storage freed under it) of at most :data:`MAX_BYTES` bytes: the
    tensors whose bytes :func:`msprobe.pytorch.payload.tensor_bytes` reads, less the empty
    and the large ones."""
    return (t.dtype not in OPAQUE_DTYPES and not t.is_quantized and not t.is_nested
            and 0 < t.numel() * t.element_size() <= MAX_BYTES and readable(t))


class XorBatch:
    """Stages tensors for their XOR folds (module docstring); one per recorder.

    Args:
        chunk_words: words (8 bytes) of one staging matrix.
    """

    def __init__(self, chunk_words: int = CHUNK_WORDS) -> None:
        if chunk_words < 1:
            raise ValueError(f"chunk_words must be at least 1, got {chunk_words}")
        self.chunk_words = chunk_words
        self._open: dict[tuple, _XorChunk] = {}

    def stage(self, t: torch.Tensor) -> XorRow:
        """Copy the bytes of ``t`` (:func:`stageable`) into a staging row; queued kernels
        only. A full matrix is folded at once."""
        with torch.no_grad():
            x = t.resolve_conj().resolve_neg() if (t.is_conj() or t.is_neg()) else t
            nbytes = x.numel() * x.element_size()
            words = -(-nbytes // 8)
            width = 1 << (words - 1).bit_length()
            key = (x.device, width)
            chunk = self._open.get(key)
            if chunk is None:
                chunk = self._open[key] = _XorChunk(x.device, width, max(1, self.chunk_words // width))
            row = chunk.put(x, nbytes)
            if chunk.full:
                chunk.fold()
                del self._open[key]
            return row

    def fold_all(self) -> None:
        """Fold every matrix still open."""
        open_, self._open = self._open, {}
        for chunk in open_.values():
            chunk.fold()


def xor_hex(lo: float, hi: float) -> str:
    """dump.json's ``md5`` text (:func:`msprobe.core.checksum.xor64_hex`) of the word whose
    low and high 32-bit halves, read as signed int32, are ``lo`` and ``hi``."""
    return "0x%016x" % ((int(lo) & 0xFFFFFFFF) | ((int(hi) & 0xFFFFFFFF) << 32))


# --------------------------------------------------------------------------------------------
# CRC-32 (summary_mode md5) on the device
# --------------------------------------------------------------------------------------------
#
# The CRC-32 of zlib (reflected polynomial 0xEDB88320, initial value and final XOR
# 0xFFFFFFFF) is affine in the message: crc32(M) = r(M) ^ crc32(n zero bytes), n = len(M),
# where r is the CRC without initial value and final XOR, linear over GF(2). r has two
# properties used here: r(A || B) = shift_|B|(r(A)) ^ r(B), shift_k being the state change
# of k zero bytes (a 32x32 matrix over GF(2)), and leading zero bytes leave r unchanged
# (r(0...0 || M) = r(M)). So a tensor's bytes are placed at the *end* of a zeroed row of P
# 4-byte words (P a power of two), r of every word is read from four 256-entry tables
# (slicing by 4), and tree steps combine RADIX neighbouring blocks of L bytes,
# XOR over i of shift_{(RADIX-1-i) L}(block i), each shift a lookup of the block's four bytes
# in four tables of that step: 5 + (6 + log2 RADIX) per step, log2(P) / log2(RADIX) steps
# (rounded up), per matrix of rows whatever the number of rows. The host adds
# crc32(n zero bytes) (:func:`crc32_of_zeros`, O(log n) matrix products) at the flush.

_POLY = 0xEDB88320


def _byte_table() -> list[int]:
    table = []
    for b in range(256):
        s = b
        for _ in range(8):
            s = (s >> 1) ^ _POLY if s & 1 else s >> 1
        table.append(s)
    return table


_T = _byte_table()


def _apply(cols: list[int], v: int) -> int:
    """The 32x32 GF(2) matrix with columns ``cols`` times the 32-bit vector ``v``."""
    out, j = 0, 0
    while v:
        if v & 1:
            out ^= cols[j]
        v >>= 1
        j += 1
    return out


#: shift by 2**i zero bytes, as matrix columns (index i)
_SHIFT_POW2: list[list[int]] = [[_T[(1 << j) & 0xFF] ^ ((1 << j) >> 8) for j in range(32)]]


def _shift_pow2(i: int) -> list[int]:
    if len(_SHIFT_POW2) <= i:
        with _LOCK:
            while len(_SHIFT_POW2) <= i:
                m = _SHIFT_POW2[-1]
                _SHIFT_POW2.append([_apply(m, c) for c in m])
    return _SHIFT_POW2[i]


def shift_zeros(state: int, n: int) -> int:
    """The CRC state ``state`` after ``n`` zero bytes (without initial value or final XOR)."""
    i = 0
    while n:
        if n & 1:
            state = _apply(_shift_pow2(i), state)
        n >>= 1
        i += 1
    return state


@functools.lru_cache(maxsize=4096)
def crc32_of_zeros(n: int) -> int:
    """``zlib.crc32(bytes(n))`` in O(log n) matrix products."""
    return shift_zeros(0xFFFFFFFF, n) ^ 0xFFFFFFFF


def _slice_tables(shift_bytes: int) -> list[int]:
    """Four 256-entry tables: entry ``256 j + v`` is shift_{shift_bytes}(v << 8j)."""
    out = []
    for j in range(4):
        cols = [shift_zeros(1 << (8 * j + bit), shift_bytes) for bit in range(8)]
        table = [0] * 256
        for v in range(1, 256):
            low = v & -v
            table[v] = table[v ^ low] ^ cols[low.bit_length() - 1]
        out.extend(table)
    return out


#: blocks combined per tree step (a power of two): a step costs ``6 + log2(RADIX)`` kernels
#: and replaces ``log2(RADIX)`` levels of pairs; its lookups hold 4 * RADIX values per block
RADIX = 16

#: r of one word b0 b1 b2 b3: shift_3(T[b0]) ^ shift_2(T[b1]) ^ shift_1(T[b2]) ^ T[b3],
#: entry 256 j + v for byte j = v
_WORD_TABLE = [shift_zeros(_T[v], 3 - j) for j in range(4) for v in range(256)]
_DEVICE_TABLES: dict[tuple, torch.Tensor] = {}


def _step_table(block: int, radix: int) -> list[int]:
    """The lookups of one tree step over ``radix`` blocks of ``block`` bytes: entry
    ``(4 i + j) 256 + v`` is shift_{(radix - 1 - i) block}(v << 8j) (block ``i``'s byte
    ``j``; the last block is not shifted)."""
    out = []
    for i in range(radix):
        out.extend(_slice_tables((radix - 1 - i) * block))
    return out


def _on(device: torch.device, key: tuple, make) -> torch.Tensor:
    """A constant int64 tensor ``make()`` on ``device``, made once per device and ``key``
    (on an accelerator copied from pinned memory without waiting)."""
    have = _DEVICE_TABLES.get((device, key))
    if have is None:
        host = torch.tensor(make(), dtype=torch.int64)
        if device.type == "cuda":
            host = host.pin_memory()
        have = host if device.type == "cpu" else host.to(device, non_blocking=True)
        with _LOCK:
            have = _DEVICE_TABLES.setdefault((device, key), have)
    return have


def _offsets(device: torch.device, radix: int) -> torch.Tensor:
    """``(radix, 4)``: the table offset ``(4 i + j) 256`` of block i's byte j."""
    return _on(device, ("offsets", radix), lambda: [[(4 * i + j) * 256 for j in range(4)] for i in range(radix)])


def _shifts(device: torch.device) -> torch.Tensor:
    return _on(device, ("lanes",), lambda: [0, 8, 16, 24])


@dataclass(frozen=True, slots=True)
class CrcRow:
    """A tensor staged in a :class:`CrcBatch`: row ``index`` of ``chunk``, ``nbytes`` long,
    its values as ``dtype`` (:func:`crc_dtype`)."""

    chunk: "_CrcChunk"
    index: int
    nbytes: int
    dtype: torch.dtype

    def values(self) -> torch.Tensor:
        """The staged bytes (1-d uint8, ``nbytes`` long, on the device; a view of the
        row): the tensor's values in C order as ``dtype``, as they were when staged. Only
        while the rows are kept (:attr:`CrcBatch.keep_rows`)."""
        rows = self.chunk.rows
        if rows is None:
            raise RuntimeError("the staging rows of this CRC-32 were freed (CrcBatch.keep_rows is False)")
        return rows[self.index, rows.shape[1] - self.nbytes:]


def crc_dtype(t: torch.Tensor) -> Optional[torch.dtype]:
    """The dtype whose C-order bytes the CRC-32 covers (:func:`msprobe.pytorch.stats.crc32_hex`:
    bfloat16 and float8 as float32), or None when :class:`CrcBatch` does not take ``t``
    (quantized, opaque and other dtypes numpy lacks, no readable data, empty, more than
    half of :data:`MAX_BYTES`: bfloat16 doubles as float32)."""
    from msprobe.pytorch.stats import _FLOAT8, _NUMPY_OF

    if (t.dtype in OPAQUE_DTYPES or t.is_quantized or t.is_nested
            or not 0 < t.numel() * t.element_size() <= MAX_BYTES // 2 or not readable(t)):
        return None
    if t.dtype == torch.bfloat16 or t.dtype in _FLOAT8:
        return torch.float32
    return t.dtype if t.dtype in _NUMPY_OF else None


class _CrcChunk:
    """Zeroed rows of ``width`` 4-byte words; a tensor's bytes end where its row ends.
    ``result``: r of every row (int64 values below 2**32) once reduced; ``keep``: the rows
    stay after the reduction (:attr:`CrcBatch.keep_rows`)."""

    __slots__ = ("rows", "width", "used", "result", "_typed", "keep")

    def __init__(self, device: torch.device, width: int, capacity: int, keep: bool = False) -> None:
        self.rows = torch.zeros((capacity, width * 4), dtype=torch.uint8, device=device)
        self.keep = keep
        self.width = width
        self.used = 0
        self.result: Optional[torch.Tensor] = None
        self._typed: dict[torch.dtype, torch.Tensor] = {}

    @property
    def full(self) -> bool:
        return self.used == self.rows.shape[0]

    def put(self, x: torch.Tensor, dtype: torch.dtype) -> CrcRow:
        typed = self._typed.get(dtype)
        if typed is None:
            typed = self._typed[dtype] = self.rows.view(-1).view(dtype)
        shape = tuple(x.shape)
        stride, step = [], 1
        for size in reversed(shape):
            stride.append(step)
            step *= size
        size = typed.element_size()
        end = (self.used + 1) * self.width * 4 // size
        typed.as_strided(shape, tuple(reversed(stride)), end - step).copy_(x)
        self.used += 1
        return CrcRow(self, self.used - 1, step * size, dtype)

    def reduce(self) -> None:
        """r of every row (module notes above): the words' r by table lookups, then tree
        steps of :data:`RADIX` blocks; frees the rows unless :attr:`keep`."""
        if self.result is not None:
            return
        k, m = self.used, self.width
        device = self.rows.device
        lanes = _shifts(device)
        v = _on(device, ("word",), lambda: _WORD_TABLE)[self.rows[:k].view(k, m, 4).to(torch.int64)
                                                        + _offsets(device, 1)[0]]
        s = torch.bitwise_xor(v[..., :2], v[..., 2:])
        s = torch.bitwise_xor(s[..., 0], s[..., 1])
        block = 4  # bytes of the blocks whose r s holds
        while m > 1:
            radix = min(RADIX, m)
            m //= radix
            idx = torch.bitwise_and(s.view(k, m, radix, 1) >> lanes, 0xFF) + _offsets(device, radix)
            v = _on(device, ("step", block, radix), lambda: _step_table(block, radix))[idx].view(k, m, 4 * radix)
            n = 4 * radix
            while n > 1:
                n //= 2
                v = torch.bitwise_xor(v[..., :n], v[..., n:])
            s = v.view(k, m)
            block *= radix
        self.result = s.reshape(-1)
        if not self.keep:
            self.rows = None
        self._typed.clear()


class CrcBatch:
    """Stages tensors for their CRC-32 (summary_mode md5) on the device; one per recorder.

    Args:
        chunk_words: 4-byte words of one staging matrix (a tensor of more words gets a
            matrix of its own).

    Attributes:
        keep_rows: the staging matrices made from now on keep their rows after their
            reduction (``tensor.bench_path``: a selected call's tensor files are written
            from them, :meth:`CrcRow.values`); they are freed with the last
            :class:`CrcRow` referring to them.
        kept_bytes: bytes of the matrices made with ``keep_rows`` since the last
            :meth:`reduce_all` (the memory they may hold).
    """

    def __init__(self, chunk_words: int = CHUNK_WORDS * 2) -> None:
        if chunk_words < 4:
            raise ValueError(f"chunk_words must be at least 4, got {chunk_words}")
        self.chunk_words = chunk_words
        self._open: dict[tuple, _CrcChunk] = {}
        self.keep_rows = False
        self.kept_bytes = 0

    def stage(self, t: torch.Tensor, dtype: torch.dtype) -> CrcRow:
        """Copy the C-order bytes of ``t`` as ``dtype`` (:func:`crc_dtype`) into a staging
        row; queued kernels only. A full matrix is reduced at once."""
        with torch.no_grad():
            x = t.resolve_conj().resolve_neg() if (t.is_conj() or t.is_neg()) else t
            nbytes = x.numel() * dtype.itemsize
            words = max(4, -(-nbytes // 4))
            width = 1 << (words - 1).bit_length()
            key = (x.device, width)
            chunk = self._open.get(key)
            if chunk is None:
                capacity = max(1, self.chunk_words // width)
                chunk = self._open[key] = _CrcChunk(x.device, width, capacity, self.keep_rows)
                if self.keep_rows:
                    self.kept_bytes += capacity * width * 4
            row = chunk.put(x, dtype)
            if chunk.full:
                chunk.reduce()
                del self._open[key]
            return row

    def reduce_all(self) -> None:
        """Reduce every matrix still open (queued kernels only); resets :attr:`kept_bytes`."""
        open_, self._open = self._open, {}
        self.kept_bytes = 0
        for chunk in open_.values():
            chunk.reduce()


def crc_hex(raw_lo: float, nbytes: int) -> str:
    """dump.json's CRC-32 text of a message of ``nbytes`` bytes whose r (above) is
    ``raw_lo`` (the low int32 half of the gathered word)."""
    return format((int(raw_lo) & 0xFFFFFFFF) ^ crc32_of_zeros(nbytes), "08x")
