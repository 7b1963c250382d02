"""Tensor-mode reading: ``.npy`` into reusable buffers, the early-exit byte comparison."""
from __future__ import annotations

import numpy as np
import pytest

from msprobe.compare.metrics import MetricsWorkspace
from msprobe.compare.tensordata import _read_npy, _same_bytes


@pytest.mark.parametrize("arr", [np.arange(12, dtype=np.float32).reshape(3, 4), np.float64(-2.5),
                                 np.zeros((0, 3), np.float16), np.arange(6, dtype=">f4"),
                                 np.asfortranarray(np.arange(6.0).reshape(2, 3)), np.array([True, False])])
def test_read_npy_into_buffer_equals_np_load(tmp_path, arr):
    path = tmp_path / "x.npy"
    np.save(path, arr)
    work = MetricsWorkspace()
    got = _read_npy(path, lambda n: work.raw("t", n))
    assert got.dtype == arr.dtype and got.shape == arr.shape and np.array_equal(got, arr)
    assert np.array_equal(_read_npy(path), arr)


def test_read_npy_reuses_the_buffer_and_rejects_truncation(tmp_path):
    work = MetricsWorkspace()
    into = lambda n: work.raw("b", n)   # noqa: E731
    np.save(tmp_path / "a.npy", np.arange(1000, dtype=np.float32))
    np.save(tmp_path / "b.npy", np.arange(500, dtype=np.float64) * 2)
    first = _read_npy(tmp_path / "a.npy", into)
    second = _read_npy(tmp_path / "b.npy", into)
    assert np.shares_memory(first, second)            # one buffer per side, no fresh allocation
    assert np.array_equal(second, np.arange(500) * 2.0)
    data = (tmp_path / "a.npy").read_bytes()
    (tmp_path / "t.npy").write_bytes(data[:-8])
    with pytest.raises(ValueError, match="truncated"):
        _read_npy(tmp_path / "t.npy", into)


def test_same_bytes_early_exit_and_full_compare():
    a = np.arange(3_000_000, dtype=np.float32)
    b = a.copy()
    assert _same_bytes(a, b)
    b[-1] += 1                  # differs in the last chunk only
    assert not _same_bytes(a, b)
    b = a.copy()
    b[0] = -1
    assert not _same_bytes(a, b)
    assert not _same_bytes(a, a.reshape(1000, 3000))
    assert not _same_bytes(a.view(np.int32), np.arange(3_000_000, dtype=np.int64)[:3_000_000])
