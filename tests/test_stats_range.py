"""Mean and Norm of float64 data whose float64 sums would overflow or whose squares would
underflow (magnitudes beyond 2**±400): the statistics paths rescale by a power of two
(msprobe.core.statistics.rescale_factor). References: exact rational sums (fractions) for
Mean and ``math.hypot`` (overflow- and underflow-free) for Norm."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from msprobe.core.arrays import array_stats
from msprobe.core.statistics import TensorStats, rescale_factor
from msprobe.pytorch.stats import tensor_stats


def _reference(values: list[float]) -> tuple[float, float]:
    mean = float(sum(Fraction(v) for v in values) / len(values))
    return mean, math.hypot(*values)


def _paths(a: np.ndarray):
    yield "torch", tensor_stats(torch.from_numpy(a))
    yield "numpy", array_stats(a)
    yield "deferred", _deferred(torch.from_numpy(a))  # async_dump, defer_all, accelerators


CASES = [
    [1e308, 1e308, -5e307],          # the sum overflows
    [2e200, 1e200],                  # the squares overflow
    [1e-200, -3e-200],               # the squares underflow to 0
    [1e-170] * 6,                    # the squares are subnormal: digits lost
    [5e-324, 1e-320, -7e-322],       # subnormal values themselves
    [1.7976931348623157e308] * 4,    # the largest float64: Mean fits, Norm is inf (2x the largest)
]


@pytest.mark.parametrize("values", CASES)
def test_extreme_magnitudes(values):
    a = np.array(values, dtype=np.float64)
    mean, norm = _reference(values)
    for name, s in _paths(a):
        assert (s.max, s.min) == (max(values), min(values)), name
        assert s.mean == pytest.approx(mean, rel=1e-14, abs=0), name
        assert s.norm == pytest.approx(norm, rel=1e-14, abs=0), name
        assert math.isfinite(s.mean) and math.isfinite(s.norm) == math.isfinite(norm)


_EXTREME = st.one_of(
    st.floats(min_value=1e120, max_value=1.7e308),
    st.floats(min_value=-1.7e308, max_value=-1e120),
    st.floats(min_value=-1e-120, max_value=1e-120, allow_subnormal=True),
    st.floats(min_value=-1e6, max_value=1e6),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_EXTREME, min_size=1, max_size=40), st.booleans())
def test_any_float64_magnitudes(values, matrix):
    a = np.array(values, dtype=np.float64)
    if matrix and a.size % 2 == 0:
        a = a.reshape(2, -1)
    mean, norm = _reference(values)
    # a float64 sum of n terms is exact to within n * eps * sum(|x|) (the forward error bound
    # of recursive and pairwise summation): where values cancel ([1e120, 1.7e308, -1.7e308])
    # no float64 summation keeps a relative precision, so Mean gets that absolute allowance
    mean_abs = float(sum(Fraction(abs(v)) for v in values) / len(values))
    allowance = 2 * len(values) * np.finfo(np.float64).eps * mean_abs
    for name, s in _paths(a):
        assert s.mean == pytest.approx(mean, rel=1e-12, abs=max(allowance, 1e-300)), (name, values)
        assert s.norm == pytest.approx(norm, rel=1e-12, abs=1e-300), (name, values)


def test_cancelling_values_mean_within_summation_bound():
    values = [1e120, 1.7e308, -1.7e308]
    a = np.array(values, dtype=np.float64)
    mean, _ = _reference(values)
    for name, s in _paths(a):
        assert abs(s.mean - mean) <= 2 * len(values) * np.finfo(np.float64).eps * (3.4e308 + 1e120) / 3, name


def test_typical_values_are_not_rescaled():
    s = TensorStats()
    for mx, mn in ((1.0, -1.0), (0.0, 0.0), (3e100, 0.0), (float("nan"), 1.0), (float("inf"), 0.0), (None, None)):
        s.max, s.min = mx, mn
        assert rescale_factor(s) is None, (mx, mn)
    s.max, s.min = 1e300, -1.0
    assert rescale_factor(s) == 2.0 ** 996  # 2**996 <= 1e300 < 2**997
    s.max, s.min = 1.7976931348623157e308, 0.0
    assert rescale_factor(s) == 2.0 ** 1023


def test_non_finite_data_keeps_its_except_fields():
    a = np.array([1e300, np.inf, -2e300])
    for name, s in _paths(a):
        assert s.max == math.inf and s.mean == math.inf, name
        assert (s.max_finite, s.min_finite) == (1e300, -2e300), name


def _deferred(t: torch.Tensor):
    """The statistics of ``t`` through the device path (defer_all, async_dump, accelerators)."""
    from msprobe.pytorch.deferred import _fill, gather, stats_vector
    from store import schema
    from store.records import Leaf

    leaf = Leaf(io="x", path=(), leaf_kind=schema.LEAF_TENSOR, dtype=str(t.dtype),
                shape=tuple(t.shape), numel=t.numel())
    return _fill(leaf, gather([stats_vector(t)])[0])


@pytest.mark.parametrize("values", CASES)
def test_extreme_magnitudes_deferred_path(values):
    t = torch.tensor(values, dtype=torch.float64)
    mean, norm = _reference(values)
    for name, s in (("deferred", _deferred(t)), ("deferred complex", _deferred(t.to(torch.complex128)))):
        if name == "deferred complex":
            mean, norm = _reference([abs(v) for v in values])
        assert s.mean == pytest.approx(mean, rel=1e-14, abs=0), name
        assert s.norm == pytest.approx(norm, rel=1e-14, abs=0), name


def test_deferred_path_mixed_parts_keep_their_layout():
    # float64 vectors (rescaled) gathered with float32, bool and integer ones in one copy
    from msprobe.pytorch.deferred import _fill, gather, stats_vector  # noqa: F401

    ts = [torch.tensor([2e200, -1e200], dtype=torch.float64), torch.tensor([1.0, 2.0]),
          torch.tensor([True, False]), torch.tensor([3, 4]), torch.tensor(1e-300, dtype=torch.float64),
          torch.tensor([1.0, float("nan"), -1e300], dtype=torch.float64)]
    got = [_deferred(t) for t in ts]
    assert got[0].norm == pytest.approx(math.hypot(2e200, 1e200), rel=1e-14)
    assert (got[1].mean, got[1].norm) == (1.5, pytest.approx(math.sqrt(5.0)))
    assert (got[2].max, got[2].min) == (1.0, 0.0)
    assert (got[3].mean, got[3].norm) == (3.5, 5.0)
    assert (got[4].mean, got[4].norm) == (1e-300, 1e-300)
    assert math.isnan(got[5].mean) and math.isnan(got[5].norm)
    assert (got[5].max_finite, got[5].min_finite) == (1.0, -1e300)
