"""Per-leaf metrics: tensor metrics on numpy arrays and the statistics error e."""
from __future__ import annotations

import math

import numpy as np
import pytest

from msprobe.compare.metrics import tensor_metrics


def test_tensor_metrics_worked_example():
    m = tensor_metrics(np.array([1.0, 2.004]), np.array([1.0, 2.0]))
    assert m["max_abs_err"] == pytest.approx(0.004)
    assert m["max_rel_err"] == pytest.approx(0.002)
    assert m["e"] == pytest.approx(0.004 / math.sqrt(5))
    assert m["euc_dist"] == pytest.approx(0.004)
    assert m["one_thousandth_ratio"] == 0.5          # relative errors 0 and 0.002
    assert m["five_thousandths_ratio"] == 1.0
    n, b = np.array([1.0, 2.004]), np.array([1.0, 2.0])
    assert m["cosine"] == pytest.approx(n @ b / np.linalg.norm(n) / np.linalg.norm(b))
    assert m["nonfinite"] is False


def test_tensor_metrics_nonfinite_positions():
    same = tensor_metrics(np.array([np.nan, 1.0, np.inf]), np.array([np.nan, 1.0, np.inf]))
    assert same["nonfinite"] is False and same["e"] == 0.0
    moved = tensor_metrics(np.array([np.nan, 1.0]), np.array([1.0, np.nan]))
    assert moved["nonfinite"] is True and math.isinf(moved["e"])


def test_tensor_metrics_zero_baseline_and_shapes():
    m = tensor_metrics(np.array([0.0, 1e-20]), np.array([0.0, 0.0]))
    assert m["cosine"] is None and m["max_rel_err"] == pytest.approx(1e-20 / np.finfo(np.float64).eps)
    with pytest.raises(ValueError, match="shapes differ"):
        tensor_metrics(np.zeros(3), np.zeros(4))
