"""Batched device statistics (:class:`msprobe.pytorch.deferred.StatsBatch`): the tensors of
a flush staged into one float64 buffer and reduced together with segmented reductions.

Values are checked against numpy float64 on the same data, the NaN/Inf facts against the
host path (:func:`msprobe.pytorch.stats.tensor_stats`), for every dtype; the operations
per recorded tensor (``benchmarks/device_ops.py``, the dispatch workload with every tensor
forced through the device path) stay within the amortised budget of 2 launches whatever
the number of recorded tensors."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pt_helpers import NONFINITE, device_ops

from msprobe.pytorch.deferred import DeferredStats, PendingLeaf, Row, StatsBatch, device_stats
from msprobe.pytorch.stats import tensor_stats
from store import schema
from store.records import Call, Leaf



def _leaf(t: torch.Tensor) -> Leaf:
    return Leaf(io="input", path=(0,), leaf_kind=schema.LEAF_TENSOR, type="torch.Tensor", dtype=str(t.dtype),
                shape=tuple(t.shape), numel=t.numel())


def batched(tensors: list, capacity: int = 1 << 16, largest: int = 1 << 12) -> list[Leaf]:
    """The leaves of ``tensors`` staged in one StatsBatch and resolved as the recorder does
    at a flush point (one Call per tensor)."""
    deferred = DeferredStats(batch=StatsBatch(capacity=capacity, largest=largest))
    for i, t in enumerate(tensors):
        deferred.add(Call(step=0, kind="api", name=f"x.{i}", api_type="Torch"),
                     [PendingLeaf(_leaf(t), device_stats(t, deferred.batch))])
    return [call.leaves[0] for call in deferred.resolve()]


def reference(t: torch.Tensor) -> np.ndarray:
    """The values the statistics are over, in numpy float64 (``|z|`` for complex, computed
    in the tensor's own precision as the host path does)."""
    if t.is_complex():
        return np.abs(t.numpy()).astype(np.float64)
    if t.dtype == torch.bool:
        return t.numpy().astype(np.float64)
    return t.to(torch.float64).numpy() if t.is_floating_point() else t.numpy().astype(np.float64)


def _dtypes() -> list:
    out = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
           torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]
    out += [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]
    return out


def _sample(dtype: torch.dtype, shape: tuple, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g) * 3
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 10).to(dtype)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -(1 << 40)), min(info.max, 1 << 40)
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)


def test_every_dtype_equals_numpy_float64():
    # one batch holding every dtype, 0-dim, 1-d, 2-d and a transposed (non-contiguous) view
    tensors = []
    for i, dtype in enumerate(_dtypes()):
        tensors += [_sample(dtype, (), i), _sample(dtype, (7,), i + 50), _sample(dtype, (5, 9), i + 99).t()]
    for t, leaf in zip(tensors, batched(tensors)):
        a = reference(t)
        # |z| of complex64 is a float32 value: numpy's and PyTorch's may differ in the last bit
        rel = 1e-7 if t.dtype == torch.complex64 else 0
        assert leaf.max == pytest.approx(a.max(), rel=rel) and leaf.min == pytest.approx(a.min(), rel=rel), t.dtype
        assert leaf.has_nan is False and leaf.has_inf is False
        if t.dtype == torch.bool:
            assert leaf.mean is None and leaf.norm is None
            continue
        assert leaf.mean == pytest.approx(a.sum() / a.size, rel=max(rel, 1e-12), abs=1e-12), t.dtype
        assert leaf.norm == pytest.approx(math.sqrt(float(np.dot(a.ravel(), a.ravel()))), rel=max(rel, 1e-12)), t.dtype


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_norm_beyond_the_dtype_range(dtype):
    # every element fits the dtype; the Norm (and Sum) of 4096 of them does not
    big = {torch.float16: 60000.0, torch.bfloat16: 3e38}[dtype]
    t = torch.full((64, 64), big, dtype=dtype)
    t[0, :8] = -250.5
    a = reference(t)
    (leaf,) = batched([t], largest=1 << 14)
    norm = math.sqrt(float(np.dot(a.ravel(), a.ravel())))
    assert norm > torch.finfo(dtype).max and abs(a.sum()) > torch.finfo(dtype).max
    assert leaf.norm == pytest.approx(norm, rel=1e-12)
    assert leaf.mean == pytest.approx(a.mean(), rel=1e-12)
    assert (leaf.max, leaf.min) == (a.max(), a.min())


@pytest.mark.parametrize("scale", [1e300, 1e-300, 5e-320])
def test_float64_magnitudes_that_overflow_or_underflow_squares(scale):
    t = torch.tensor([1.0, -3.0, 2.5, 0.25], dtype=torch.float64) * scale
    a = t.numpy()
    (leaf,) = batched([t, torch.ones(3)])[:1]
    m = np.abs(a).max()  # the reference rescales by the largest magnitude, exactly (powers of two aside)
    ref_norm = m * math.sqrt(float(np.sum((a / m) ** 2)))
    assert leaf.norm == pytest.approx(ref_norm, rel=1e-12)
    assert leaf.mean == pytest.approx(float(np.sum(a / m)) * m / a.size, rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.complex64])
def test_nonfinite_facts_equal_host_path(dtype):
    tensors = [torch.tensor(v).to(dtype) for v in NONFINITE.values()]
    for name, t, got in zip(NONFINITE, tensors, batched(tensors)):
        want = tensor_stats(t)
        for field in ("max", "min", "mean", "norm", "has_nan", "has_inf", "max_finite", "min_finite"):
            a, b = getattr(got, field), getattr(want, field)
            same = a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
            if not same and isinstance(a, float) and isinstance(b, float):
                same = a == pytest.approx(b, rel=1e-6)
            assert same, (name, dtype, field, a, b)


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_quantized_tensor_gives_its_dequantized_values():
    q = torch.quantize_per_tensor(torch.tensor([-1.0, 0.5, 2.0, 3.25]), scale=0.25, zero_point=3, dtype=torch.qint8)
    (leaf,) = batched([q])
    a = q.dequantize().double().numpy()
    assert (leaf.max, leaf.min) == (a.max(), a.min())
    assert leaf.norm == pytest.approx(math.sqrt(float(np.dot(a, a))), rel=1e-12)


def test_buffers_full_and_tensors_too_large_for_the_batch():
    # capacity 64 elements: the 40-element tensors fill buffers one after the other; the
    # 100-element tensor is above `largest` and takes the per-tensor kernels
    tensors = [_sample(torch.float32, (40,), i) for i in range(5)] + [_sample(torch.float32, (100,), 9)]
    batch = StatsBatch(capacity=64, largest=50)
    pending = [device_stats(t, batch) for t in tensors]
    assert all(isinstance(p, Row) for p in pending[:5]) and not isinstance(pending[5], Row)
    assert len({id(p.chunk) for p in pending[:5]}) == 5  # 40 + 40 > 64: one buffer each
    for t, leaf in zip(tensors, batched(tensors, capacity=64, largest=50)):
        a = reference(t)
        assert (leaf.max, leaf.min) == (a.max(), a.min())
        assert leaf.mean == pytest.approx(a.mean(), rel=1e-12)
        assert leaf.norm == pytest.approx(math.sqrt(float(np.dot(a, a))), rel=1e-12)


def test_device_without_segment_reduce_gets_the_same_values(monkeypatch):
    tensors = [torch.tensor([1.0, float("nan"), -4.0]), torch.tensor([float("inf"), 2.0], dtype=torch.float16),
               torch.tensor([3, -7, 11], dtype=torch.int32), torch.tensor([1e300, -2e300], dtype=torch.float64)]
    want = batched(tensors)

    def missing(*args, **kwargs):
        raise NotImplementedError("segment_reduce: no kernel for this device")

    monkeypatch.setattr(torch, "segment_reduce", missing)
    for a, b in zip(want, batched(tensors)):
        for field in ("max", "min", "mean", "norm", "has_nan", "has_inf", "max_finite", "min_finite"):
            x, y = getattr(a, field), getattr(b, field)
            assert x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)) \
                or y == pytest.approx(x, rel=1e-15), (field, x, y)


def test_values_are_those_at_staging_time():
    # an in-place change after the record (before the flush) does not reach the statistics
    t = torch.tensor([1.0, 2.0, 3.0])
    deferred = DeferredStats(batch=StatsBatch(capacity=256, largest=64))
    deferred.add(Call(step=0, kind="api", name="x.0", api_type="Torch"),
                 [PendingLeaf(_leaf(t), device_stats(t, deferred.batch))])
    t.mul_(100).add_(float("nan"))
    (call,) = deferred.resolve()
    leaf = call.leaves[0]
    assert (leaf.max, leaf.min, leaf.mean, leaf.has_nan) == (3.0, 1.0, 2.0, False)
    assert leaf.norm == pytest.approx(math.sqrt(14.0), rel=1e-15)


def test_bad_batch_sizes_are_refused():
    with pytest.raises(ValueError, match="largest"):
        StatsBatch(capacity=0, largest=0)
    with pytest.raises(ValueError, match="largest"):
        StatsBatch(capacity=10, largest=11)


def test_launches_per_tensor_stay_within_budget_as_tensors_grow(tmp_path):
    ops = device_ops()
    small = ops.count_mode("statistics", layers=1, work=str(tmp_path / "l1"))
    large = ops.count_mode("statistics", layers=4, work=str(tmp_path / "l4"))
    assert large["tensors"] > 3 * small["tensors"] > 0
    for r in (small, large):
        assert r["ops_per_tensor"] <= 2, r
        assert r["syncs"] <= r["flushes"], r  # one device->host copy per flush point at most
    # the per-flush reductions are a fixed cost: the extra tensors cost ~1 launch each
    extra = (large["launches"] - small["launches"]) / (large["tensors"] - small["tensors"])
    assert extra <= 1.5, (small, large)
    assert small["syncs"] == large["syncs"]
