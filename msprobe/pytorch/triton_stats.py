"""One fused Triton kernel for the device statistics of a floating tensor (GPU only).

:func:`msprobe.pytorch.deferred.stats_vector` computes a CUDA tensor's statistics with
13 PyTorch kernels; on a GPU the recorder's host cost is those launches (~170–290 µs per
tensor on an H200, benchmarks/RESULTS.md). Where Triton is installed (it comes with
PyTorch's CUDA builds on Linux), :func:`fused_vector` reads the tensor once in one
kernel (a second, single-program kernel combines the per-program rows of tensors larger
than :data:`PER_PROGRAM` elements) and writes the eight values of the deferred layout
(:mod:`msprobe.pytorch.deferred`) as one float64 vector:

    0 Max   1 Min   2 max over non-NaN   3 min over non-NaN
    4 max over finite   5 min over finite   6 Sum   7 Norm

Every element is widened to float64 before it is compared or added: Max/Min/except
values are exact, Sum and the sum of squares (Norm) accumulate in float64 (tree order,
so the last digits can differ from the CPU path's). Max/Min are NaN when any element is
NaN (PyTorch's semantics).

Only dense float16/bfloat16/float32/float64 CUDA tensors take this path (others keep the
PyTorch kernels). Set ``MSPROBE_NO_TRITON=1`` to turn it off. The kernels compile on
first use per dtype (cached by Triton on disk).
"""
from __future__ import annotations

import contextlib
import functools
import os
from types import ModuleType
from typing import Optional

import torch

#: elements one program reduces (BLOCK x ITERS)
BLOCK = 1024
ITERS = 8
PER_PROGRAM = BLOCK * ITERS
#: columns of a per-program row: nan count, non-NaN max/min, finite max/min, sum, sum of squares
_COLS = 7
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

@functools.lru_cache(maxsize=1)
def kernels() -> Optional[ModuleType]:
    """The kernel module, imported on first call; None without Triton, when it fails to
    load, or with ``MSPROBE_NO_TRITON=1``."""
    if os.environ.get("MSPROBE_NO_TRITON", "") not in ("", "0"):
        return None
    try:
        from msprobe.pytorch import _triton_kernels
    except Exception:  # ImportError, or a Triton that fails to initialise
        return None
    return _triton_kernels


def usable(x: torch.Tensor, any_device: bool = False) -> bool:
    """True if :func:`fused_vector` takes ``x``: a floating dtype, memory in one dense
    block, on a CUDA device (``any_device``: also CPU tensors, for Triton's interpreter,
    ``TRITON_INTERPRET=1``, in tests), and Triton loads (:func:`kernels`). Not for a lazy
    negation (``x.is_neg()``, e.g. ``z.conj().imag``): the kernel reads the raw memory."""
    return ((any_device or x.device.type == "cuda") and x.dtype in _DTYPES and x.numel() > 0
            and x.is_contiguous() and not x.is_neg() and kernels() is not None)


def fused_vector(x: torch.Tensor) -> torch.Tensor:
    """The eight statistics (layout above) of ``x`` as a float64 tensor on its device; ``x``
    must qualify (:func:`usable`, the caller's check). Queues one kernel (two for more than
    :data:`PER_PROGRAM` elements); never synchronises."""
    k = kernels()
    n = x.numel()
    out = torch.empty(8, dtype=torch.float64, device=x.device)
    programs = -(-n // PER_PROGRAM)
    flat = x.view(-1)
    with _on_device(x.device):
        if programs == 1:
            k.rows[(1,)](flat, out, n, FINAL=True, BLOCK=BLOCK, ITERS=ITERS, COLS=_COLS)
            return out
        rows = torch.empty(programs * _COLS, dtype=torch.float64, device=x.device)
        k.rows[(programs,)](flat, rows, n, FINAL=False, BLOCK=BLOCK, ITERS=ITERS, COLS=_COLS)
        k.combine[(1,)](rows, out, programs, BLOCK=BLOCK, COLS=_COLS)
    return out


def _on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """Triton launches on the *current* CUDA device and its current stream: for a tensor on
    another GPU (model or pipeline parallel in one process) make its device current."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()
