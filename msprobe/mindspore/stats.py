"""Tensor statistics for MindSpore dump records (spec 3.4 with section 9 fixes 10-12, 31).

The host path: numpy over ``Tensor.asnumpy()`` (a snapshot copy), used where the host copy
is made anyway (summary_mode md5, task tensor), for numpy arguments, and for the tensors
that :mod:`msprobe.mindspore.device_stats` hands back to the host (NaN/Inf, magnitudes that
need rescaling, a device op that failed); other MindSpore tensors are measured on their
device with the same results. MindSpore's CPU reduction kernels miss ``LinalgVectorNorm``
and ``Reduce`` for BFloat16 and Bool (spec fix 31): neither path uses them. Every dtype
works, bf16 included:

=====================  =====================  ==================================
tensor                 Max / Min              Mean / Norm
=====================  =====================  ==================================
empty                  null                   null
Bool                   any() / all()          null
Complex64/128          max/min of ``|z|``     mean of ``|z|`` / sqrt(sum ``|z|**2``)
every other dtype      exact (float64)        float64
0-dim (non-bool)       the value              Mean = value, Norm = ``|value|``
=====================  =====================  ==================================

Widening Float16/BFloat16/Float32/integers to float64 is exact, so Max/Min are the
tensor's own values. NaN propagates (``has_nan``); when Max or Min is not finite,
``max_finite``/``min_finite`` hold max/min over the finite elements (over the non-NaN ones
when none is finite; NaN when all are NaN), as for PyTorch.

CRC-32 (``md5``, spec 3.5): the zlib CRC-32 (:mod:`msprobe.core.checksum`) of the C-order bytes of ``asnumpy()``, bf16
converted to float32 first, 8 lowercase hex digits.

Example: ``Tensor([1., -2., 3.])`` → Max 3.0, Min -2.0, Mean 0.6667, Norm 3.7417.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from msprobe.core.checksum import crc32


def host_array(t: Any) -> np.ndarray:
    """``t.asnumpy()`` for a MindSpore tensor, ``t`` itself for a numpy array."""
    return t if isinstance(t, np.ndarray) else t.asnumpy()


# moved to msprobe.core.arrays (shared with numpy arguments of the PyTorch recorder)
from msprobe.core.arrays import array_stats  # noqa: E402,F401 - re-exported for msprobe.mindspore.leaves and tests


def crc32_hex(a: np.ndarray) -> str:
    """CRC-32 of the C-order bytes of ``a`` (bf16 → float32 first) as 8 hex digits.

    >>> crc32_hex(np.zeros(0, np.float32))
    '00000000'
    """
    if a.dtype.kind not in "fiubc" and a.dtype != np.bool_:
        a = a.astype(np.float32)
    return format(crc32(np.ascontiguousarray(a).view(np.uint8).reshape(-1)) & 0xFFFFFFFF, "08x")
