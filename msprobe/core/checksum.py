"""CRC-32 as dump.json's ``md5`` field uses it (spec 3.5): the zlib/PNG polynomial.

:func:`crc32` is ``isal.isal_zlib.crc32`` (Intel ISA-L, about 4x faster than zlib on
x86-64: ~9 GB/s against ~2 GB/s on one core) when the ``isal`` package is installed, else
the standard library's ``zlib.crc32``; both return the same value for the same bytes
(tests/core/test_checksum.py). Both release the GIL on large buffers.
"""
from __future__ import annotations

import zlib

try:  # pragma: no cover - depends on the environment
    from isal.isal_zlib import crc32 as _fast_crc32
except ImportError:  # pragma: no cover
    _fast_crc32 = None

#: ``crc32(data, value=0) -> int``: CRC-32 of a bytes-like object, continuing from ``value``
crc32 = _fast_crc32 if _fast_crc32 is not None else zlib.crc32

#: True when the ISA-L implementation is in use
ACCELERATED = _fast_crc32 is not None
