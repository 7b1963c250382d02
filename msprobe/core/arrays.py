"""Statistics of numpy arrays in float64 (spec 3.3 and section 9), with numpy only: used
for MindSpore tensors (via ``asnumpy``) and for ``numpy.ndarray`` arguments of both adapters.

float32, float64, float16 and bfloat16 arrays in native byte order take the optional compiled
one-pass reduction (:data:`NATIVE`, ``msprobe._native.fused_stats``; Max/Min exact, sums
in float64) when it is built; everything else, or everything when it is absent, goes
through a float64 copy and numpy."""
from __future__ import annotations

import math

import numpy as np

from msprobe._native import KIND_BF16, KIND_F16, KIND_F32, KIND_F64, load_fused_stats
from msprobe.core.statistics import TensorStats, rescale_factor

#: the compiled one-pass statistics, or None (then numpy computes them): see msprobe._native
NATIVE = load_fused_stats()


def _as_float64(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "c":
        return np.abs(a).astype(np.float64)
    if a.dtype.kind not in "fiub":  # bfloat16 and other extension types: via float32 (exact)
        return a.astype(np.float32).astype(np.float64)
    return a.astype(np.float64, copy=False)


def _native_kind(dt: np.dtype):
    """The ``fused_stats`` kind of a native-byte-order float32/float64/float16/bfloat16 dtype
    (bfloat16: ml_dtypes' 2-byte type, as MindSpore's ``asnumpy`` gives), else None."""
    if not dt.isnative:
        return None
    if dt == np.float32:
        return KIND_F32
    if dt == np.float64:
        return KIND_F64
    if dt == np.float16:
        return KIND_F16
    if dt.name == "bfloat16" and dt.itemsize == 2:
        return KIND_BF16
    return None


def _native_values(a: np.ndarray, kind: int) -> tuple:
    """``NATIVE.reduce`` over ``a``'s elements in memory order (C- or Fortran-contiguous
    arrays without a copy, others copied in C order)."""
    if not (a.flags.c_contiguous or a.flags.f_contiguous):
        a = np.ascontiguousarray(a)
    return NATIVE.reduce(a, kind)


def array_stats(a: np.ndarray) -> TensorStats:
    """Statistics of a host array (any dtype numpy or MindSpore can hold).

    Args:
        a: the values, any shape; never modified.
    Returns:
        :class:`TensorStats` in float64 (bool: Max = any, Min = all as 1.0/0.0).
    """
    s = TensorStats()
    if a.size == 0:
        return s
    if a.dtype == np.bool_:
        s.max, s.min = float(a.any()), float(a.all())
        s.has_nan = s.has_inf = False
        return s
    kind = _native_kind(a.dtype) if NATIVE is not None else None
    f = None
    if kind is not None:  # one pass, sums in float64 (msprobe._native)
        s.max, s.min, total, squares, s.has_nan, s.has_inf = _native_values(a, kind)
        s.mean = total / a.size if a.ndim else s.max  # 0-dim: its value, -0.0 included
        s.norm = math.sqrt(squares) if a.ndim else abs(s.max)
    else:
        f = _as_float64(a).ravel()
        s.max, s.min = float(f.max()), float(f.min())
        s.mean = float(f.mean()) if a.ndim else s.max
        s.norm = float(np.sqrt(np.dot(f, f))) if a.ndim else abs(s.max)
        s.has_nan = math.isnan(s.max) or math.isnan(s.min)
        s.has_inf = (not s.has_nan) and (math.isinf(s.max) or math.isinf(s.min))
    if not (math.isfinite(s.max) and math.isfinite(s.min)):
        if f is None:
            f = _as_float64(a).ravel()
        nan = np.isnan(f)
        inf = np.isinf(f)
        s.has_nan, s.has_inf = bool(nan.any()), bool(inf.any())
        finite = f[~(nan | inf)]
        if finite.size:
            s.max_finite, s.min_finite = float(finite.max()), float(finite.min())
        else:
            not_nan = f[~nan]
            if not_nan.size:
                s.max_finite, s.min_finite = float(not_nan.max()), float(not_nan.min())
            else:
                s.max_finite = s.min_finite = float("nan")
        return s
    scale = rescale_factor(s)  # float64 magnitudes whose sums overflow or squares underflow
    if scale is not None:
        f = (f if f is not None else _as_float64(a).ravel()) / scale
        s.mean = float(f.sum()) / f.size * scale if a.ndim else s.max
        s.norm = float(np.sqrt(np.dot(f, f))) * scale if a.ndim else abs(s.max)
    return s
