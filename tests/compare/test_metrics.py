"""Per-leaf metrics: tensor metrics on numpy arrays and the statistics error e."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def _reference_metrics(target, baseline):
    """The tensor metrics, straight from the definitions on whole float64 arrays."""
    n = np.asarray(target, dtype=np.float64).ravel()
    b = np.asarray(baseline, dtype=np.float64).ravel()
    fin_n, fin_b = np.isfinite(n), np.isfinite(b)
    if not np.array_equal(fin_n, fin_b) or not np.array_equal(n[~fin_n], b[~fin_b], equal_nan=True):
        return {"nonfinite": True}
    n, b = n[fin_n], b[fin_b]
    if n.size == 0:
        return {"cosine": None, "euc_dist": 0.0, "e": 0.0, "max_abs_err": 0.0, "max_rel_err": 0.0,
                "one_thousandth_ratio": 1.0, "five_thousandths_ratio": 1.0, "nonfinite": False}
    with np.errstate(all="ignore"):
        abs_err = np.abs(n - b)
        rel = abs_err / np.where(b == 0, np.finfo(np.float64).eps, np.abs(b))
        norm_n, norm_b = np.sqrt(np.sum(n * n)), np.sqrt(np.sum(b * b))
        euc = np.sqrt(np.sum((n - b) ** 2))
    return {"cosine": float(np.sum(n * b) / (norm_n * norm_b)) if norm_n > 0 and norm_b > 0 else None,
            "euc_dist": float(euc), "e": float(euc / norm_b) if norm_b > 0 else (0.0 if euc == 0 else math.inf),
            "max_abs_err": float(abs_err.max()), "max_rel_err": float(rel.max()),
            "one_thousandth_ratio": float(np.mean(rel < 0.001)),
            "five_thousandths_ratio": float(np.mean(rel < 0.005)), "nonfinite": False}


def _assert_same_metrics(got, want):
    assert got["nonfinite"] is want["nonfinite"]
    if want["nonfinite"]:
        assert math.isinf(got["e"]) and got["cosine"] is None
        return
    for key in ("max_abs_err", "max_rel_err", "one_thousandth_ratio", "five_thousandths_ratio"):
        assert got[key] == want[key], key          # maxima and counts: exact
    for key in ("cosine", "euc_dist", "e"):         # sums: equal up to float64 rounding of the order of addition
        if want[key] is None or math.isinf(want[key]):
            assert got[key] == want[key], key
        else:
            assert got[key] == pytest.approx(want[key], rel=1e-12, abs=1e-300), key


_SPECIAL = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-45, -1e-40, 5e-324, 1e-310, 3.0e38]


@pytest.mark.parametrize("block", [1, 3, 64, 8192])
def test_blocked_metrics_equal_the_float64_reference(block):
    from msprobe.compare.metrics import MetricsWorkspace

    rng = np.random.default_rng(block)
    work = MetricsWorkspace(block)
    for trial in range(60):
        size = int(rng.integers(0, 3000 if block >= 64 else 200))
        dtype = [np.float32, np.float64, np.float16, np.int32][trial % 4]
        b = (rng.standard_normal(size) * 10.0 ** rng.integers(-3, 4)).astype(dtype)
        n = (b * (1 + rng.standard_normal(size) * 10.0 ** -rng.integers(2, 6))).astype(dtype)
        if size and dtype is not np.int32:
            for _ in range(int(rng.integers(0, 6))):      # the same specials on both sides
                i, v = int(rng.integers(size)), _SPECIAL[int(rng.integers(len(_SPECIAL)))]
                with np.errstate(all="ignore"):
                    b[i] = v
                    n[i] = v if rng.random() < 0.8 else 0
            if trial % 7 == 0:                              # many zeros in the baseline
                b[::3] = 0
        _assert_same_metrics(tensor_metrics(n, b, work), _reference_metrics(n, b))
        _assert_same_metrics(tensor_metrics(n, b), _reference_metrics(n, b))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(width=32, allow_nan=True, allow_infinity=True),
                          st.floats(width=32, allow_nan=True, allow_infinity=True)), max_size=40),
       st.integers(1, 9))
def test_blocked_metrics_property(pairs, block):
    from msprobe.compare.metrics import MetricsWorkspace

    n = np.array([p[0] for p in pairs], np.float32)
    b = np.array([p[1] for p in pairs], np.float32)
    if len(pairs) % 2:          # half the examples: the same non-finite positions on both sides
        n = np.where(np.isfinite(b), n, b).astype(np.float32)
    _assert_same_metrics(tensor_metrics(n, b, MetricsWorkspace(block)), _reference_metrics(n, b))


@pytest.mark.parametrize("size", [0, 1, 8191, 8192, 8193, 3 * 8192, 3 * 8192 + 5, 100_003])
def test_chunked_dot_equals_a_float64_sum(size):
    from msprobe.compare.metrics import _dot

    rng = np.random.default_rng(size)
    x, y = rng.standard_normal(size), rng.standard_normal(size)
    want = math.fsum((x * y).tolist())
    assert _dot(x, y) == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_blocked_metrics_large_pair_against_reference():
    from msprobe.compare.metrics import MetricsWorkspace

    rng = np.random.default_rng(7)
    b = rng.standard_normal(300_001).astype(np.float32)
    n = (b * (1 + rng.standard_normal(b.size) * 3e-3)).astype(np.float32)
    b[::1000] = 0
    n[5] = b[5] = np.nan
    for work in (MetricsWorkspace(), MetricsWorkspace(20_000), None):
        _assert_same_metrics(tensor_metrics(n, b, work), _reference_metrics(n, b))


def test_workspace_rejects_an_empty_block():
    from msprobe.compare.metrics import MetricsWorkspace

    with pytest.raises(ValueError, match="block must be >= 1"):
        MetricsWorkspace(0)
