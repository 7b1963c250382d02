"""Statistics and CRC-32 in one pass (summary_mode md5): ``fused_stats.reduce_crc_at``
and its use by ``LeafBuilder.tensor_leaf``.

The six statistics of ``reduce_crc_at`` must be bit-identical to ``reduce_at``'s over the same
buffer (same kernels, same order), and its CRC-32 equal to ``zlib.crc32`` of the expected bytes,
computed independently with numpy: the raw bytes for float32/float64/float16, the float32
values' bytes (bit pattern << 16) for bfloat16. Both the AVX2 and the portable kernels are run.
End to end, a recorded L1 md5 step must write md5 values equal to zlib.crc32 of the tensors'
bytes and statistics equal to numpy float64 ones, through the fused path, and the same
dump.json as the two-pass fallback.
"""
from __future__ import annotations

import json
import math
import struct
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from msprobe._native import KIND_BF16, KIND_F16, KIND_F32, KIND_F64
from msprobe.core.checksum import C_CRC32
from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch import leaves as leaves_mod
from msprobe.pytorch import stats as stats_mod
from msprobe.pytorch.leaves import LeafBuilder
from pt_helpers import PLAIN_FLOAT_CASES, assert_same_leaf, load_dump

NATIVE = stats_mod.NATIVE
pytestmark = pytest.mark.skipif(NATIVE is None or not hasattr(NATIVE, "reduce_crc_at") or C_CRC32 is None,
                                reason="native pass with reduce_crc_at, or isal's C CRC-32, unavailable")

BLOCK = 4096  # fused_stats.c's first-level block
SIZES = [1, 7, 15, 16, 17, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 5, (1 << 17) + 3]  # the last > GIL_FREE_MIN
KINDS = {"f32": KIND_F32, "f64": KIND_F64, "bf16": KIND_BF16, "f16": KIND_F16}


def _portables() -> list[bool]:
    return [False, True] if NATIVE is not None and NATIVE.isa() != "generic" else [True]


def _array(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` values of ``kind`` as numpy (bfloat16: uint16 bit patterns of truncated float32)."""
    v = rng.standard_normal(n) * 3.0
    if kind == "f32":
        return v.astype(np.float32)
    if kind == "f64":
        return v
    if kind == "f16":
        return v.astype(np.float16)
    return (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _expected_crc(kind: str, a: np.ndarray) -> int:
    if kind == "bf16":  # the float32 values: bits << 16, native (little-endian) byte order
        return zlib.crc32((a.astype(np.uint32) << 16).astype(np.uint32).tobytes())
    return zlib.crc32(a.tobytes())


def _bits(values) -> tuple:
    """Floats as their IEEE bit patterns (bit-for-bit comparison, NaN included)."""
    return tuple(struct.pack("<d", v) if isinstance(v, float) else v for v in values)


def _check(kind: str, a: np.ndarray, portable: bool) -> None:
    got = NATIVE.reduce_crc_at(a.ctypes.data, a.size, KINDS[kind], C_CRC32, portable)
    plain = NATIVE.reduce_at(a.ctypes.data, a.size, KINDS[kind], portable)
    assert len(got) == 7
    assert _bits(got[:6]) == _bits(plain), (kind, a.size, got, plain)
    assert got[6] == _expected_crc(kind, a), (kind, a.size, portable)


@pytest.mark.parametrize("portable", _portables())
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_statistics_identical_and_crc_equals_zlib(kind, n, portable):
    _check(kind, _array(kind, n, np.random.default_rng(n)), portable)


@pytest.mark.parametrize("portable", _portables())
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("special", ["nan", "inf", "-inf", "nan+inf"])
def test_nan_and_inf(kind, special, portable):
    for n in (5, BLOCK + 9, (1 << 17) + 3):
        a = _array(kind, n, np.random.default_rng(7))
        values = {"nan": [math.nan], "inf": [math.inf], "-inf": [-math.inf], "nan+inf": [math.nan, math.inf]}[special]
        for j, v in enumerate(values):
            pos = (n // 2 + 3 * j) % n
            if kind == "bf16":
                a[pos] = np.array([v], np.float32).view(np.uint32)[0] >> 16
            else:
                a[pos] = v
        _check(kind, a, portable)
        mx, mn, _, _, has_nan, has_inf, _ = NATIVE.reduce_crc_at(a.ctypes.data, n, KINDS[kind], C_CRC32, portable)
        assert has_nan == ("nan" in special)
        if "nan" in special:
            assert math.isnan(mx) and math.isnan(mn)
        else:
            assert has_inf and math.isinf(mx if special == "inf" else mn)


@settings(max_examples=60, deadline=None)
@given(a=hnp.arrays(np.float32, st.integers(1, 9000), elements=st.floats(width=32, allow_nan=True)),
       portable=st.booleans())
def test_float32_property(a, portable):
    _check("f32", a, portable and NATIVE.isa() != "generic")


@settings(max_examples=60, deadline=None)
@given(bits=hnp.arrays(np.uint16, st.integers(1, 9000)), portable=st.booleans(),
       kind=st.sampled_from(["bf16", "f16"]))
def test_16_bit_property(bits, portable, kind):
    a = bits if kind == "bf16" else bits.view(np.float16)
    _check(kind, a, portable and NATIVE.isa() != "generic")


def test_bad_arguments():
    a = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="kind"):
        NATIVE.reduce_crc_at(a.ctypes.data, 4, 7, C_CRC32)
    with pytest.raises(ValueError, match="kind"):
        NATIVE.reduce_crc_at(a.ctypes.data, 4, -1, C_CRC32)
    with pytest.raises(ValueError, match="at least one element"):
        NATIVE.reduce_crc_at(a.ctypes.data, 0, KIND_F32, C_CRC32)
    with pytest.raises(ValueError, match="at least one element"):
        NATIVE.reduce_crc_at(a.ctypes.data, -3, KIND_F32, C_CRC32)
    with pytest.raises(ValueError, match="address is 0"):
        NATIVE.reduce_crc_at(0, 4, KIND_F32, C_CRC32)
    with pytest.raises(ValueError, match="crc_fn_address is 0"):
        NATIVE.reduce_crc_at(a.ctypes.data, 4, KIND_F32, 0)
    with pytest.raises(TypeError, match="4 or 5 arguments"):
        NATIVE.reduce_crc_at(a.ctypes.data, 4, KIND_F32)
    with pytest.raises(TypeError):
        NATIVE.reduce_crc_at(a.ctypes.data, 4, KIND_F32, "crc")


def test_fused_stats_crc_without_address(monkeypatch):
    monkeypatch.setattr(stats_mod, "FUSED_CRC", None)
    with pytest.raises(ValueError, match="FUSED_CRC is None"):
        stats_mod.fused_stats_crc(torch.ones(3), KIND_F32)


# ------------------------------------------------------------------ the leaf builder


FUSED_CASES = {**PLAIN_FLOAT_CASES,
               "f32 large": lambda: torch.randn(70001),   # crosses the GIL-free threshold
               "bf16 blocks": lambda: torch.randn(4099).to(torch.bfloat16)}  # a block and a tail
#: not contiguous: copied in C order into the leaf builder's scratch buffer, then fused
SCRATCH_CASES = {
    "transposed": lambda: torch.randn(4, 6).t(),
    "strided": lambda: torch.randn(20)[::3],
    "transposed bf16": lambda: torch.randn(70, 40).to(torch.bfloat16).t(),
    "transposed large": lambda: torch.randn(300, 400).t(),  # 480 KB: crosses the GIL-free threshold
}
GENERAL_CASES = {  # not fused: the two-pass path
    "neg view": lambda: torch._neg_view(torch.randn(5)),
    "int64": lambda: torch.arange(7),
    "empty": lambda: torch.empty(0, 3),
    "complex": lambda: torch.randn(4, dtype=torch.complex64),
    "bool": lambda: torch.tensor([True, False]),
}


@pytest.fixture
def spy(monkeypatch):
    """Counts the tensors that took the fused statistics + CRC-32 pass, by kind: calls of
    ``stats.fused_stats_crc`` and leaves the native ``small_leaf`` built with a CRC-32."""
    calls = []
    real = stats_mod.fused_stats_crc

    def counting(t, kind):
        calls.append(kind)
        return real(t, kind)

    monkeypatch.setattr(stats_mod, "fused_stats_crc", counting)
    small = leaves_mod._small_leaf
    if small is not None:
        def counting_small(t, io, path, table):
            leaf = small(t, io, path, table)
            if leaf is not None and table[7]:
                calls.append(stats_mod.NATIVE_KIND[t.dtype])
            return leaf

        monkeypatch.setattr(leaves_mod, "_small_leaf", counting_small)
    return calls


def _crc_of(t: torch.Tensor) -> str:
    """zlib CRC-32 of the C-order bytes, bfloat16 as float32 bit patterns (numpy only)."""
    t = t.detach().resolve_neg().contiguous()
    if t.dtype == torch.bfloat16:
        data = (t.view(torch.int16).numpy().view(np.uint16).astype(np.uint32) << 16).tobytes()
    else:
        data = t.numpy().tobytes()
    return format(zlib.crc32(data) & 0xFFFFFFFF, "08x")


@pytest.mark.parametrize("case", sorted(SCRATCH_CASES))
def test_non_contiguous_leaf_fused_on_c_order_copy(case, spy, monkeypatch):
    """A non-contiguous view is copied in C order into a reused scratch buffer and reduced by
    the fused pass: its CRC-32 is that of its C-order bytes, Max/Min equal the two-pass
    leaf's exactly, Mean/Norm to the last bits (the two-pass statistics of a dense view sum
    in memory order, the fused pass in C order), and numpy float64 agrees."""
    torch.manual_seed(0)
    t = SCRATCH_CASES[case]()
    assert not t.is_contiguous()
    builder = LeafBuilder(md5=True)
    fused = builder.tensor_leaf("output", (0,), t)
    assert len(spy) == 1
    assert fused.crc32 == _crc_of(t)
    monkeypatch.setattr(stats_mod, "FUSED_CRC", None)
    two_pass = LeafBuilder(md5=True).tensor_leaf("output", (0,), t)
    for field in ("dtype", "shape", "numel", "max", "min", "crc32", "has_nan", "has_inf", "requires_grad"):
        assert getattr(fused, field) == getattr(two_pass, field), field
    a = t.detach().to(torch.float64).numpy()
    for field, exp in (("mean", a.mean()), ("norm", np.sqrt((a * a).sum()))):
        assert getattr(fused, field) == pytest.approx(getattr(two_pass, field), rel=1e-14)
        assert getattr(fused, field) == pytest.approx(float(exp), rel=1e-12)
    # the buffer is reused: a second view of another shape reads its own values
    u = torch.arange(12.0).reshape(3, 4).t()
    monkeypatch.setattr(stats_mod, "FUSED_CRC", stats_mod._fused_crc_address())
    again = builder.tensor_leaf("output", (0,), u)
    assert (again.max, again.min, again.crc32) == (11.0, 0.0, _crc_of(u))


def test_scratch_limit_and_odd_views(spy):
    """Views larger than SCRATCH_BYTES take the two passes; so do neg views (not a kind the
    pass reads) - and every CRC is still that of the C-order bytes."""
    big = torch.randn(1100, 1000).t()  # 4.4 MB > 4 MiB
    leaf = LeafBuilder(md5=True).tensor_leaf("output", (0,), big)
    assert len(spy) == 0 and leaf.crc32 == _crc_of(big)
    assert leaf.max == float(big.max()) and leaf.min == float(big.min())
    neg = torch._neg_view(torch.randn(6, 5)).t()  # transposed negative-bit view
    leaf = LeafBuilder(md5=True).tensor_leaf("output", (0,), neg)
    assert len(spy) == 0 and leaf.crc32 == _crc_of(neg.resolve_neg())
    assert leaf.max == float(neg.max()) and leaf.min == float(neg.min())


@pytest.mark.parametrize("case", sorted(FUSED_CASES) + sorted(GENERAL_CASES))
def test_leaf_equals_two_pass_leaf(case, spy, monkeypatch):
    torch.manual_seed(0)
    t = {**FUSED_CASES, **GENERAL_CASES}[case]()
    fused = LeafBuilder(md5=True).tensor_leaf("output", (0,), t)
    assert len(spy) == (1 if case in FUSED_CASES else 0)
    if t.dtype in stats_mod.NATIVE_KIND:
        assert fused.crc32 == _crc_of(t)
    monkeypatch.setattr(stats_mod, "FUSED_CRC", None)
    two_pass = LeafBuilder(md5=True).tensor_leaf("output", (0,), t)
    assert len(spy) == (1 if case in FUSED_CASES else 0)
    assert_same_leaf(fused, two_pass)


def test_memo_and_capture_kept(spy):
    """The memo answers the second record (no second pass); a capture (task tensor) still runs."""
    captured = []
    builder = LeafBuilder(md5=True, capture=lambda t: captured.append(t) or f"p{len(captured)}")
    t = torch.randn(300)
    first = builder.tensor_leaf("input_args", (0,), t)
    second = builder.tensor_leaf("output", (0,), t)
    assert len(spy) == 1 and builder.memo.hits == 1
    assert [first.payload, second.payload] == ["p1", "p2"] and captured == [t, t]
    assert first.crc32 == second.crc32 == _crc_of(t)
    assert (first.max, first.min) == (float(t.max()), float(t.min()))
    t.add_(1.0)  # a new version: recomputed
    third = builder.tensor_leaf("output", (1,), t)
    assert len(spy) == 2 and third.crc32 == _crc_of(t)


# ------------------------------------------------------------------ end to end


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(40, 30)
        self.fc2 = torch.nn.Linear(30, 5)

    def forward(self, x):
        return torch.relu(self.fc2(torch.tanh(self.fc1(x))))


def _record_step(tmp_path, name: str) -> tuple[dict, dict]:
    """One recorded L1 md5 step (forward, backward, ops on bf16/f16/f64): dump.json and the
    tensors of a few calls, by dump name."""
    torch.manual_seed(3)
    net = _Net()
    x = torch.randn(64, 40)
    b = torch.randn(5000).to(torch.bfloat16)
    d = torch.randn(70001, dtype=torch.float64)
    h = (torch.randn(33) * 10).to(torch.float16)
    cfg = tmp_path / f"{name}.json"
    cfg.write_text(json.dumps({"task": "statistics", "level": "L1", "dump_path": str(tmp_path / name),
                               "statistics": {"summary_mode": "md5"}}))
    dbg = PrecisionDebugger(config_path=str(cfg))
    dbg.start()
    out = net(x)
    out.sum().backward()
    sb = torch.sin(b)
    cd = torch.cos(d)
    ah = torch.abs(h)
    dbg.stop()
    dbg.step()
    dbg.close()
    tensors = {"Torch.sin.0.forward": (b, sb), "Torch.cos.0.forward": (d, cd), "Torch.abs.0.forward": (h, ah),
               "Torch.relu.0.forward": (None, out)}
    return load_dump(tmp_path / name)[0], tensors


def _check_record(rec: dict, t: torch.Tensor) -> None:
    a = t.detach().to(torch.float64).numpy().ravel()
    assert rec["md5"] == _crc_of(t)
    assert rec["Max"] == float(a.max()) and rec["Min"] == float(a.min())
    assert rec["Mean"] == pytest.approx(float(a.mean()), rel=1e-12, abs=1e-15)
    assert rec["Norm"] == pytest.approx(float(np.sqrt(np.dot(a, a))), rel=1e-12)


def test_recorded_step_md5_and_statistics(tmp_path, spy, monkeypatch):
    dump, tensors = _record_step(tmp_path, "fused")
    data = dump["data"]
    assert len(spy) >= 8  # at least the tensors checked below, each reduced once
    assert set(spy) == {KIND_F32, KIND_F64, KIND_BF16, KIND_F16}
    for name, (inp, outp) in tensors.items():
        if inp is not None:
            _check_record(data[name]["input_args"][0], inp)
        _check_record(data[name]["output"][0], outp)
    md5_records = 0
    for entry in data.values():
        for io in ("input_args", "output"):
            for rec in entry.get(io) or []:
                if isinstance(rec, dict) and rec.get("type") == "torch.Tensor" and rec.get("Max") is not None:
                    assert len(rec["md5"]) == 8 and int(rec["md5"], 16) >= 0
                    md5_records += 1
    assert md5_records >= 10

    calls = len(spy)
    monkeypatch.setattr(stats_mod, "FUSED_CRC", None)
    fallback, _ = _record_step(tmp_path, "two_pass")
    assert len(spy) == calls  # the fallback never calls the fused path
    assert fallback == dump


def test_leaves_reads_the_stats_module_switch(monkeypatch, spy):
    """leaves.py looks FUSED_CRC up on the stats module at call time (tests and the
    fallback switch it there)."""
    real = stats_mod.FUSED_CRC
    monkeypatch.setattr(stats_mod, "FUSED_CRC", None)
    LeafBuilder(md5=True).tensor_leaf("output", (0,), torch.ones(3))
    assert spy == []
    monkeypatch.setattr(stats_mod, "FUSED_CRC", real)
    LeafBuilder(md5=True).tensor_leaf("output", (0,), torch.ones(3))
    assert len(spy) == 1
    assert leaves_mod._native_kind(torch.ones(3)) == KIND_F32
    assert leaves_mod._native_kind(torch.ones(3, dtype=torch.int32)) is None


def test_self_test_guards(monkeypatch):
    """FUSED_CRC stays None when the extension, its reduce_crc_at, or a correct CRC is missing."""
    assert stats_mod._fused_crc_address() == C_CRC32

    class Wrong:  # a build whose fused CRC disagrees with zlib
        reduce_at = staticmethod(NATIVE.reduce_at)

        @staticmethod
        def reduce_crc_at(address, n, kind, fn, portable=False):
            return (*NATIVE.reduce_at(address, n, kind), 12345)

    monkeypatch.setattr(stats_mod, "NATIVE", Wrong)
    assert stats_mod._fused_crc_address() is None
    monkeypatch.setattr(stats_mod, "NATIVE", type("Old", (), {"reduce_at": staticmethod(NATIVE.reduce_at)}))
    assert stats_mod._fused_crc_address() is None
    monkeypatch.setattr(stats_mod, "NATIVE", NATIVE)
    monkeypatch.setattr(stats_mod, "C_CRC32", None)
    assert stats_mod._fused_crc_address() is None
