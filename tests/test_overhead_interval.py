"""benchmarks/overhead.py's bootstrap interval of the ratio of medians (the benchmark is a
script, not a test; its arithmetic is tested here)."""
from __future__ import annotations

import runpy
import statistics
import types
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "overhead.py"


@pytest.fixture(scope="module")
def overhead():
    """The script's functions (run as a module named ``overhead_bench``: its main() is not called)."""
    return types.SimpleNamespace(**runpy.run_path(str(_PATH), run_name="overhead_bench"))


def _runs(medians):
    return [{"step_times": [m * 0.99, m, m * 1.01]} for m in medians]


def test_identical_runs_give_the_exact_ratio(overhead):
    lo, hi = overhead.ratio_interval(_runs([0.3] * 5), _runs([0.2] * 4))
    assert lo == pytest.approx(1.5) and hi == pytest.approx(1.5)


def test_interval_brackets_the_ratio_and_is_reproducible(overhead):
    mine = [0.24, 0.22, 0.30, 0.21, 0.25, 0.27, 0.23, 0.26]
    base = [0.20, 0.17, 0.23, 0.16, 0.19, 0.18, 0.21, 0.17]
    ratio = statistics.median(mine) / statistics.median(base)
    lo, hi = overhead.ratio_interval(_runs(mine), _runs(base))
    assert lo < ratio < hi
    # every resampled median lies between the smallest and largest run medians
    assert min(mine) / max(base) <= lo and hi <= max(mine) / min(base)
    assert overhead.ratio_interval(_runs(mine), _runs(base)) == (lo, hi)
    narrow = overhead.ratio_interval(_runs(mine), _runs(base), level=0.5)
    assert lo <= narrow[0] <= narrow[1] <= hi


def test_too_few_runs_and_bad_arguments(overhead):
    assert overhead.ratio_interval(_runs([0.3, 0.3]), _runs([0.2] * 5)) is None
    assert overhead.ratio_interval(_runs([0.3] * 3) + [{"error": "x"}], _runs([0.2, 0.2])) is None
    with pytest.raises(ValueError):
        overhead.ratio_interval(_runs([0.3] * 3), _runs([0.2] * 3), level=1.0)
    with pytest.raises(ValueError):
        overhead.ratio_interval(_runs([0.3] * 3), _runs([0.2] * 3), draws=0)
