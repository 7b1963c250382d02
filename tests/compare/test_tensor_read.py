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


def test_identical_metrics_cosine_defined_only_with_a_finite_nonzero_value():
    from msprobe.compare.tensordata import _identical_metrics

    zeros = np.zeros(100_000, np.float32)
    assert _identical_metrics(zeros)["cosine"] is None
    late = zeros.copy()
    late[-1] = 3.0                                       # found in the last chunk
    late[5] = np.nan
    assert _identical_metrics(late)["cosine"] == 1.0
    only_nonfinite = zeros.copy()
    only_nonfinite[:10] = np.inf
    assert _identical_metrics(only_nonfinite)["cosine"] is None
    assert _identical_metrics(np.array([0, 0, 2], np.int64))["cosine"] == 1.0
    m = _identical_metrics(late)
    assert (m["euc_dist"], m["max_abs_err"], m["max_rel_err"], m["one_thousandth_ratio"]) == (0.0, 0.0, 0.0, 1.0)


def test_pt_files_read_mapped_and_legacy(tmp_path):
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from msprobe.compare.tensordata import TensorSource

    d = tmp_path / "step0" / "rank0" / "dump_tensor_data"
    d.mkdir(parents=True)
    x = torch.arange(10, dtype=torch.float32) / 3
    torch.save(x, d / "new.pt")
    torch.save(x.to(torch.bfloat16), d / "bf.pt")
    torch.save(x, d / "old.pt", _use_new_zipfile_serialization=False)
    src = TensorSource(SimpleNamespace(data_dirs={}, path=str(tmp_path)))
    for name, want in (("new.pt", x), ("old.pt", x), ("bf.pt", x.to(torch.bfloat16).float())):
        got = src.load(0, 0, None, name)
        assert got.dtype == np.float32 and np.array_equal(got, want.numpy()), name
    assert src.load(0, 0, None, "absent.pt") is None


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_read_npy_header_versions(tmp_path, version):
    from numpy.lib import format as npf

    arr = np.arange(24, dtype="<i2").reshape(2, 3, 4)
    path = tmp_path / "v.npy"
    with open(path, "wb") as fh:
        npf.write_array(fh, arr, version=version)
    work = MetricsWorkspace()
    got = _read_npy(path, lambda n: work.raw("t", n))
    assert got.dtype == arr.dtype and got.shape == (2, 3, 4) and np.array_equal(got, arr)


def test_read_npy_object_dtype_is_refused(tmp_path):
    path = tmp_path / "o.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError):
        _read_npy(path, lambda n: MetricsWorkspace().raw("t", n))
