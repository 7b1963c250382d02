"""Device statistics without a host synchronisation per tensor (design: performance).

For tensors on an accelerator, :func:`stats_vector` computes Max, Min, Mean, Norm and the
NaN/Inf facts as one small float64 tensor *on the device*, with no ``.item()``; the
recorder keeps the entry (:class:`DeferredCall`) until a flush point, where
:meth:`DeferredStats.resolve` stacks every pending vector and copies them to the host in
**one** transfer per device, then builds the final leaves.

A tensor's statistics are a few small tensors on its device (its *parts*), made with
few kernel launches (on a GPU the recorder's host cost is the launches, ~10 µs each, and
a stack of mixed dtypes costs one cast per element: measured on an H200), gathered at
the flush point by :func:`gather` into this float64 layout (:data:`WIDTH` values)::

    0 Max   1 Min
    2 max over non-NaN elements     3 min over non-NaN elements
    4 max over finite elements      5 min over finite elements
    6 Sum   7 Norm

(2–5 are -inf/+inf where no such element exists.) Max/Min propagate NaN (so has_nan is
"Max is NaN"); has_inf is "2 is +inf or 3 is -inf"; Mean is Sum / numel; the except
fields are 4/5, or 2/3 where no element is finite, or NaN where all are NaN (all derived
on the host, :func:`_fill`). bool tensors give any/all in 0 and 1 (Mean and Norm are not
recorded; only values 0–5 exist); integer tensors are widened to float64; complex
tensors use ``|z|``; float8 tensors are widened to float32; Sum and Norm accumulate in
float64. float64 (and complex128) tensors add a ninth value ``8 f``: Sum and Norm are
those of ``x / f``, ``f`` a power of two (1.0 for magnitudes within 2**±400, see
:func:`_rescale_parts`), so they neither overflow nor underflow where the host path
rescales too (:func:`msprobe.core.statistics.rescale_factor`). With Triton on a
CUDA device, a dense floating tensor other than float64 takes one fused kernel
instead (:mod:`msprobe.pytorch.triton_stats`: the same layout as one float64 part, Norm
accumulated in float64).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from msprobe.core.statistics import RESCALE_BIG, RESCALE_SMALL
from msprobe.pytorch import triton_stats
from msprobe.pytorch.stats import computable
from store import schema
from store.records import Call, Leaf

WIDTH = 8
_F64 = torch.float64
_F32 = torch.float32
_INF = math.inf
_LOW = (torch.float16, torch.bfloat16, torch.float32)

#: the device-side statistics of one tensor: (values 0–5 in the tensor's dtype, Sum, Norm)
Parts = tuple


def stats_vector(t: torch.Tensor) -> Parts:
    """The statistics parts (layout above) of a non-empty strided tensor, on its device;
    no host synchronisation (only kernels are queued)."""
    with torch.no_grad():
        x = computable(t.detach())  # a quantized tensor: its dequantized values
        if x.dtype == torch.bool:
            anyv, allv = x.any(), x.all()
            return (torch.stack([anyv, allv, anyv, allv, anyv, allv]),)
        if x.is_complex():
            x = x.abs()
        if x.is_floating_point() and x.dtype not in _LOW and x.dtype != _F64:
            x = x.to(_F32)  # float8 types (exact in float32) have no min/max kernels
        if x.dtype != _F64 and triton_stats.usable(x):  # one fused kernel (GPU with Triton)
            return (triton_stats.fused_vector(x),)
        return torch_parts(x)


def torch_parts(x: torch.Tensor) -> Parts:
    """:func:`stats_vector` of a detached, non-bool, real tensor with PyTorch kernels (13
    for a floating tensor)."""
    with torch.no_grad():
        if not x.is_floating_point():
            x = x.to(_F64)  # integers: no NaN/Inf, so 2-5 repeat Max/Min
            mn, mx = torch.aminmax(x)
            return torch.stack([mx, mn, mx, mn, mx, mn]), x.sum(), torch.linalg.vector_norm(x)
        mn, mx = torch.aminmax(x)
        extremes = torch.stack([
            mx, mn,
            # nan_to_num replaces every infinity it is not told about by the largest finite
            # value, so each call names all three
            torch.nan_to_num(x, nan=-_INF, posinf=_INF, neginf=-_INF).amax(),
            torch.nan_to_num(x, nan=_INF, posinf=_INF, neginf=-_INF).amin(),
            torch.nan_to_num(x, nan=-_INF, posinf=-_INF, neginf=-_INF).amax(),
            torch.nan_to_num(x, nan=_INF, posinf=_INF, neginf=_INF).amin(),
        ])
        if x.dtype == _F64:  # Sum and Norm over x / f (value 8: f; rescale_factor)
            y, scale = _rescale_parts(x, mx, mn)
            return extremes, y.sum(), torch.linalg.vector_norm(y), scale
        # Sum and Norm over one float64 copy: float32 squares overflow above ~1.8e19 and
        # underflow below ~1e-23, where the Norm itself still fits float32
        x64 = x.to(_F64)
        return extremes, x64.sum(), torch.linalg.vector_norm(x64)


def _rescale_parts(x: torch.Tensor, mx: torch.Tensor, mn: torch.Tensor) -> tuple:
    """``(x / f, f)`` for a float64 tensor with Max ``mx`` and Min ``mn``, on its device
    (comparisons and fills only: no frexp/ldexp kernel an accelerator may lack). Where the
    largest magnitude ``m`` is outside (2**-400, 2**400) (float64 sums overflow or squares
    underflow, :func:`msprobe.core.statistics.rescale_factor`), ``f`` is 2**600 (``m`` at
    least 2**400: ``x / f`` below 2**424) or 2**-600 (``0 < m <= 2**-400``: ``x / f``
    at least 2**-474, its square a normal number); else 1.0 (then ``x / f`` is ``x``).
    Dividing by a power of two is exact, so Sum and Norm scaled back are those of ``x``."""
    m = torch.maximum(mx.abs(), mn.abs())
    tiny = torch.where((m > 0) & (m <= RESCALE_SMALL), torch.full_like(m, _SCALE_TINY), torch.ones_like(m))
    scale = torch.where(m >= RESCALE_BIG, torch.full_like(m, _SCALE_BIG), tiny)
    return x / scale, scale


_SCALE_BIG, _SCALE_TINY = 2.0 ** 600, 2.0 ** -600


def gather(vectors: list[Parts]) -> list[list[float]]:
    """The host values (layout above) of ``vectors``, all on one device, in **one**
    device→host copy: parts of one dtype are concatenated on the device (one kernel per
    dtype), widened to float64 and joined first."""
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    where = []  # per vector: (dtype, offset, count) of each part
    sizes: dict[torch.dtype, int] = {}
    for parts in vectors:
        spots = []
        for p in parts:
            n = p.numel()
            group = groups.setdefault(p.dtype, [])
            group.append(p.reshape(-1))
            spots.append((p.dtype, sizes.get(p.dtype, 0), n))
            sizes[p.dtype] = sizes.get(p.dtype, 0) + n
        where.append(spots)
    base, offset, joined = {}, 0, []
    for dtype, group in groups.items():
        base[dtype] = offset
        offset += sizes[dtype]
        joined.append(torch.cat(group).to(_F64))
    host = (torch.cat(joined) if len(joined) > 1 else joined[0]).to("cpu").tolist()
    out = []
    for spots in where:
        vals = []
        for dtype, start, n in spots:
            i = base[dtype] + start
            vals.extend(host[i:i + n])
        out.append(vals)
    return out


def gather_by_device(vectors: list[Parts]) -> tuple[list[list[float]], int]:
    """:func:`gather` over ``vectors`` on any devices: one copy per device. Returns the
    host values in the order of ``vectors`` and the number of copies made."""
    by_device: dict[torch.device, list[int]] = {}
    for i, parts in enumerate(vectors):
        by_device.setdefault(parts[0].device, []).append(i)
    out: list = [None] * len(vectors)
    for indices in by_device.values():
        for i, vals in zip(indices, gather([vectors[i] for i in indices])):
            out[i] = vals
    return out, len(by_device)


@dataclass(frozen=True, slots=True)
class PendingLeaf:
    """A tensor leaf whose statistics are still on the device (``vector``)."""

    leaf: Leaf
    vector: Parts


class DeferredStats:
    """Entries waiting for their device statistics, resolved together at a flush point.

    Args:
        limit: resolve on its own when this many vectors are pending (bounds memory).
    """

    def __init__(self, limit: int = 4096) -> None:
        self._calls: list[tuple[Call, list]] = []
        self._pending = 0
        self.limit = limit
        self.transfers = 0  # number of device→host copies made (tests read this)

    def __len__(self) -> int:
        return len(self._calls)

    def add(self, call: Call, leaves: list) -> bool:
        """Queue ``call`` whose ``leaves`` may hold :class:`PendingLeaf`; True if the queue
        reached its limit and should be resolved now."""
        self._calls.append((call, leaves))
        self._pending += sum(1 for x in leaves if isinstance(x, PendingLeaf))
        return self._pending >= self.limit

    def resolve(self) -> list[Call]:
        """Gather every pending vector (one copy per device) and return the final calls,
        in the order they were queued."""
        calls, self._calls, self._pending = self._calls, [], 0
        pending = [x for _, leaves in calls for x in leaves if isinstance(x, PendingLeaf)]
        host, copies = gather_by_device([x.vector for x in pending])
        self.transfers += copies
        values = iter(host)
        out = []
        for call, leaves in calls:
            final = [_fill(x.leaf, next(values)) if isinstance(x, PendingLeaf) else x for x in leaves]
            out.append(replace(call, leaves=tuple(final)))
        return out


def _fill(leaf: Leaf, vals: list[float]) -> Leaf:
    """``leaf`` with the statistics of its gathered vector ``vals`` (layout above)."""
    if leaf.dtype in schema.BOOL_DTYPES:
        return leaf.replace(max=vals[0], min=vals[1], has_nan=False, has_inf=False)
    mx, mn, nn_max, nn_min, fin_max, fin_min, total, norm = vals[:WIDTH]
    scale = vals[WIDTH] if len(vals) > WIDTH else 1.0  # float64: Sum and Norm of x / scale
    norm = norm * scale if leaf.shape else abs(mx)
    mean = total / leaf.numel * scale if leaf.shape else mx  # 0-dim: its value, -0.0 included
    fields = dict(max=mx, min=mn, mean=mean, norm=norm,
                  has_nan=math.isnan(mx) or math.isnan(mn), has_inf=nn_max == _INF or nn_min == -_INF)
    if not (math.isfinite(mx) and math.isfinite(mn)):
        if fin_max != -_INF:  # some element is finite
            fields.update(max_finite=fin_max, min_finite=fin_min)
        elif not (nn_max == -_INF and nn_min == _INF):  # only infinities (and NaN)
            fields.update(max_finite=nn_max, min_finite=nn_min)
        else:  # all NaN
            fields.update(max_finite=math.nan, min_finite=math.nan)
    return leaf.replace(**fields)
