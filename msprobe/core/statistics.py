"""The statistics of one tensor, as adapters compute them (spec section 3.4 with the
fixes of section 9): float64 numbers, None meaning JSON null."""
from __future__ import annotations

import math
from typing import Optional


class TensorStats:
    """Max, Min, Mean, Norm (floats; bool tensors 1.0/0.0 for any/all), the
    ``Max_except_inf_nan``/``Min_except_inf_nan`` values (None unless Max or Min is not
    finite) and whether the tensor holds NaN or ±Inf."""

    __slots__ = ("max", "min", "mean", "norm", "max_finite", "min_finite", "has_nan", "has_inf")

    def __init__(self) -> None:
        self.max: Optional[float] = None
        self.min: Optional[float] = None
        self.mean: Optional[float] = None
        self.norm: Optional[float] = None
        self.max_finite: Optional[float] = None
        self.min_finite: Optional[float] = None
        self.has_nan: Optional[bool] = None
        self.has_inf: Optional[bool] = None


#: magnitudes outside (RESCALE_SMALL, RESCALE_BIG) overflow a float64 sum or sum of squares
#: (or lose digits to underflow in the squares): see :func:`rescale_factor`
RESCALE_BIG, RESCALE_SMALL = 2.0 ** 400, 2.0 ** -400


def rescale_factor(s: TensorStats) -> Optional[float]:
    """The power of two to divide a tensor's values by before summing them, or None.

    Mean and Norm are float64 sums. When the largest magnitude ``m`` (from Max and Min in
    ``s``) is finite and nonzero but outside (2**-400, 2**400) — only float64 or complex128
    data hold such values — the sum or the sum of squares overflows (``numpy.linalg.norm``
    and ``torch.linalg.vector_norm`` give ``inf`` for ``[2e200, 1e200]``) or the squares
    underflow (0 for ``[1e-200]``). Adapters then sum ``x / f`` with ``f = 2**(k-1)``,
    ``2**(k-1) <= m < 2**k`` (exact: a power of two), and multiply Mean and Norm by ``f``.

    Returns:
        ``f`` (float), or None when ``s`` needs no rescaling (typical magnitudes, all
        zeros, NaN/Inf present, statistics missing).
    """
    mx, mn = s.max, s.min
    if mx is None or mn is None or not (math.isfinite(mx) and math.isfinite(mn)):
        return None
    m = max(abs(mx), abs(mn))
    if m == 0.0 or RESCALE_SMALL < m < RESCALE_BIG:
        return None
    return math.ldexp(1.0, math.frexp(m)[1] - 1)  # 2**(k-1): 2**1024 itself overflows
