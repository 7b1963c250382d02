"""msprobe.core.checksum: crc32 equals zlib.crc32 (the value dump.json's md5 field holds in
summary_mode md5); xor64 is the XOR of little-endian 64-bit words (summary_mode xor)."""
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


def test_c_crc32_address_matches_zlib():
    """C_CRC32 is ISA-L's crc32_gzip_refl with zlib semantics (whole and chained), or None without isal."""
    import ctypes
    if not checksum.ACCELERATED:
        assert checksum.C_CRC32 is None
        return
    assert isinstance(checksum.C_CRC32, int) and checksum.C_CRC32 != 0
    fn = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_uint32, ctypes.c_char_p, ctypes.c_uint64)(checksum.C_CRC32)
    data = np.random.default_rng(1).integers(0, 256, 10007, dtype=np.uint8).tobytes()
    assert fn(0, data, len(data)) == zlib.crc32(data)
    assert fn(fn(0, data[:4097], 4097), data[4097:], len(data) - 4097) == zlib.crc32(data)


def test_c_crc32_address_guards(monkeypatch):
    """No isal module, or a library without the symbol: None (the two-pass CRC stays)."""
    import types
    monkeypatch.setattr(checksum, "_isal_zlib", None)
    assert checksum._c_crc32_address() is None
    monkeypatch.setattr(checksum, "_isal_zlib", types.SimpleNamespace(__file__=zlib.__spec__.origin or "/nonexistent"))
    assert checksum._c_crc32_address() is None
    monkeypatch.setattr(checksum, "_isal_zlib", types.SimpleNamespace(__file__="/nonexistent/libnothing.so"))
    assert checksum._c_crc32_address() is None


def _xor_words(data: bytes) -> int:
    """Independent reference: pad with zero bytes to a multiple of 8, XOR the words."""
    data = data + bytes(-len(data) % 8)
    value = 0
    for i in range(0, len(data), 8):
        value ^= int.from_bytes(data[i:i + 8], "little")
    return value


def test_xor64_equals_word_by_word_reference_on_odd_sizes():
    rng = np.random.default_rng(1)
    for n in (0, 1, 7, 8, 9, 15, 16, 17, 1001):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert checksum.xor64(data) == _xor_words(data), n
        assert checksum.xor64_hex(data) == "0x%016x" % _xor_words(data)
        assert checksum.xor64(np.frombuffer(data, np.uint8)) == _xor_words(data)  # an array too


def test_xor64_known_values():
    assert checksum.xor64_hex(b"") == "0x0000000000000000"
    # int8 0..6: one word, zero-padded; little-endian
    assert checksum.xor64_hex(bytes(range(7))) == "0x0006050403020100"
    assert checksum.xor64(bytes(range(16))) == 0x0706050403020100 ^ 0x0F0E0D0C0B0A0908


def test_xor64_blind_spots_that_crc32_sees():
    # documented limits: the order of 8-byte words and changes that cancel
    a, b = bytes(range(8)), bytes(range(8, 16))
    assert checksum.xor64(a + b) == checksum.xor64(b + a)
    assert checksum.crc32(a + b) != checksum.crc32(b + a)
    flipped = bytes([a[0] ^ 1]) + a[1:] + bytes([b[0] ^ 1]) + b[1:]
    assert checksum.xor64(flipped) == checksum.xor64(a + b)
    assert checksum.crc32(flipped) != checksum.crc32(a + b)
