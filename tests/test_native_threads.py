"""The native statistics pass over buffers of several chunks, and on several threads at once
(``reduce_chunks`` in fused_stats.c).

The pass reduces fixed chunks of 16,384 elements and adds their results in chunk order; the
CRC-32 and the snapshot copy run in element order across the chunks. Buffers of 65,536
elements or more are reduced with the GIL released, so Python threads may reduce at the same
time. References for the values are numpy float64 with ``math.fsum`` and ``zlib.crc32``.
"""
from __future__ import annotations

import math
import threading
import zlib

import numpy as np
import pytest

import msprobe.pytorch.stats as stats_mod
from msprobe._native import KIND_BF16, KIND_F16, KIND_F32, KIND_F64

NATIVE = stats_mod.NATIVE
pytestmark = pytest.mark.skipif(NATIVE is None, reason="the native extension is not built")
CHUNK = 16384


def _data(n: int, kind: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(n) * 3.0
    a[rng.integers(0, n, 50)] = -0.0
    if kind == KIND_F32:
        return a.astype(np.float32)
    if kind == KIND_F64:
        return a
    if kind == KIND_F16:
        return a.astype(np.float16)
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # bfloat16 bits


def _values(buf: np.ndarray, kind: int) -> np.ndarray:
    if kind == KIND_BF16:
        return (buf.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return buf.astype(np.float64)


def _crc_bytes(buf: np.ndarray, kind: int) -> bytes:
    """The bytes the CRC-32 covers: the elements', bfloat16 as float32 values."""
    return (buf.astype(np.uint32) << 16).tobytes() if kind == KIND_BF16 else buf.tobytes()


@pytest.mark.parametrize("kind", [KIND_F32, KIND_F64, KIND_BF16, KIND_F16])
@pytest.mark.parametrize("n", [CHUNK, CHUNK + 1, 65535, 65536, 5 * CHUNK + 7, 200_003])
@pytest.mark.parametrize("portable", [False, True])
def test_chunked_statistics(kind, n, portable):
    buf = _data(n, kind, n + kind)
    got = NATIVE.reduce_at(buf.ctypes.data, n, kind, portable)
    a64 = _values(buf, kind)
    assert (got[0], got[1]) == (a64.max(), a64.min())
    assert abs(got[2] - math.fsum(a64)) <= 1e-12 * math.fsum(np.abs(a64))
    assert abs(got[3] - math.fsum(a64 * a64)) <= 1e-12 * math.fsum(a64 * a64)
    assert got[4:] == (False, False)


def test_signed_zero_max_across_chunks():
    """Max and Min of zeros of both signs in different chunks: the earlier chunk's zero."""
    a = np.zeros(4 * CHUNK, np.float32)
    a[:CHUNK] = -0.0  # -0.0 first, then +0.0
    b = -a            # +0.0 first, then -0.0
    for buf, sign in ((a, -1.0), (b, 1.0)):
        got = NATIVE.reduce_at(buf.ctypes.data, buf.size, KIND_F32)
        assert [math.copysign(1.0, v) for v in got[:2]] == [sign, sign]
        assert got[2:] == (0.0, 0.0, False, False)


def test_nan_and_inf_in_a_late_chunk():
    a = _data(3 * CHUNK + 5, KIND_F32, 1)
    a[2 * CHUNK + 3] = np.inf
    got = NATIVE.reduce_at(a.ctypes.data, a.size, KIND_F32)
    assert got[0] == math.inf and got[4:] == (False, True)
    a[3 * CHUNK + 1] = np.nan
    got = NATIVE.reduce_at(a.ctypes.data, a.size, KIND_F32)
    assert math.isnan(got[0]) and math.isnan(got[1]) and got[4:] == (True, True)


@pytest.mark.parametrize("kind", [KIND_F32, KIND_BF16])
def test_snapshot_across_chunks(kind):
    buf = _data(4 * CHUNK + 9, kind, 7)
    data, reduced = NATIVE.snapshot_at(buf.ctypes.data, buf.size, kind, 0, False, 4096)
    assert bytes(data) == buf.tobytes()
    a64 = _values(buf, kind)
    assert (reduced[0], reduced[1]) == (a64.max(), a64.min())
    assert abs(reduced[2] - math.fsum(a64)) <= 1e-12 * math.fsum(np.abs(a64))


@pytest.mark.parametrize("kind", [KIND_F32, KIND_F64, KIND_BF16, KIND_F16])
@pytest.mark.parametrize("n", [65536, 5 * CHUNK + 3, 70 * CHUNK + 11])
def test_crc_across_chunks(kind, n):
    """summary_mode md5: the CRC-32 chained over the chunks is zlib's CRC of all the bytes
    (bfloat16: of their float32 values); the statistics are reduce_at's; the snapshot copies
    the bytes too."""
    if stats_mod.FUSED_CRC is None:
        pytest.skip("no C CRC-32 function (isal)")
    buf = _data(n, kind, n % 97 + kind)
    got = NATIVE.reduce_crc_at(buf.ctypes.data, n, kind, stats_mod.FUSED_CRC)
    assert got[6] == zlib.crc32(_crc_bytes(buf, kind))
    assert got[:6] == NATIVE.reduce_at(buf.ctypes.data, n, kind)
    copy, reduced = NATIVE.snapshot_at(buf.ctypes.data, n, kind, stats_mod.FUSED_CRC, False, 4096)
    assert bytes(copy) == buf.tobytes() and reduced == got


def test_threads_reducing_at_once():
    """Four threads reduce (with CRC and snapshot too) different large buffers at the same
    time, the GIL released: every result is the one computed alone on this thread."""
    bufs = [_data(6 * CHUNK + 13 * k, KIND_F32, 20 + k) for k in range(4)]
    crc = stats_mod.FUSED_CRC or 0

    def results(buf):
        out = [NATIVE.reduce_at(buf.ctypes.data, buf.size, KIND_F32)]
        data, reduced = NATIVE.snapshot_at(buf.ctypes.data, buf.size, KIND_F32, crc, False, 4096)
        out += [bytes(data), reduced]
        if crc:
            out.append(NATIVE.reduce_crc_at(buf.ctypes.data, buf.size, KIND_F32, crc))
        return out

    expected = [results(b) for b in bufs]
    got = [[] for _ in bufs]
    start = threading.Barrier(len(bufs))

    def work(k):
        start.wait()
        for _ in range(20):
            got[k].append(results(bufs[k]))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(bufs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, buf in enumerate(bufs):
        assert got[k] == [expected[k]] * 20
        assert expected[k][1] == buf.tobytes()
        if crc:
            assert expected[k][3][6] == zlib.crc32(buf.tobytes())
