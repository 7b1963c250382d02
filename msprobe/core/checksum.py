"""Checksums of dump.json's ``md5`` field: CRC-32 (summary_mode md5, spec 3.5: the
zlib/PNG polynomial) and the 64-bit XOR fold (summary_mode xor, :func:`xor64_hex`).

:func:`crc32` is ``isal.isal_zlib.crc32`` (Intel ISA-L, about 4x faster than zlib on
x86-64: ~9 GB/s against ~2 GB/s on one core) when the ``isal`` package is installed, else
the standard library's ``zlib.crc32``; both return the same value for the same bytes
(tests/core/test_checksum.py). Both release the GIL on large buffers.

:data:`C_CRC32` is the address of ISA-L's C function ``crc32_gzip_refl`` (``uint32_t
crc(uint32_t init, const unsigned char *buf, uint64_t len)``, zlib chaining semantics), for
C code that computes the CRC-32 in the same pass as other work
(``msprobe._native.fused_stats.reduce_crc_at``), or None.
"""
from __future__ import annotations

import ctypes
import random
import zlib
from typing import Optional

import numpy as np

try:  # pragma: no cover - depends on the environment
    from isal import isal_zlib as _isal_zlib
    from isal.isal_zlib import crc32 as _fast_crc32
except ImportError:  # pragma: no cover
    _isal_zlib = None
    _fast_crc32 = None

#: ``crc32(data, value=0) -> int``: CRC-32 of a bytes-like object, continuing from ``value``
crc32 = _fast_crc32 if _fast_crc32 is not None else zlib.crc32

#: True when the ISA-L implementation is in use
ACCELERATED = _fast_crc32 is not None


def _c_crc32_address() -> Optional[int]:
    """The address of ISA-L's ``crc32_gzip_refl`` in the ``isal`` extension module, or None
    when ``isal`` is missing, its module does not export the symbol, or the function fails a
    self-test against ``zlib.crc32`` (384 pseudo-random bytes, whole and chained)."""
    if _isal_zlib is None:
        return None
    try:
        fn = ctypes.CDLL(_isal_zlib.__file__).crc32_gzip_refl  # the module stays imported: never unloaded
    except (OSError, AttributeError, TypeError):
        return None
    fn.restype = ctypes.c_uint32
    fn.argtypes = (ctypes.c_uint32, ctypes.c_char_p, ctypes.c_uint64)
    data = random.Random(5).randbytes(384)
    try:
        whole = fn(0, data, len(data))
        chained = fn(fn(0, data[:100], 100), data[100:], len(data) - 100)
    except (OSError, ctypes.ArgumentError):  # pragma: no cover
        return None
    if whole != zlib.crc32(data) or chained != whole:
        return None
    return ctypes.cast(fn, ctypes.c_void_p).value


#: address (int) of a C function ``uint32_t crc(uint32_t init, const unsigned char *buf,
#: uint64_t len)`` computing the same CRC-32 as :func:`crc32` (``crc(crc(0, a), b)`` is the
#: CRC of ``a + b``): ISA-L's ``crc32_gzip_refl``; None without ``isal`` or when its self-test fails
C_CRC32: Optional[int] = _c_crc32_address()


def xor64(data) -> int:
    """The XOR of the little-endian 64-bit words of ``data`` (summary_mode xor).

    ``data`` is a bytes-like object (the tensor's C-order bytes in its own dtype); when its
    length is not a multiple of 8 the last word is padded with zero bytes. Empty data gives
    0. Upstream mindstudio-probe 26.2.0 writes the same value (checked on float32, int8 and
    bfloat16 tensors).

    Example: the int8 bytes ``00 01 02 03 04 05 06`` are one word padded to
    ``00 01 02 03 04 05 06 00``, i.e. ``0x0006050403020100``.

    What it cannot see, unlike CRC-32: the fold is independent of the words' order
    (swapping two 8-byte words, e.g. two float64 elements or two pairs of float32 elements
    at even positions, gives the same value), and changes that cancel (the same bit flipped
    in two words) leave it unchanged.
    """
    buf = np.frombuffer(data, dtype=np.uint8)
    tail = buf.size % 8
    words = buf[:buf.size - tail].view("<u8")
    value = int(np.bitwise_xor.reduce(words)) if words.size else 0
    if tail:
        value ^= int.from_bytes(bytes(buf[buf.size - tail:]), "little")
    return value


def xor64_hex(data) -> str:
    """:func:`xor64` as dump.json's ``md5`` field writes it: ``"0x"`` + 16 lowercase hex
    digits (``"0x0006050403020100"``)."""
    return "0x%016x" % xor64(data)
