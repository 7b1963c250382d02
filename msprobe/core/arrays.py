"""Statistics of numpy arrays in float64 (spec 3.3 and section 9), with numpy only: used
for MindSpore tensors (via ``asnumpy``) and for ``numpy.ndarray`` arguments of both adapters."""
from __future__ import annotations

import math

import numpy as np

from msprobe.core.statistics import TensorStats


def _as_float64(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "c":
        return np.abs(a).astype(np.float64)
    if a.dtype.kind not in "fiub":  # bfloat16 and other extension types: via float32 (exact)
        return a.astype(np.float32).astype(np.float64)
    return a.astype(np.float64, copy=False)


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
    f = _as_float64(a).ravel()
    s.max, s.min = float(f.max()), float(f.min())
    s.mean = float(f.mean())
    s.norm = float(np.sqrt(np.dot(f, f))) if a.ndim else abs(s.max)
    s.has_nan = math.isnan(s.max) or math.isnan(s.min)
    s.has_inf = (not s.has_nan) and (math.isinf(s.max) or math.isinf(s.min))
    if not (math.isfinite(s.max) and math.isfinite(s.min)):
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
