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

from dataclasses import dataclass
from typing import Optional

import torch

from msprobe.pytorch.payload import readable
from msprobe.pytorch.stats import OPAQUE_DTYPES

#: words (8 bytes) of one staging matrix; a tensor of more words gets a matrix of its own
CHUNK_WORDS = 1 << 18


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
    sub-byte dtypes, no storage freed under it) — exactly the tensors whose bytes
    :func:`msprobe.pytorch.payload.tensor_bytes` reads, less the empty ones."""
    return (t.numel() > 0 and readable(t) and not t.is_quantized and t.dtype not in OPAQUE_DTYPES
            and not t.is_nested)


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
