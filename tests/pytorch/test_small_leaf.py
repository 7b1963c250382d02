"""The native small-tensor leaf (``fused_stats.small_leaf``, used by ``LeafBuilder.tensor_leaf``):
for the tensors it takes, the leaf equals the Python plain/general path's field for field and
numpy float64 over the same data (with summary_mode md5, the CRC-32 equals zlib's over the
C-order bytes); every other tensor gets None (the Python paths then run)."""
from __future__ import annotations

import math
import sys
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import msprobe.pytorch.leaves as leaves_mod
import msprobe.pytorch.stats as stats_mod
from msprobe.pytorch.leaves import LeafBuilder
from pt_helpers import PLAIN_FLOAT_CASES, assert_same_leaf
from store.records import Leaf
from store.schema import LEAF_FIELDS

pytestmark = pytest.mark.skipif(leaves_mod._small_leaf is None, reason="native extension not built")

TABLE = leaves_mod._small_table(leaves_mod.MEMO_MIN_BYTES)
#: the table of summary_mode md5 (None without the fused statistics + CRC-32 pass)
CRC_TABLE = (leaves_mod._small_table(leaves_mod.MEMO_MIN_BYTES, stats_mod.FUSED_CRC)
             if stats_mod.FUSED_CRC is not None else None)
needs_crc = pytest.mark.skipif(CRC_TABLE is None, reason="no fused CRC-32 pass (isal) here")


def _python_leaf(t: torch.Tensor, md5: bool = False) -> Leaf:
    """The leaf of ``t`` with the native small-leaf call switched off."""
    builder = LeafBuilder(md5=md5)
    builder._small = False
    return builder.tensor_leaf("output", (1, "k"), t)


def _zlib_crc(t: torch.Tensor) -> str:
    """CRC-32 of ``t``'s C-order bytes (bfloat16 as float32 bit patterns), with zlib."""
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.to(torch.float32)
    return format(zlib.crc32(t.numpy().tobytes()), "08x")


def _check_against_numpy(leaf: Leaf, t: torch.Tensor) -> None:
    _check_stats_against_numpy(leaf, t)
    assert (leaf.has_nan, leaf.has_inf, leaf.max_finite, leaf.min_finite, leaf.crc32) == (False, False, None, None, None)
    assert (leaf.io, leaf.path, leaf.leaf_kind, leaf.type) == ("output", (1, "k"), "tensor", "torch.Tensor")


def _check_stats_against_numpy(leaf: Leaf, t: torch.Tensor) -> None:
    a = t.detach().to(torch.float64).numpy().ravel()
    assert (leaf.max, leaf.min) == (float(a.max()), float(a.min()))
    if t.dim() == 0:
        assert leaf.mean == float(a[0]) and leaf.norm == abs(float(a[0]))
    else:
        assert leaf.mean == pytest.approx(float(a.mean()), rel=1e-12, abs=1e-300)
        assert leaf.norm == pytest.approx(float(np.sqrt((a * a).sum())), rel=1e-12, abs=1e-300)
    assert (leaf.dtype, leaf.shape, leaf.numel) == (str(t.dtype), tuple(t.shape), t.numel())
    assert leaf.requires_grad is t.requires_grad


TAKEN = {
    **{k: v for k, v in PLAIN_FLOAT_CASES.items() if k not in ("nan-inf", "inf only", "huge f64", "tiny f64")},
    "zeros": lambda: torch.zeros(7),
    "transposed": lambda: torch.randn(5, 3).t(),
    "permuted 3-d": lambda: torch.randn(2, 3, 4).permute(2, 0, 1),
    "channels_last": lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
    "size-1 dims": lambda: torch.randn(3, 1, 4).transpose(0, 2),
    "bf16 transposed": lambda: torch.randn(6, 4).to(torch.bfloat16).t(),
    "at the size limit": lambda: torch.randn(leaves_mod.MEMO_MIN_BYTES // 4),
}


@pytest.mark.parametrize("case", sorted(TAKEN))
def test_small_leaf_equals_python_path_and_numpy(case):
    torch.manual_seed(1)
    t = TAKEN[case]()
    leaf = leaves_mod._small_leaf(t, "output", (1, "k"), TABLE)
    assert type(leaf) is Leaf
    assert_same_leaf(leaf, _python_leaf(t))
    _check_against_numpy(leaf, t)


@needs_crc
@pytest.mark.parametrize("case", sorted(TAKEN))
def test_small_leaf_with_crc_equals_python_md5_path_and_zlib(case):
    torch.manual_seed(1)
    t = TAKEN[case]()
    leaf = leaves_mod._small_leaf(t, "output", (1, "k"), CRC_TABLE)
    if not t.is_contiguous():  # a CRC-32 reads C order: the Python path does the copy
        assert leaf is None
        return
    assert type(leaf) is Leaf
    assert_same_leaf(leaf, _python_leaf(t, md5=True))
    assert leaf.crc32 == _zlib_crc(t)
    plain = leaves_mod._small_leaf(t, "output", (1, "k"), TABLE)  # the same leaf less its CRC-32
    at = LEAF_FIELDS.index("crc32")
    assert plain.crc32 is None and leaf[:at] + leaf[at + 1:] == plain[:at] + plain[at + 1:]


@needs_crc
@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=0, max_size=4), seed=st.integers(0, 2**16),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]))
def test_small_leaf_with_crc_matches_zlib_for_any_dtype_and_shape(shape, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    t = (torch.randn(shape, generator=g) * 10).to(dtype)
    leaf = leaves_mod._small_leaf(t, "output", (1, "k"), CRC_TABLE)
    assert leaf is not None
    assert leaf.crc32 == _zlib_crc(t)
    assert_same_leaf(leaf, _python_leaf(t, md5=True))
    _check_stats_against_numpy(leaf, t)


def _freed() -> torch.Tensor:
    x = torch.randn(8)
    x.untyped_storage().resize_(0)
    return x


class _Sub(torch.nn.Parameter):
    pass


DECLINED = {
    "nan": lambda: torch.tensor([1.0, float("nan")]),
    "inf": lambda: torch.tensor([float("-inf"), 2.0]),
    "huge f64 (rescaled)": lambda: torch.tensor([1e300, -2e300], dtype=torch.float64),
    "tiny f64 (rescaled)": lambda: torch.tensor([1e-300, 2e-310], dtype=torch.float64),
    "above the size limit": lambda: torch.randn(leaves_mod.MEMO_MIN_BYTES // 4 + 1),
    "strided slice": lambda: torch.randn(6, 4)[:, :2],
    "broadcast": lambda: torch.randn(4).expand(3, 4),
    "empty": lambda: torch.empty(0),
    "freed storage": _freed,
    "integer": lambda: torch.arange(6),
    "bool": lambda: torch.ones(3, dtype=torch.bool),
    "complex": lambda: torch.randn(3, dtype=torch.complex64),
    "negative-bit view": lambda: torch.randn(3, dtype=torch.complex64).conj().imag,
    "meta": lambda: torch.empty(3, device="meta"),
    "Parameter subclass": lambda: _Sub(torch.randn(3)),
    "nested": lambda: torch.nested.nested_tensor([torch.randn(2), torch.randn(3)]),
    "sparse": lambda: torch.randn(3, 3).to_sparse(),
}


@pytest.mark.parametrize("case", sorted(DECLINED))
def test_small_leaf_declines_other_tensors(case):
    t = DECLINED[case]()
    assert leaves_mod._small_leaf(t, "output", (0,), TABLE) is None
    LeafBuilder(md5=False).tensor_leaf("output", (0,), t)  # the Python paths build it


def test_small_leaf_declines_torch_func_wrappers():
    got = []

    def f(v):
        got.append(leaves_mod._small_leaf(v, "input_args", (0,), TABLE))
        return (v * 2).sum()

    x = torch.tensor([1.0, -2.0, 4.0])
    torch.func.grad(f)(x)
    torch.func.functionalize(f)(x)
    torch.func.vmap(f)(x.reshape(1, 3))
    assert got == [None, None, None]


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=0, max_size=4), seed=st.integers(0, 2**16),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]),
       data=st.data())
def test_small_leaf_matches_python_path_for_any_permutation(shape, seed, dtype, data):
    g = torch.Generator().manual_seed(seed)
    t = (torch.randn(shape, generator=g) * 10).to(dtype)
    order = data.draw(st.permutations(range(len(shape))))
    t = t.permute(*order) if shape else t
    leaf = leaves_mod._small_leaf(t, "output", (1, "k"), TABLE)
    assert leaf is not None
    assert_same_leaf(leaf, _python_leaf(t))
    _check_against_numpy(leaf, t)


def test_small_leaf_bad_table():
    t = torch.randn(3)
    with pytest.raises(TypeError, match="small_leaf"):
        leaves_mod._small_leaf(t, "output", (0,), ())
    with pytest.raises(TypeError, match="tuple subclass"):
        leaves_mod._small_leaf(t, "output", (0,), TABLE[:4] + (dict,) + TABLE[5:])


def test_small_leaf_keeps_reference_counts():
    """Each leaf holds one reference to its fields; nothing leaks per call."""
    t, io, path = torch.randn(4, 4), "output-io", (3,)
    before = sys.getrefcount(io), sys.getrefcount(path), sys.getrefcount(t)
    leaves = [leaves_mod._small_leaf(t, io, path, TABLE) for _ in range(100)]
    assert (sys.getrefcount(io) - before[0], sys.getrefcount(path) - before[1]) == (100, 100)
    del leaves
    for _ in range(100):
        assert leaves_mod._small_leaf(t, io, path, TABLE) is not None
        assert leaves_mod._small_leaf(torch.tensor([math.nan]), io, path, TABLE) is None
    assert (sys.getrefcount(io), sys.getrefcount(path), sys.getrefcount(t)) == before


def test_builder_takes_the_native_leaf_only_without_payload_or_xor(monkeypatch):
    seen = []
    real = leaves_mod._small_leaf
    monkeypatch.setattr(leaves_mod, "_small_leaf", lambda t, *a: seen.append(t) or real(t, *a))
    x = torch.randn(4, 4)
    LeafBuilder(md5=False).tensor_leaf("output", (0,), x)
    assert len(seen) == 1
    LeafBuilder(md5=False, xor=True).tensor_leaf("output", (0,), x)
    LeafBuilder(md5=False, capture=lambda t: "shard:1").tensor_leaf("output", (0,), x)
    LeafBuilder(md5=False, with_data=False).tensor_leaf("output", (0,), x)
    assert len(seen) == 1
    leaf = LeafBuilder(md5=True).tensor_leaf("output", (0,), x)  # md5: with the fused CRC-32 pass only
    assert len(seen) == (1 if stats_mod.FUSED_CRC is None else 2)
    assert leaf.crc32 == _zlib_crc(x)
    monkeypatch.setattr(stats_mod, "FUSED_CRC", None)
    assert LeafBuilder(md5=True).tensor_leaf("output", (0,), x).crc32 == _zlib_crc(x)
    assert len(seen) == (1 if CRC_TABLE is None else 2)
