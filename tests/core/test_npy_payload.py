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
