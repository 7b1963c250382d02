"""A 0-dim tensor reports its own value as Max, Min and Mean (spec 3.2: ``item()``), with
the sign of -0.0 kept, and ``|value|`` as Norm (spec section 9), on every statistics path:
the native pass, the PyTorch/numpy fallback, the deferred (device) path and numpy arrays."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from msprobe.core.arrays import array_stats
from msprobe.pytorch import stats as stats_mod
from msprobe.pytorch.deferred import DeferredStats, PendingLeaf
from msprobe.pytorch.leaves import LeafBuilder
from store.records import Call

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _signed(x: float) -> tuple:
    return (x, math.copysign(1.0, x))


def _check(leaf, value: float) -> None:
    expected = float(torch.tensor(value).item())
    assert _signed(leaf.max) == _signed(expected) and _signed(leaf.min) == _signed(expected)
    assert _signed(leaf.mean) == _signed(expected)
    assert _signed(leaf.norm) == _signed(abs(expected))


@pytest.mark.parametrize("value", [-0.0, 0.0, -2.5, 3.0])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("path", ["native", "fallback", "deferred"])
def test_zero_dim_mean_is_the_value(monkeypatch, path, dtype, value):
    if path == "native" and stats_mod.NATIVE is None:
        pytest.skip("native statistics pass not built")
    if path == "fallback":
        monkeypatch.setattr(stats_mod, "NATIVE", None)
        monkeypatch.setattr("msprobe.pytorch.leaves.NATIVE", None)
    t = torch.tensor(value, dtype=dtype)
    builder = LeafBuilder(md5=False, defer_all=path == "deferred")
    leaf = builder.tensor_leaf("output", (0,), t)
    if path == "deferred":
        assert isinstance(leaf, PendingLeaf)
        queue = DeferredStats()
        queue.add(Call(step=0, kind="api_forward", name="x", api_type="Torch", leaves=()), [leaf])
        leaf = queue.resolve()[0].leaves[0]
    _check(leaf, float(t.item()))


def test_one_element_vector_keeps_the_sum_rule():
    """Only 0-dim tensors take the value itself; a shape-(1,) tensor's Mean is its float64
    sum over one element (+0.0 for -0.0, as numpy's float64 mean of a sum from zero)."""
    leaf = LeafBuilder(md5=False).tensor_leaf("output", (0,), torch.tensor([-2.5]))
    assert (leaf.mean, leaf.norm) == (-2.5, 2.5)


@pytest.mark.parametrize("value", [-0.0, -7.25])
def test_zero_dim_numpy_array(value):
    s = array_stats(np.array(value, dtype=np.float32))
    assert _signed(s.mean) == _signed(value) and _signed(s.max) == _signed(value)
    assert _signed(s.norm) == _signed(abs(value))
