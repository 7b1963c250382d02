"""The statistics of one tensor, as adapters compute them (spec section 3.4 with the
fixes of section 9): float64 numbers, None meaning JSON null."""
from __future__ import annotations

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
