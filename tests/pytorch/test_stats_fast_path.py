"""Large CPU float tensors take PyTorch's fused float32 reductions (msprobe.pytorch.stats),
and statistics of a tensor recorded twice in a row are reused (msprobe.pytorch.stats_memo).
Every value is checked against numpy float64 over the same data."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pt_helpers import load_dump
from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch.stats import SMALL_NUMEL, tensor_stats
from msprobe.pytorch.stats_memo import StatsMemo

EPS32 = float(np.finfo(np.float32).eps)


def _sum_bound(a64: np.ndarray) -> float:
    """Error bound of a float32 cascade/pairwise sum: eps32 * log2(n) * sum(|x|)."""
    return EPS32 * math.log2(a64.size) * float(np.abs(a64).sum())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("offset", [0.0, 1000.0])
def test_large_float_stats_match_float64(dtype, offset):
    torch.manual_seed(3)
    n = SMALL_NUMEL * 4 + 17
    t = (torch.randn(n) * 3 + offset).to(dtype)
    s = tensor_stats(t)
    a = t.to(torch.float64).numpy()
    assert s.max == a.max() and s.min == a.min()  # exact
    assert abs(s.mean * n - a.sum()) <= _sum_bound(a)
    sq = a * a  # fp16/bf16 data with an offset has many equal values: hard for lane-wise sums
    assert abs(s.norm ** 2 - sq.sum()) <= _sum_bound(sq) * 2
    assert s.has_nan is False and s.has_inf is False


def test_large_non_contiguous_and_special_values():
    torch.manual_seed(4)
    base = torch.randn(600, 600)
    t = base.t()[::2]  # non-contiguous view, 180000 elements
    s = tensor_stats(t)
    a = t.to(torch.float64).numpy()
    assert (s.max, s.min) == (a.max(), a.min())
    assert abs(s.mean * a.size - a.sum()) <= _sum_bound(a)
    big = torch.full((SMALL_NUMEL * 2,), 3e38)  # the float32 sum and norm overflow: redone in float64
    s = tensor_stats(big)
    assert s.mean == pytest.approx(3e38, rel=1e-6)
    assert s.norm == pytest.approx(3e38 * math.sqrt(big.numel()), rel=1e-6)
    assert s.has_inf is False
    nan = torch.randn(SMALL_NUMEL * 2)
    nan[5] = float("nan")
    nan[7] = float("inf")
    s = tensor_stats(nan)
    a = nan.double().numpy()
    fin = a[np.isfinite(a)]
    assert math.isnan(s.max) and s.has_nan and s.has_inf
    assert (s.max_finite, s.min_finite) == (fin.max(), fin.min())


def test_memo_rules():
    memo = StatsMemo(enabled=True, limit=2)
    x = torch.randn(5, 4)
    memo.put(x, "sx")
    assert memo.get(x) == "sx"
    assert memo.get(x.view(5, 4)) == "sx"      # an alias of exactly the same elements
    assert memo.get(x.view(20)) is None        # other shape
    assert memo.get(x.t()) is None             # other strides
    assert memo.get(x.clone()) is None         # other memory
    x.mul_(2)                                  # in place: version bumps
    assert memo.get(x) is None
    memo.put(x, "sx2")
    y, z = torch.randn(3), torch.randn(3)
    memo.put(y, "sy")
    memo.put(z, "sz")                          # limit 2: x (the oldest) is dropped
    assert (memo.get(x), memo.get(y), memo.get(z)) == (None, "sy", "sz")
    memo.clear()
    assert memo.get(y) is None and len(memo) == 0
    off = StatsMemo(enabled=False)
    off.put(y, "sy")
    assert off.get(y) is None


def test_memo_env_switch(monkeypatch):
    monkeypatch.setenv("MSPROBE_NO_STATS_MEMO", "1")
    assert StatsMemo().enabled is False
    monkeypatch.setenv("MSPROBE_NO_STATS_MEMO", "0")
    assert StatsMemo().enabled is True


def _stats64(t: torch.Tensor) -> tuple:
    a = t.detach().to(torch.float64).numpy()
    return a.max(), a.min(), a.mean(), math.sqrt(float((a * a).sum()))


def _assert_stats(rec: dict, t: torch.Tensor) -> None:
    mx, mn, mean, norm = _stats64(t)
    assert (rec["Max"], rec["Min"]) == (mx, mn)
    assert rec["Mean"] == pytest.approx(mean, rel=1e-5, abs=1e-6)
    assert rec["Norm"] == pytest.approx(norm, rel=1e-5)


def test_writes_between_calls_are_seen(tmp_path):
    """A call's output changed before the next call (through .data, in place, by a
    collective-like raw write) is recorded with its new values as the next call's input."""
    torch.manual_seed(5)
    x = torch.randn(64, 32)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    y = torch.exp(x)
    y_before = y.clone()
    y.data.mul_(3)                  # .data: its own version counter; Tensor.mul_ is an API call
    z = torch.tanh(y)
    w = torch.sigmoid(z)            # z unchanged: may reuse the statistics of tanh's output
    dbg.stop()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    _assert_stats(data["Torch.exp.0.forward"]["output"][0], y_before)
    _assert_stats(data["Torch.tanh.0.forward"]["input_args"][0], y)
    _assert_stats(data["Torch.tanh.0.forward"]["output"][0], z)
    _assert_stats(data["Torch.sigmoid.0.forward"]["input_args"][0], z)
    _assert_stats(data["Torch.sigmoid.0.forward"]["output"][0], w)


def test_backward_with_fan_out_and_accumulation(tmp_path):
    """Gradients that flow through views and get accumulated in place by autograd's engine:
    every recorded gradient equals torch.autograd.grad's."""
    torch.manual_seed(6)
    x = torch.randn(16, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)

    def f(x, w):
        h = F.linear(x, w)
        a = torch.tanh(h)
        b = torch.sigmoid(h)      # h used twice: its gradient is accumulated
        c = a * b + h             # and a third time
        return (c * c).sum()

    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    f(x, w).backward()
    dbg.stop()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]

    xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    h = F.linear(xr, wr)
    h.retain_grad()
    a, b = torch.tanh(h), torch.sigmoid(h)
    a.retain_grad(), b.retain_grad()
    c = a * b + h
    c.retain_grad()
    (c * c).sum().backward()
    _assert_stats(data["Functional.linear.0.backward"]["input"][0], h.grad)
    _assert_stats(data["Functional.linear.0.backward"]["output"][0], xr.grad)
    _assert_stats(data["Functional.linear.0.backward"]["output"][1], wr.grad)
    _assert_stats(data["Torch.tanh.0.backward"]["input"][0], a.grad)
    _assert_stats(data["Torch.sigmoid.0.backward"]["input"][0], b.grad)


def test_small_parameters_take_the_fast_path_with_float64_values(monkeypatch):
    """Biases and norm weights are nn.Parameter: they take the few-microsecond small path
    (no general-path call) and still get float64 Mean/Norm."""
    import msprobe.pytorch.stats as stats_mod

    def general(_x):
        raise AssertionError("a small finite float32 Parameter took the general path")

    monkeypatch.setattr(stats_mod, "_host_stats", general)
    torch.manual_seed(6)
    p = torch.nn.Parameter(torch.randn(257) * 1e3 + 0.1)
    s = tensor_stats(p)
    a = p.detach().double().numpy()
    assert (s.max, s.min) == (a.max(), a.min())
    assert s.mean == pytest.approx(float(a.sum()) / a.size, rel=1e-15, abs=0)
    assert s.norm == pytest.approx(math.sqrt(float(np.dot(a, a))), rel=1e-15)
    assert p.requires_grad and p.grad is None  # untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int32])
def test_dense_permuted_views_read_in_memory_order(dtype, monkeypatch):
    """x.permute(...) of a contiguous x is read where it lies (no C-order copy); the values
    equal numpy float64 over the view's own elements."""
    torch.manual_seed(11)
    base = (torch.randn(6, 50, 70) * 5).to(dtype)
    view = base.permute(2, 0, 1)
    assert not view.is_contiguous()
    copies = []
    original = torch.Tensor.contiguous

    def counting(self, *args, **kwargs):
        if not self.is_contiguous():
            copies.append(self.shape)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "contiguous", counting)
    s = tensor_stats(view)
    monkeypatch.setattr(torch.Tensor, "contiguous", original)
    assert copies == []
    a = view.to(torch.float64).contiguous().numpy()
    assert (s.max, s.min) == (a.max(), a.min())
    assert abs(s.mean * a.size - a.sum()) <= _sum_bound(a) + 1e-9
    assert s.norm == pytest.approx(math.sqrt(float((a * a).sum())), rel=1e-6)
    gap = base[:, ::2, :]                      # not dense: copied, same answer
    g = gap.to(torch.float64).contiguous().numpy()
    sg = tensor_stats(gap)
    assert (sg.max, sg.min) == (g.max(), g.min())
    assert sg.norm == pytest.approx(math.sqrt(float((g * g).sum())), rel=1e-6)
