"""The optional one-pass statistics extension (msprobe._native.fused_stats) and its
use by msprobe.pytorch.stats and msprobe.core.arrays, with the numpy/torch fallback.

References are computed independently in float64 with numpy and ``math.fsum`` (exactly
rounded sums): Max/Min must be equal, the float64 sum within 1e-12 of ``sum(|x|)`` and the
sum of squares within 1e-12 relative. Kernel tests run both the AVX2 kernels (where the CPU
has them) and the portable ones. Where the package was installed without the extension but a
C compiler exists, the module is built into a temporary folder with setup.py, so these
tests (and the check that the C source compiles) still run.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import math
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import msprobe.core.arrays as arrays_mod
import msprobe.pytorch.stats as stats_mod
from msprobe._native import KIND_BF16, KIND_F16, KIND_F32, KIND_F64, load_fused_stats

REPO = Path(__file__).resolve().parent.parent
BLOCK = 4096  # fused_stats.c's first-level block
SIZES = list(range(1, 18)) + [31, 32, 33, 63, 64, 65, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 17, 70001]


def _build_in(tmp: Path):
    """Build the extension with the repository's setup.py into ``tmp`` and load it; None if
    no C compiler or setuptools is available."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return None
    if importlib.util.find_spec("setuptools") is None:
        return None
    proc = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp / "lib"),
                           "--build-temp", str(tmp / "tmp")], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    built = list((tmp / "lib").rglob("fused_stats*" + (importlib.machinery.EXTENSION_SUFFIXES[0])))
    assert built, f"a C compiler exists but the extension did not build:\n{proc.stdout}\n{proc.stderr}"
    loader = importlib.machinery.ExtensionFileLoader("msprobe._native.fused_stats", str(built[0]))
    spec = importlib.util.spec_from_file_location("msprobe._native.fused_stats", built[0], loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """The installed extension, else one built from the source now; skip if neither."""
    if os.environ.get("MSPROBE_NO_NATIVE_STATS", "") in ("", "0"):
        installed = load_fused_stats()
        if installed is not None:
            return installed
    built = _build_in(tmp_path_factory.mktemp("native"))
    if built is None:
        pytest.skip("no C compiler: msprobe._native.fused_stats cannot be built here")
    return built


@pytest.fixture
def use_native(native, monkeypatch):
    """msprobe.pytorch.stats and msprobe.core.arrays with the extension in use."""
    monkeypatch.setattr(stats_mod, "NATIVE", native)
    monkeypatch.setattr(arrays_mod, "NATIVE", native)
    return native


@pytest.fixture
def no_native(monkeypatch):
    """The extension absent: the numpy/torch fallback."""
    monkeypatch.setattr(stats_mod, "NATIVE", None)
    monkeypatch.setattr(arrays_mod, "NATIVE", None)


def _kernels(native):
    return [False, True] if native.isa() != "generic" else [False]


# ------------------------------------------------------------------ reference

def _ref(a64: np.ndarray) -> dict:
    """Independent float64 reference of max, min, sum, sumsq, has_nan, has_inf."""
    nan, inf = bool(np.isnan(a64).any()), bool(np.isinf(a64).any())
    out = {"has_nan": nan, "has_inf": inf}
    if nan:
        out.update(max=math.nan, min=math.nan, sum=math.nan, sumsq=math.nan)
        return out
    out["max"], out["min"] = float(a64.max()), float(a64.min())
    if inf:
        pos, neg = bool((a64 == math.inf).any()), bool((a64 == -math.inf).any())
        out["sum"] = math.nan if pos and neg else (math.inf if pos else -math.inf)
        out["sumsq"] = math.inf
        return out
    out["sum"] = math.fsum(a64)
    out["abs"] = math.fsum(np.abs(a64))
    with np.errstate(over="ignore", under="ignore"):
        out["sumsq"] = math.fsum(a64 * a64)  # float64 input: squares may overflow to inf
    return out


def _same(x: float, y: float) -> bool:
    return (math.isnan(x) and math.isnan(y)) or x == y


def _check(result: tuple, a64: np.ndarray) -> None:
    mx, mn, total, squares, has_nan, has_inf = result
    ref = _ref(a64)
    assert (has_nan, has_inf) == (ref["has_nan"], ref["has_inf"])
    assert _same(mx, ref["max"]) and _same(mn, ref["min"]), (mx, mn, ref)
    if "abs" not in ref:  # non-finite data: the sums are what IEEE arithmetic gives
        assert _same(total, ref["sum"]) and _same(squares, ref["sumsq"]), (total, squares, ref)
        return
    if math.isinf(ref["sumsq"]):  # float64 input whose squares overflow
        assert squares == math.inf
    else:
        assert abs(squares - ref["sumsq"]) <= 1e-12 * ref["sumsq"]
    assert abs(total - ref["sum"]) <= 1e-12 * ref["abs"]


def _bf16_bits(values: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (truncated float32) and their exact float64 values."""
    bits = (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return bits


def _bf16_values(bits: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # NaN bit patterns widen to NaN, as intended
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _reduce_all(native, a: np.ndarray, kind: int):
    """Run every kernel on ``a`` through both entry points; yield the results."""
    for portable in _kernels(native):
        yield native.reduce(a, kind, portable)
        yield native.reduce_at(a.ctypes.data, a.size, kind, portable)


# ------------------------------------------------------------------ the module

@pytest.mark.parametrize("n", SIZES)
def test_sizes_and_tails(native, n):
    rng = np.random.default_rng(n)
    a32 = (rng.standard_normal(n) * 3 + 0.5).astype(np.float32)
    a64 = rng.standard_normal(n) * 1e3
    bits = _bf16_bits(rng.standard_normal(n) * 7)
    for r in _reduce_all(native, a32, KIND_F32):
        _check(r, a32.astype(np.float64))
    for r in _reduce_all(native, a64, KIND_F64):
        _check(r, a64)
    for r in _reduce_all(native, bits, KIND_BF16):
        _check(r, _bf16_values(bits))
    a16 = (rng.standard_normal(n) * 100).astype(np.float16)
    for r in _reduce_all(native, a16, KIND_F16):
        _check(r, a16.astype(np.float64))


@pytest.mark.parametrize("n", [1, 7, 16, 17, 33, BLOCK + 5, 3 * BLOCK + 17, 70001])
@pytest.mark.parametrize("special", [math.nan, math.inf, -math.inf, "both-inf", "nan+inf"])
def test_nan_and_inf_anywhere(native, n, special):
    rng = np.random.default_rng(7)
    positions = sorted({0, n - 1, n // 2, max(n - 3, 0)})
    for pos in positions:
        a = rng.standard_normal(n)
        if special == "both-inf":
            a[pos], a[n - 1 - pos] = math.inf, -math.inf
        elif special == "nan+inf":
            a[pos], a[(pos + n // 3) % n] = math.inf, math.nan
        else:
            a[pos] = special
        a32 = a.astype(np.float32)
        for r in _reduce_all(native, a32, KIND_F32):
            _check(r, a32.astype(np.float64))
        for r in _reduce_all(native, a, KIND_F64):
            _check(r, a)
        bits = _bf16_bits(a32)
        for r in _reduce_all(native, bits, KIND_BF16):
            _check(r, _bf16_values(bits))
        a16 = a.astype(np.float16)
        for r in _reduce_all(native, a16, KIND_F16):
            _check(r, a16.astype(np.float64))


def test_special_finite_values(native):
    rng = np.random.default_rng(3)
    tiny32 = np.float32(1e-40)  # float32 denormal
    cases32 = [
        np.full(BLOCK * 2 + 3, 3e38, np.float32),                 # squares overflow float32, not float64
        np.array([-0.0, 0.0, -0.0], np.float32),
        np.array([-0.0], np.float32),
        np.full(1001, tiny32),
        np.concatenate([rng.standard_normal(500), [3.4e38, -3.4e38]]).astype(np.float32),
        (rng.standard_normal(9999) * 1e-30).astype(np.float32),
        np.full(5000, 1000.5, np.float32),                        # many equal values
    ]
    for a in cases32:
        for r in _reduce_all(native, a, KIND_F32):
            _check(r, a.astype(np.float64))
    cases16 = [np.full(BLOCK + 3, 65504, np.float16),                    # fp16 max: squares overflow fp16
               np.array([6e-8, -6e-8, 1e-7, 0.0, -0.0], np.float16),     # fp16 subnormals
               (rng.standard_normal(777) * 1e-6).astype(np.float16)]
    for a in cases16:
        for r in _reduce_all(native, a, KIND_F16):
            _check(r, a.astype(np.float64))
    cases64 = [np.full(100, 1e300), np.full(50, 5e-324), np.array([-0.0, 0.0])]
    for a in cases64:
        for r in _reduce_all(native, a, KIND_F64):
            _check(r, a)
    # float64 data whose sum overflows is still finite data: no NaN/Inf flags
    r = native.reduce(np.array([1e308, 1e308, 1e308]), KIND_F64)
    assert r[2] == math.inf and r[4:] == (False, False) and r[0] == 1e308


def test_unaligned_and_read_only_buffers(native):
    a = np.random.default_rng(1).standard_normal(BLOCK + 40).astype(np.float32)
    for start in range(1, 9):
        view = a[start:]
        for r in _reduce_all(native, view, KIND_F32):
            _check(r, view.astype(np.float64))
    rng = np.random.default_rng(2)
    others = [(rng.standard_normal(BLOCK + 40), KIND_F64),
              ((rng.standard_normal(BLOCK + 40) * 9).astype(np.float16), KIND_F16)]
    for b, kind in others:
        for start in range(1, 9):
            view = b[start:]
            for r in _reduce_all(native, view, kind):
                _check(r, view.astype(np.float64))
    bits = _bf16_bits(a)
    for start in range(1, 9):
        for r in _reduce_all(native, bits[start:], KIND_BF16):
            _check(r, _bf16_values(bits[start:]))
    ro = a.copy()
    ro.flags.writeable = False
    _check(native.reduce(ro, KIND_F32), ro.astype(np.float64))
    fortran = np.asfortranarray(a[:600].reshape(20, 30))
    _check(native.reduce(fortran, KIND_F32), fortran.astype(np.float64).ravel())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mprotect through ctypes: Linux")
@pytest.mark.parametrize("n", [1, 15, 16, 17, 255, 256, 257, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 17])
def test_buffer_ending_at_an_unreadable_page(native, n):
    """Each kernel reads exactly its buffer: data that ends where an inaccessible page
    begins is reduced correctly (the AVX2 kernels prefetch up to 4096 bytes past the
    element they read; a prefetch never faults, an over-read would crash here)."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    data_pages = -(-n * 8 // page)
    region = mmap.mmap(-1, (data_pages + 1) * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    guard = base + data_pages * page
    assert libc.mprotect(guard, page, 0) == 0, os.strerror(ctypes.get_errno())
    try:
        end = data_pages * page  # offset of the guard page
        rng = np.random.default_rng(n)
        for values, dtype, kind, as64 in (
            (rng.standard_normal(n) * 3, np.float32, KIND_F32, None),
            (rng.standard_normal(n) * 1e3, np.float64, KIND_F64, None),
            (rng.standard_normal(n) * 100, np.float16, KIND_F16, None),
            (_bf16_bits(rng.standard_normal(n) * 7), np.uint16, KIND_BF16, _bf16_values),
        ):
            itemsize = np.dtype(dtype).itemsize
            a = np.frombuffer(region, dtype=dtype, count=n, offset=end - n * itemsize)
            a[:] = values.astype(dtype)
            expected = as64(a) if as64 is not None else a.astype(np.float64)
            for portable in _kernels(native):
                _check(native.reduce_at(a.ctypes.data, n, kind, portable), expected)
            del a
    finally:
        libc.mprotect(guard, page, mmap.PROT_READ | mmap.PROT_WRITE)  # PROT_NONE is 0 (not in the mmap module)


def test_bad_arguments(native):
    a = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="at least one element"):
        native.reduce_at(a.ctypes.data, 0, KIND_F32)
    with pytest.raises(ValueError, match="kind"):
        native.reduce(a, 4)
    with pytest.raises(ValueError, match="whole number"):
        native.reduce(a, KIND_F64)  # 12 bytes
    with pytest.raises(ValueError, match="address"):
        native.reduce_at(0, 3, KIND_F32)
    with pytest.raises((BufferError, ValueError), match="contiguous"):
        native.reduce(np.zeros((4, 4), np.float32)[:, ::2], KIND_F32)  # not contiguous
    with pytest.raises(TypeError):
        native.reduce_at(a.ctypes.data, 3)
    assert native.isa() in ("avx2", "generic")


def test_reduce_crc_at_present_and_chained_per_block(native):
    """The module in use (installed, else built now) has ``reduce_crc_at``: an installed build
    older than fused_stats.c fails here (rebuild: ``python setup.py build_ext --inplace``).
    With a CRC function written in Python (a ctypes callback around ``zlib.crc32``) the kernel
    calls it once per block of 4096 elements and once for the tail, chaining the value, and
    returns zlib's CRC of all the bytes; bfloat16 blocks arrive as float32 bytes."""
    import ctypes
    import zlib
    assert hasattr(native, "reduce_crc_at"), "stale msprobe._native.fused_stats build: rebuild the extension"
    lengths = []

    @ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint64)
    def crc(init, buf, n):
        lengths.append(n)
        return zlib.crc32(ctypes.string_at(buf, n), init)

    address = ctypes.cast(crc, ctypes.c_void_p).value
    rng = np.random.default_rng(11)
    n = 3 * BLOCK + 21
    a = rng.standard_normal(n).astype(np.float32)
    bits = (a.view(np.uint32) >> 16).astype(np.uint16)
    for portable in _kernels(native):
        for buf, kind, data, width in ((a, KIND_F32, a.tobytes(), 4), (a.astype(np.float64), KIND_F64, None, 8),
                                       (bits, KIND_BF16, (bits.astype(np.uint32) << 16).tobytes(), 4),
                                       (a.astype(np.float16), KIND_F16, None, 2)):
            lengths.clear()
            got = native.reduce_crc_at(buf.ctypes.data, n, kind, address, portable)
            assert got[:6] == native.reduce_at(buf.ctypes.data, n, kind, portable)
            assert got[6] == zlib.crc32(data if data is not None else buf.tobytes())
            assert lengths[:3] == [BLOCK * width] * 3 and sum(lengths) == n * width  # blocks, then the tail


@settings(max_examples=150, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 80),
                  elements=st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)))
def test_float32_property(native, a):
    for r in _reduce_all(native, a, KIND_F32):
        _check(r, a.astype(np.float64))


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(np.uint16, st.integers(1, 80)))
def test_16_bit_property(native, bits):
    """Any 16-bit pattern as bfloat16 and as float16 (NaN payloads, subnormals included)."""
    for r in _reduce_all(native, bits, KIND_BF16):
        _check(r, _bf16_values(bits))
    for r in _reduce_all(native, bits, KIND_F16):
        _check(r, bits.view(np.float16).astype(np.float64))


def test_every_float16_value(native):
    """All 65536 float16 bit patterns, one at a time and all together."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    values = bits.view(np.float16).astype(np.float64)
    for portable in _kernels(native):
        got = [native.reduce(bits[i:i + 1], KIND_F16, portable)[0] for i in range(0, 1 << 16, 1)]
        assert all(_same(g, v) for g, v in zip(got, values))
        finite = bits[np.isfinite(values)]
        _check(native.reduce(finite, KIND_F16, portable), finite.view(np.float16).astype(np.float64))


# ------------------------------------------------------------------ msprobe.pytorch.stats

def _tensor_ref(t: torch.Tensor) -> dict:
    a = t.detach().resolve_neg().to(torch.float64).contiguous().numpy().ravel()
    return _ref(a), a


def _check_stats(s, t: torch.Tensor) -> None:
    ref, a = _tensor_ref(t)
    assert (s.has_nan, s.has_inf) == (ref["has_nan"], ref["has_inf"])
    assert _same(s.max, ref["max"]) and _same(s.min, ref["min"])
    if "abs" in ref:
        assert abs(s.mean * a.size - ref["sum"]) <= 1e-12 * ref["abs"]
        norm = math.sqrt(ref["sumsq"]) if t.dim() else abs(ref["max"])
        assert s.norm == pytest.approx(norm, rel=1e-12, abs=0)
        assert s.max_finite is None and s.min_finite is None
    else:
        fin = a[np.isfinite(a)]
        if fin.size:
            assert (s.max_finite, s.min_finite) == (fin.max(), fin.min())


def _views(dtype):
    torch.manual_seed(5)
    base = (torch.randn(6, 50, 70) * 4 + 1).to(dtype)
    return {
        "scalar": torch.tensor(-2.5, dtype=dtype),
        "one": torch.tensor([3.0], dtype=dtype),
        "tail": base.reshape(-1)[:4097 + 13],
        "permuted": base.permute(2, 0, 1),               # dense, read in memory order
        "transposed": base[0].t(),
        "transposed-offset": base[2].t(),                # dense, storage offset > 0
        "gap": base[:, ::2, :],                          # not dense: copied
        "expanded": base[0, 0].expand(30, 70),           # stride 0: copied
        "neg": torch._neg_view(base[1]),
        "offset": base.reshape(-1)[3:9000],
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_tensor_stats_native(use_native, dtype, monkeypatch):
    calls = []

    class Counting:
        @staticmethod
        def reduce_at(*args):
            calls.append(args[1])
            return use_native.reduce_at(*args)

    monkeypatch.setattr(stats_mod, "NATIVE", Counting)
    for name, t in _views(dtype).items():
        before = t.clone()
        s = stats_mod.tensor_stats(t)
        _check_stats(s, t)
        assert torch.equal(t, before), name
    assert len(calls) == len(_views(dtype))


def test_tensor_stats_native_special(use_native):
    t = torch.randn(BLOCK * 3 + 5)
    t[5], t[-1] = math.nan, math.inf
    s = stats_mod.tensor_stats(t)
    assert math.isnan(s.max) and math.isnan(s.min) and s.has_nan and s.has_inf
    _check_stats(s, t)
    t = torch.randn(100)
    t[0] = -math.inf
    s = stats_mod.tensor_stats(t)
    assert s.min == -math.inf and s.has_inf and not s.has_nan and s.min_finite == float(t[1:].min())
    big = torch.full((BLOCK * 2,), 3e38)  # float32 squares overflow; float64 ones do not
    v = float(big[0])  # 3e38 rounded to float32
    s = stats_mod.tensor_stats(big)
    assert s.mean == v and not s.has_inf
    assert s.norm == pytest.approx(v * math.sqrt(big.numel()), rel=1e-12)
    tiny = torch.full((5000,), 1e-30)  # float32 squares underflow; float64 ones do not
    v = float(tiny[0])
    assert stats_mod.tensor_stats(tiny).norm == pytest.approx(v * math.sqrt(5000), rel=1e-12)
    allnan = torch.full((20,), math.nan, dtype=torch.bfloat16)
    s = stats_mod.tensor_stats(allnan)
    assert math.isnan(s.max_finite) and math.isnan(s.min_finite)


def test_parameters_and_grad_untouched(use_native):
    p = torch.nn.Parameter(torch.randn(300, 7, dtype=torch.float16))
    s = stats_mod.tensor_stats(p)
    _check_stats(s, p)
    assert p.grad is None and p.grad_fn is None and p.requires_grad
    q = torch.nn.Parameter(torch.randn(40, 30)).t()  # a non-leaf view with grad_fn
    _check_stats(stats_mod.tensor_stats(q), q)


def test_host_stats_complex_uses_native(use_native, monkeypatch):
    calls = []
    real = use_native.reduce_at
    monkeypatch.setattr(stats_mod, "NATIVE", type("N", (), {"reduce_at": staticmethod(
        lambda *a: calls.append(a[1]) or real(*a))}))
    z = torch.randn(5000, dtype=torch.complex64)
    s = stats_mod.tensor_stats(z)
    mag = z.abs().to(torch.float64).numpy()
    assert calls == [5000]
    assert (s.max, s.min) == (mag.max(), mag.min())
    assert s.norm == pytest.approx(math.sqrt(math.fsum(mag * mag)), rel=1e-12)


# ------------------------------------------------------------------ the fallback

EPS32 = float(np.finfo(np.float32).eps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_fallback_without_extension(no_native, dtype):
    """NATIVE None: the numpy/torch paths (float32 cascade for large low-precision tensors)."""
    assert stats_mod.NATIVE is None
    for name, t in _views(dtype).items():
        s = stats_mod.tensor_stats(t)
        ref, a = _tensor_ref(t)
        assert (s.max, s.min) == (ref["max"], ref["min"]), name
        bound = EPS32 * math.log2(a.size + 1) * ref["abs"] + 1e-12
        assert abs(s.mean * a.size - ref["sum"]) <= bound, name
        norm = math.sqrt(ref["sumsq"]) if t.dim() else abs(ref["max"])
        assert s.norm == pytest.approx(norm, rel=1e-6), name
    big = torch.full((BLOCK * 2,), 3e38)  # the float32 cascade overflows: redone in float64
    s = stats_mod.tensor_stats(big)
    assert s.norm == pytest.approx(3e38 * math.sqrt(big.numel()), rel=1e-6) and not s.has_inf
    t = torch.randn(BLOCK * 2)
    t[3] = math.nan
    s = stats_mod.tensor_stats(t)
    assert math.isnan(s.max) and s.has_nan and not s.has_inf


def test_environment_switch(monkeypatch):
    monkeypatch.setenv("MSPROBE_NO_NATIVE_STATS", "1")
    assert load_fused_stats() is None
    monkeypatch.setenv("MSPROBE_NO_NATIVE_STATS", "0")
    loaded = load_fused_stats()
    assert loaded is None or loaded.isa() in ("avx2", "generic")


# ------------------------------------------------------------------ msprobe.core.arrays

@pytest.mark.parametrize("mode", ["native", "fallback"])
def test_array_stats(request, mode):
    request.getfixturevalue("use_native" if mode == "native" else "no_native")
    rng = np.random.default_rng(9)
    cases = [
        rng.standard_normal((30, 40)).astype(np.float32),
        rng.standard_normal((30, 40)).astype(np.float32).T,        # Fortran order
        rng.standard_normal((30, 40))[:, ::3],                    # not contiguous: copied
        np.float32(2.5) * np.ones((), np.float32),                 # 0-dim
        rng.standard_normal(5000).astype(">f4"),                  # non-native byte order
        (rng.standard_normal(300) * 50).astype(np.float16),
        np.array([1.0, math.nan, math.inf, -2.0]),
        np.array([math.inf, -math.inf], np.float32),
        np.full(3000, 3e38, np.float32),
        rng.integers(-5, 5, 100).astype(np.int16),
    ]
    for a in cases:
        with np.errstate(invalid="ignore"):  # numpy's mean of [inf, -inf] in the fallback
            s = arrays_mod.array_stats(a)
        a64 = np.asarray(a, np.float64).ravel()
        ref = _ref(a64)
        assert (s.has_nan, s.has_inf) == (ref["has_nan"], ref["has_inf"])
        assert _same(s.max, ref["max"]) and _same(s.min, ref["min"])
        if "abs" in ref:
            assert abs(s.mean * a64.size - ref["sum"]) <= 1e-12 * ref["abs"]
            norm = math.sqrt(ref["sumsq"]) if a.ndim else abs(ref["max"])
            assert s.norm == pytest.approx(norm, rel=1e-12)
        else:  # over the finite elements, else over the non-NaN ones
            fin = a64[np.isfinite(a64)] if np.isfinite(a64).any() else a64[~np.isnan(a64)]
            assert (s.max_finite, s.min_finite) == (fin.max(), fin.min())
