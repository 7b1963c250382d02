"""The plain-tensor path of ``LeafBuilder.tensor_leaf`` (``_plain_leaf``: statistics and payload, a
plain contiguous CPU float tensor) gives the leaf the general path gives, and shares the
statistics memo with it. Values are checked against numpy float64 over the same data."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from msprobe.pytorch import stats as stats_mod
import msprobe.pytorch.leaves as leaves_mod
from msprobe.pytorch.leaves import LeafBuilder
from pt_helpers import PLAIN_FLOAT_CASES, assert_same_leaf

pytestmark = pytest.mark.skipif(stats_mod.NATIVE is None, reason="native statistics pass not built")


def _general(t: torch.Tensor):
    """The leaf of ``t`` through the general path (a builder whose plain path is off: the
    path requires ``memo.layout_free``, which only changes how the memo keys tensors)."""
    builder = LeafBuilder(md5=False)
    builder.memo.layout_free = False
    return builder.tensor_leaf("output", (0,), t)


def _expected(t: torch.Tensor) -> dict:
    a = t.detach().to(torch.float64).numpy().ravel()
    finite = a[np.isfinite(a)]
    has_nan, has_inf = bool(np.isnan(a).any()), bool(np.isinf(a).any())
    out = {"has_nan": has_nan, "has_inf": has_inf}
    if has_nan:
        out["max"] = out["min"] = math.nan
    else:
        out["max"], out["min"] = float(a.max()), float(a.min())
    if has_nan or has_inf:
        out["max_finite"] = float(finite.max()) if finite.size else None
        out["min_finite"] = float(finite.min()) if finite.size else None
    return out


CASES = {**PLAIN_FLOAT_CASES, "zeros": lambda: torch.zeros(6)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_plain_leaf_equals_general_leaf(case):
    torch.manual_seed(0)
    t = CASES[case]()
    fast = LeafBuilder(md5=False).tensor_leaf("output", (0,), t)
    slow = _general(t)
    assert_same_leaf(fast, slow)
    for field, value in _expected(t).items():
        got = getattr(fast, field)
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(got), field
        else:
            assert got == value, (field, got, value)
    a = t.detach().to(torch.float64).numpy().ravel()
    if np.isfinite(a).all():
        scale = float(np.abs(a).max()) or 1.0  # numpy's own sum of squares over/underflows at 1e±300
        assert fast.mean == pytest.approx(float((a / scale).mean()) * scale, rel=1e-12, abs=0.0)
        norm = float(np.sqrt(np.sum((a / scale) ** 2))) * scale if t.dim() else abs(float(a[0]))
        assert fast.norm == pytest.approx(norm, rel=1e-12, abs=0.0)
    assert fast.shape == tuple(t.shape) and fast.numel == t.numel() and fast.dtype == str(t.dtype)
    assert fast.requires_grad == t.requires_grad


@pytest.mark.usefixtures("memo_all_sizes")
def test_plain_and_general_paths_share_the_memo():
    builder = LeafBuilder(md5=False)
    x = torch.randn(8, 6)
    first = builder.tensor_leaf("output", (0,), x.t())  # not contiguous: general path, memo keyed by block
    assert builder.memo.hits == 0
    again = builder.tensor_leaf("input_args", (0,), x)  # contiguous: plain path, same block of memory
    assert builder.memo.hits == 1
    assert (again.max, again.min, again.norm) == (first.max, first.min, first.norm)
    assert again.mean == pytest.approx(first.mean, rel=1e-12)
    x.mul_(2)  # an in-place change bumps the version: no reuse
    changed = builder.tensor_leaf("input_args", (0,), x)
    assert builder.memo.hits == 1
    assert changed.max == float(x.max())


def test_plain_path_not_taken_for_crc_or_noncontiguous():
    x = torch.randn(4, 4)
    md5 = LeafBuilder(md5=True).tensor_leaf("output", (0,), x)
    assert md5.crc32 is not None  # CRC-32 needs the general path
    neg = torch.randn(3, dtype=torch.complex64).conj().imag  # a negative-bit view
    assert neg.is_neg()
    leaf = LeafBuilder(md5=False).tensor_leaf("output", (0,), neg)
    a = neg.resolve_neg().numpy().astype(np.float64)
    assert leaf.max == float(a.max()) and leaf.min == float(a.min())


def _spy(monkeypatch) -> list:
    """Count the leaves the plain path made: ``LeafBuilder._plain_leaf`` and its native
    part ``leaves._small_leaf`` (each returns None for the tensors it does not take)."""
    calls = []
    real = LeafBuilder._plain_leaf

    def spy(self, *args):
        leaf = real(self, *args)
        if leaf is not None:
            calls.append(args[2])
        return leaf

    monkeypatch.setattr(LeafBuilder, "_plain_leaf", spy)
    real_small = leaves_mod._small_leaf
    if real_small is not None:
        def small_spy(t, *args):
            leaf = real_small(t, *args)
            if leaf is not None:
                calls.append(t)
            return leaf

        monkeypatch.setattr(leaves_mod, "_small_leaf", small_spy)
    return calls


@pytest.mark.parametrize("case", sorted(CASES))
def test_plain_path_is_taken(monkeypatch, case):
    """The cases compared above do go through the plain path (else the comparison with the
    general path proves nothing)."""
    calls = _spy(monkeypatch)
    LeafBuilder(md5=False).tensor_leaf("output", (0,), CASES[case]())
    assert len(calls) == 1


def test_plain_path_with_payload_capture(monkeypatch):
    """Task tensor: the plain path captures every record's payload (memo hits too) and
    gives the statistics of the general path (numpy float64 here)."""
    calls = _spy(monkeypatch)
    captured = []
    builder = LeafBuilder(md5=False, capture=lambda t: captured.append(t) or f"shard:{len(captured)}")
    x = torch.randn(64, 33, dtype=torch.float32)
    first = builder.tensor_leaf("output", (0,), x)
    again = builder.tensor_leaf("input_args", (0,), x)  # memo hit: statistics reused, payload captured
    assert len(calls) == 2 and builder.memo.hits == 1
    assert [c is x for c in captured] == [True, True]
    assert (first.payload, again.payload) == ("shard:1", "shard:2")
    a = x.numpy().astype(np.float64)
    for leaf in (first, again):
        assert (leaf.max, leaf.min) == (float(a.max()), float(a.min()))
        assert leaf.mean == pytest.approx(a.mean(), rel=1e-12)
        assert leaf.norm == pytest.approx(np.sqrt((a * a).sum()), rel=1e-12)
        assert (leaf.dtype, leaf.shape, leaf.numel) == ("torch.float32", (64, 33), 64 * 33)
    none = LeafBuilder(md5=False, capture=lambda t: None).tensor_leaf("output", (0,), x)
    assert none.payload is None and none.max == float(a.max())  # unreadable payload: statistics stay


def test_plain_path_not_taken_for_other_tensors(monkeypatch):
    """CRC-32 of a tensor above MEMO_MIN_BYTES, negative-bit views, channels_last and
    transposed tensors above MEMO_MIN_BYTES, empty, freed-storage, integer and
    Parameter-subclass tensors take the general path."""
    calls = _spy(monkeypatch)
    x = torch.randn(4, 4)
    LeafBuilder(md5=True).tensor_leaf("output", (0,), torch.randn(leaves_mod.MEMO_MIN_BYTES // 4 + 1))
    freed = torch.randn(8)
    freed.untyped_storage().resize_(0)

    class Sub(torch.nn.Parameter):
        pass

    others = [torch.randn(3, dtype=torch.complex64).conj().imag,
              torch.randn(2, 3, 40, 50).to(memory_format=torch.channels_last), torch.randn(80, 60).t(), torch.empty(0),
              freed, torch.arange(6), Sub(torch.randn(3))]
    for t in others:
        LeafBuilder(md5=False).tensor_leaf("output", (0,), t)
    assert calls == []


def test_plain_path_declines_torch_func_wrappers(monkeypatch):
    """Inside torch.func.grad / vmap (data_ptr raises) and functionalize (data_ptr 0) the
    plain path makes no leaf; the general path records the wrapped values (numpy float64)."""
    calls = _spy(monkeypatch)
    x = torch.tensor([1.0, -2.0, 4.0])
    got = {}

    def f(name):
        def inner(v):
            got[name] = LeafBuilder(md5=False).tensor_leaf("input_args", (0,), v)
            return (v * 2).sum()
        return inner

    torch.func.grad(f("grad"))(x)
    torch.func.functionalize(f("functionalize"))(x)
    torch.func.vmap(f("vmap"))(x.reshape(1, 3))
    assert calls == []
    for name in ("grad", "functionalize"):
        leaf = got[name]
        assert (leaf.max, leaf.min, leaf.numel) == (4.0, -2.0, 3), name
        assert leaf.mean == pytest.approx(1.0, rel=1e-12) and leaf.norm == pytest.approx(math.sqrt(21.0), rel=1e-12)
    assert got["vmap"].max is None and got["vmap"].shape == (3,)  # a batched tensor: no one tensor's values
