"""config.json ``precision: "high"``: Max, Min, Mean and Norm of every floating tensor in
float64 (upstream 26.2.0 leaves Mean and Norm null at high). Checked against numpy float64
sums, on the native path and on the host fallback without the native extension."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch import leaves as leaves_mod
from msprobe.pytorch import stats as stats_mod
from msprobe.pytorch.stats import tensor_stats


def _f64(t: torch.Tensor) -> dict:
    a = t.detach().to(torch.float64).numpy().ravel()
    return {"Max": float(a.max()), "Min": float(a.min()), "Mean": math.fsum(a) / a.size,
            "Norm": math.sqrt(math.fsum(a * a))}


def _record(tmp_path, tensors, **keys):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "d"), "level": "L1", **keys}))
    dbg = PrecisionDebugger(config_path=str(cfg))
    dbg.start()
    for t in tensors:
        torch.neg(t)
    dbg.stop()
    dbg.close()
    data = json.loads((tmp_path / "d" / "step0" / "rank" / "dump.json").read_text())["data"]
    return [data[f"Torch.neg.{i}.forward"]["input_args"][0] for i in range(len(tensors))]


def _cases():
    torch.manual_seed(0)
    return [torch.randn(3, 7), (torch.randn(5000) + 1000).to(torch.float32), torch.randn(33).to(torch.bfloat16),
            (torch.randn(65) * 100).to(torch.float16), torch.randn(4, 4, dtype=torch.float64).t()]


@pytest.mark.parametrize("native", [True, False], ids=["native", "no extension"])
def test_precision_high_gives_float64_statistics(tmp_path, monkeypatch, native):
    if not native:
        monkeypatch.setattr(stats_mod, "NATIVE", None)
        monkeypatch.setattr(leaves_mod, "NATIVE", None)
    tensors = _cases()
    for t, rec in zip(tensors, _record(tmp_path, tensors, precision="high")):
        exp = _f64(t)
        assert rec["Max"] == exp["Max"] and rec["Min"] == exp["Min"], t.dtype
        assert rec["Mean"] == pytest.approx(exp["Mean"], rel=1e-13), t.dtype
        assert rec["Norm"] == pytest.approx(exp["Norm"], rel=1e-13), t.dtype


def test_high_differs_from_low_only_on_the_float32_fallback(monkeypatch):
    # 2**20 float32 values near 1000: float32 accumulation loses digits float64 keeps
    torch.manual_seed(1)
    t = (torch.rand(1 << 20) * 1e-3 + 1000).to(torch.float32)
    exp = _f64(t)
    monkeypatch.setattr(stats_mod, "NATIVE", None)
    high, low = tensor_stats(t, high=True), tensor_stats(t)
    assert high.mean == pytest.approx(exp["Mean"], rel=1e-12)  # float64 sums (float32 ones are off by ~1e-7)
    assert high.norm == pytest.approx(exp["Norm"], rel=1e-12)  # float64 sums (float32 ones are off by ~1e-7)
    assert low.mean == pytest.approx(exp["Mean"], rel=1e-6)  # float32 accumulation: close, not float64-close
    assert (low.mean, low.norm) != (high.mean, high.norm)
