"""msprobe.pytorch.triton_stats: the fused Triton kernel gives the deferred layout's eight
values exactly as numpy float64 computes them (Max/Min/except values equal; Sum and Norm to
float64 rounding), for float16/bfloat16/float32/float64, one and several programs, NaN/Inf
anywhere; and through the recorder's flush (gather + fill) the same leaf fields as the
PyTorch-kernel path.

Without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set before
Triton is imported, hence a fresh interpreter running this file); skipped where Triton is
not installed (as on CI: the CPU build of PyTorch does not bring it).
"""
from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
ROOT = Path(__file__).resolve().parents[2]


def cases() -> dict:
    g = torch.Generator().manual_seed(0)
    naninf = torch.randn(20000, generator=g)
    naninf[[5, 8191, 8192]] = float("nan")
    naninf[19999] = float("inf")
    only_inf = torch.full((9000,), float("-inf"))
    only_inf[3] = float("nan")
    only_inf[8999] = float("inf")
    return {
        "f32": torch.randn(100, generator=g),
        "one": torch.tensor([3.5]),
        "scalar": torch.tensor(-2.0),
        "programs": torch.randn(3 * 8192 + 17, generator=g) * 1e3,
        "bf16": torch.randn(5000, generator=g).bfloat16(),
        "f16": (torch.randn(20000, generator=g) * 300).half(),
        "f64": torch.randn(9000, generator=g, dtype=torch.float64),
        "naninf": naninf,
        "all_nan": torch.full((10,), float("nan")),
        "only_inf": only_inf,
        "neg_zero": torch.tensor([-0.0, 0.0, -0.0]),
        "huge": torch.full((70000,), 3e38),
    }


def expected(x: torch.Tensor) -> list:
    a = x.double().numpy().reshape(-1)
    nan, fin = np.isnan(a), np.isfinite(a)
    num = ~nan
    with np.errstate(all="ignore"):
        return [math.nan if nan.any() else a.max(), math.nan if nan.any() else a.min(),
                a[num].max() if num.any() else -math.inf, a[num].min() if num.any() else math.inf,
                a[fin].max() if fin.any() else -math.inf, a[fin].min() if fin.any() else math.inf,
                a.sum(), math.sqrt((a * a).sum())]


def same(got: float, want: float, rel: float) -> bool:
    if math.isnan(want) or math.isnan(got):
        return math.isnan(want) and math.isnan(got)
    return got == want or abs(got - want) <= rel * abs(want)


def check(device: str) -> None:
    """Every case on ``device``: the fused vector against numpy, and the filled leaf against
    the PyTorch-kernel path's."""
    from msprobe.pytorch import triton_stats
    from msprobe.pytorch.deferred import _fill, gather, torch_parts
    from store import schema
    from store.records import Leaf

    for name, x in cases().items():
        x = x.to(device)
        assert triton_stats.usable(x, any_device=True), name
        got = triton_stats.fused_vector(x).cpu().tolist()
        want = expected(x.cpu())
        for i, (g, w) in enumerate(zip(got, want)):
            assert same(g, w, 0 if i < 6 else 1e-12), (name, i, g, w)
        leaf = Leaf(io="output", path=(0,), leaf_kind=schema.LEAF_TENSOR, type="torch.Tensor", dtype=str(x.dtype),
                    shape=tuple(x.shape), numel=x.numel())
        fused, plain = (_fill(leaf, vals) for vals in gather([(triton_stats.fused_vector(x),), torch_parts(x)]))
        for field in ("max", "min", "max_finite", "min_finite", "has_nan", "has_inf"):
            a, b = getattr(fused, field), getattr(plain, field)
            assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)), (name, field, a, b)
        for field in ("mean", "norm"):
            a, b = getattr(fused, field), getattr(plain, field)
            assert same(a, b, 2e-6) or (math.isinf(a) and math.isinf(b)), (name, field, a, b)


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
@pytest.mark.skipif(torch.cuda.is_available(), reason="the compiled kernels are checked on the device instead "
                    "(Triton 3.6's interpreter cannot loop to a runtime bound; 3.9's can)")
def test_interpreted_kernels_match_numpy():
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.skipif(not (HAS_TRITON and torch.cuda.is_available()), reason="needs Triton and a CUDA device")
def test_cuda_kernels_match_numpy():
    check("cuda")


def test_without_triton_the_torch_kernels_are_used(monkeypatch):
    from msprobe.pytorch import deferred, triton_stats

    monkeypatch.setenv("MSPROBE_NO_TRITON", "1")
    triton_stats.kernels.cache_clear()
    try:
        x = torch.randn(50)
        assert triton_stats.kernels() is None and not triton_stats.usable(x, any_device=True)
        parts = deferred.stats_vector(x)
        assert len(parts) == 3  # the PyTorch path: extremes, Sum, Norm
        vals = deferred.gather([parts])[0]
        assert vals[0] == float(x.max()) and vals[6] == pytest.approx(float(x.double().sum()), rel=1e-12)
    finally:
        triton_stats.kernels.cache_clear()


if __name__ == "__main__":
    check("cpu")
