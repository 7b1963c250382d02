"""msprobe.core.npy_payload: array bytes for the payload store and the .npy exporter callback."""
from __future__ import annotations

import io
import struct

import numpy as np
import pytest

from msprobe.core.npy_payload import BF16, array_bytes, array_from_payload, write_npy
from store.payload_writer import Payload


@pytest.mark.parametrize("a", [
    np.array([[1.5, -2.0], [np.inf, np.nan]], np.float32),
    np.arange(6, dtype=np.int64).reshape(2, 3)[:, ::2],  # not contiguous
    np.array([True, False]),
    np.array([1 - 1j], np.complex128),
    np.array(7, np.uint8),
    np.zeros((0, 4), np.float16),
])
def test_round_trip_bit_for_bit(tmp_path, a):
    data, dtype, shape = array_bytes(a)
    assert dtype == a.dtype.name and shape == a.shape
    assert data == a.tobytes(order="C")
    path = tmp_path / "x.tmp"  # no .npy suffix: written at exactly this path
    write_npy(path, Payload(data, dtype, shape))
    assert [p.name for p in tmp_path.iterdir()] == ["x.tmp"]
    back = np.load(path, allow_pickle=False)
    assert back.dtype == a.dtype and back.shape == a.shape
    assert back.tobytes() == a.tobytes(order="C")
    ref = io.BytesIO()
    np.save(ref, a, allow_pickle=False)
    assert path.read_bytes() == ref.getvalue()


def test_bfloat16_widened_exactly():
    floats = [1.5, -2.0, 0.0078125, -0.0, float("inf")]
    # bf16 bits = high 16 bits of the float32 bits (exact for these values), little-endian
    bits = [struct.unpack("<I", struct.pack("<f", f))[0] >> 16 for f in floats]
    payload = Payload(struct.pack("<5H", *bits), BF16, (5,))
    out = array_from_payload(payload)
    assert out.dtype == np.float32
    assert out.tobytes() == np.array(floats, np.float32).tobytes()


def test_bad_payloads_raise_clear_errors():
    with pytest.raises(ValueError, match="dtype"):
        array_from_payload(Payload(b"\0\0\0\0", "Float32x", (1,)))
    with pytest.raises(ValueError, match="dtype"):
        array_from_payload(Payload(b"\0" * 8, "datetime64[s]", (1,)))
    with pytest.raises(ValueError, match="expected 8"):
        array_from_payload(Payload(b"\0" * 4, "float32", (2,)))


@pytest.mark.parametrize("a", [
    np.random.default_rng(0).standard_normal(1 << 18).astype(np.float32),          # exactly 1 MiB
    np.random.default_rng(1).standard_normal((513, 1021)),                          # float64, odd length
    np.random.default_rng(2).standard_normal((3, 1 << 17)).astype(np.complex64),
    np.random.default_rng(3).integers(0, 2, 1 << 20).astype(bool),
    np.random.default_rng(4).standard_normal((1 << 18) - 1).astype(np.float32),   # just under: buffered
])
def test_large_arrays_written_around_the_page_cache_are_np_saves_bytes(tmp_path, monkeypatch, a):
    """From 1 MiB of data on, write_npy goes through the thread's DirectFileWriter (where the
    file system takes O_DIRECT); the file is np.save's, byte for byte, and loads back."""
    import store.direct_io as dio
    from store.direct_io import MIN_DIRECT_BYTES, thread_writer

    # a writer of its own: the thread's may carry a refusal from another file system
    monkeypatch.setattr(dio._THREAD, "writer", dio.DirectFileWriter(), raising=False)
    writer = thread_writer()
    before = writer.direct_files
    data, dtype, shape = array_bytes(a)
    path = tmp_path / "big.tmp"
    write_npy(path, Payload(data, dtype, shape))
    ref = io.BytesIO()
    np.save(ref, a, allow_pickle=False)
    assert path.read_bytes() == ref.getvalue()
    back = np.load(path, allow_pickle=False)
    assert back.dtype == a.dtype and back.shape == a.shape and back.tobytes() == a.tobytes()
    direct = writer.direct and a.nbytes >= MIN_DIRECT_BYTES
    assert writer.direct_files == before + (1 if direct else 0)


def test_large_bfloat16_payload_widened_through_the_direct_path(tmp_path):
    bits = np.random.default_rng(5).integers(0, 1 << 16, 1 << 19, dtype=np.uint16)
    bits[bits & 0x7F80 == 0x7F80] = 0x3F80  # no NaN/Inf patterns: compare values exactly
    path = tmp_path / "bf.tmp"
    write_npy(path, Payload(bits.tobytes(), BF16, (1 << 9, 1 << 10)))
    back = np.load(path, allow_pickle=False)
    expected = (bits.astype(np.uint32) << 16).view(np.float32).reshape(1 << 9, 1 << 10)
    assert back.dtype == np.float32 and np.array_equal(back.view(np.uint32), expected.view(np.uint32))
