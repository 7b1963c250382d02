"""Optional compiled helpers. Nothing here is required: every user falls back to
numpy/torch code when a module is missing.

``fused_stats`` (``fused_stats.c``, built by ``pip install`` when a C compiler exists):
Max, Min and the float64 sum and sum of squares of a contiguous float32, float64,
bfloat16 or float16 buffer in one pass over memory (``reduce_crc_at``: with the CRC-32 of its
bytes in the same pass, through a C CRC function passed by address, for summary_mode md5).
:func:`load_fused_stats` returns it, or None when
it was not built or ``MSPROBE_NO_NATIVE_STATS=1`` is set (the pure numpy/torch statistics,
for comparisons and as an escape hatch).
"""
from __future__ import annotations

import os
from types import ModuleType
from typing import Optional

#: ``kind`` codes of ``fused_stats.reduce``/``reduce_at``
KIND_F32, KIND_F64, KIND_BF16, KIND_F16 = 0, 1, 2, 3


def load_fused_stats() -> Optional[ModuleType]:
    """The compiled ``fused_stats`` module, or None (not built, failed to load, or disabled
    by the environment variable ``MSPROBE_NO_NATIVE_STATS`` set to anything but ``""``/``"0"``).

    Module API: ``reduce_at(address: int, n: int, kind: int) -> (max, min, sum, sumsq,
    has_nan, has_inf)`` over ``n >= 1`` contiguous elements at a raw address (the caller
    keeps that memory alive); ``reduce_crc_at(address, n, kind, crc_fn_address) -> (max, min,
    sum, sumsq, has_nan, has_inf, crc)``, the same statistics bit for bit plus the CRC-32 of
    the elements' bytes (bfloat16: of their float32 values) computed by the C function at
    ``crc_fn_address`` (``msprobe.core.checksum.C_CRC32``); ``reduce(buffer, kind)`` over a contiguous buffer, and
    ``isa() -> "avx2" | "generic"``; ``kind`` is one of the ``KIND_*`` codes. Max/Min are NaN
    when any element is NaN; sums are float64. Every reduction runs on the calling thread
    (buffers of 65,536 elements or more with the GIL released).
    Raises ValueError for ``n < 1``, an unknown ``kind``, or an address of 0.
    """
    if os.environ.get("MSPROBE_NO_NATIVE_STATS", "") not in ("", "0"):
        return None
    try:
        from msprobe._native import fused_stats
    except ImportError:
        return None
    return fused_stats
