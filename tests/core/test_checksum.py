"""msprobe.core.checksum.crc32 equals zlib.crc32 (the value dump.json's md5 field holds)."""
from __future__ import annotations

import zlib

import numpy as np

from msprobe.core import checksum


def test_crc32_equals_zlib_on_odd_sizes():
    rng = np.random.default_rng(0)
    for n in (0, 1, 3, 15, 16, 17, 4095, 65537, 1 << 20):
        data = rng.integers(0, 256, n, dtype=np.uint8)
        assert checksum.crc32(data) == zlib.crc32(data)
        assert checksum.crc32(data.tobytes(), 12345) == zlib.crc32(data.tobytes(), 12345)


def test_known_value():
    assert checksum.crc32(b"123456789") == 0xCBF43926  # the CRC-32 check value


def test_accelerated_when_isal_installed():
    try:
        import isal  # noqa: F401
    except ImportError:
        assert checksum.ACCELERATED is False
    else:
        assert checksum.ACCELERATED is True
