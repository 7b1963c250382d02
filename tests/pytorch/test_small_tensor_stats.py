"""Small contiguous CPU tensors are reduced at every record, without the statistics memo
(``msprobe.pytorch.leaves.MEMO_MIN_BYTES``); larger ones go through it. Both give the
statistics numpy computes in float64 from the values as they were when recorded."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

import msprobe.pytorch.leaves as leaves_mod
from msprobe.pytorch.leaves import LeafBuilder
from pt_helpers import load_dump
from msprobe.pytorch import PrecisionDebugger


def _expect(leaf, values: np.ndarray) -> None:
    a = values.astype(np.float64)
    assert (leaf.max, leaf.min) == (float(a.max()), float(a.min()))
    assert leaf.mean == pytest.approx(a.mean(), rel=1e-6)
    assert leaf.norm == pytest.approx(np.sqrt((a * a).sum()), rel=1e-6)


def test_small_tensor_is_reduced_without_the_memo():
    builder = LeafBuilder(md5=False)
    builder.memo.layout_free = True
    x = torch.randn(32, 32)  # 4 KiB
    assert x.numel() * x.element_size() <= leaves_mod.MEMO_MIN_BYTES
    first = builder.tensor_leaf("output", (0,), x)
    again = builder.tensor_leaf("input_args", (0,), x)
    assert len(builder.memo) == 0 and builder.memo.hits == 0
    _expect(first, x.numpy())
    assert again == first.replace(io="input_args")


def test_large_tensor_goes_through_the_memo():
    builder = LeafBuilder(md5=False)
    builder.memo.layout_free = True
    n = leaves_mod.MEMO_MIN_BYTES // 4 + 1  # one float32 more than the bound
    x = torch.randn(n)
    first = builder.tensor_leaf("output", (0,), x)
    again = builder.tensor_leaf("input_args", (0,), x)
    assert len(builder.memo) == 1 and builder.memo.hits == 1
    _expect(first, x.numpy())
    assert (again.max, again.min, again.mean, again.norm) == (first.max, first.min, first.mean, first.norm)


def test_small_tensor_written_in_place_between_records(tmp_path):
    """Each record of a small tensor written in place between two calls holds the values of
    its own moment, with no write rule involved (``.data`` writes bump no version of ``x``)."""
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    x = torch.randn(8, 8)
    dbg.start()
    y = torch.tanh(x)
    seen = y.clone()
    y.data.mul_(3)      # through an alias with its own version counter
    z = torch.sigmoid(y)
    dbg.stop()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    out = data["Torch.tanh.0.forward"]["output"][0]
    inp = data["Torch.sigmoid.0.forward"]["input_args"][0]
    a, b = seen.numpy().astype(np.float64), (seen * 3).numpy().astype(np.float64)
    assert (out["Max"], out["Min"]) == (float(a.max()), float(a.min()))
    assert (inp["Max"], inp["Min"]) == (float(b.max()), float(b.min()))
    assert inp["Norm"] == pytest.approx(np.sqrt((b * b).sum()), rel=1e-6)
    assert torch.isfinite(z).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_small_tensor_md5_on_the_plain_path(dtype, monkeypatch):
    """summary_mode md5: a small contiguous tensor gets its statistics and CRC-32 from the
    fused pass without the memo, the same leaf the general path (memo for every size) gives,
    and the CRC-32 zlib computes over its bytes."""
    torch.manual_seed(1)
    x = (torch.randn(16, 24) * 3).to(dtype)
    builder = LeafBuilder(md5=True)
    small = builder.tensor_leaf("output", (0,), x)
    assert len(builder.memo) == 0
    assert small.crc32 == format(zlib.crc32(x.numpy().tobytes()) & 0xFFFFFFFF, "08x")
    _expect(small, x.numpy())
    monkeypatch.setattr(leaves_mod, "MEMO_MIN_BYTES", -1)
    general = LeafBuilder(md5=True).tensor_leaf("output", (0,), x)
    assert small == general
