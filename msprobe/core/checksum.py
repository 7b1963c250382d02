"""CRC-32 as dump.json's ``md5`` field uses it (spec 3.5): the zlib/PNG polynomial.

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
