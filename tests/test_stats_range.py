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
    for name, s in _paths(a):
        assert s.mean == pytest.approx(mean, rel=1e-12, abs=1e-300), (name, values)
        assert s.norm == pytest.approx(norm, rel=1e-12, abs=1e-300), (name, values)


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
