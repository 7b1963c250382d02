"""Device statistics without a host synchronisation per tensor (design: performance).

For tensors on an accelerator, :func:`stats_vector` computes Max, Min, Mean, Norm and the
NaN/Inf facts as one small float64 tensor *on the device*, with no ``.item()``; the
recorder keeps the entry (:class:`DeferredCall`) until a flush point, where
:meth:`DeferredStats.resolve` stacks every pending vector and copies them to the host in
**one** transfer per device, then builds the final leaves.

Vector layout (float64, length :data:`WIDTH`), chosen so that a floating tensor costs few
kernel launches (on a GPU the recorder's cost is the launches: ~10 µs of host time each)
and every fact is derived on the host at the flush point (:func:`_fill`)::

    0 Max   1 Min   2 Sum   3 Norm
    4 max over non-NaN elements     5 min over non-NaN elements
    6 max over finite elements      7 min over finite elements

(4–7 are -inf/+inf where no such element exists.) Max/Min propagate NaN (so has_nan is
"Max is NaN"); has_inf is "4 is +inf or 5 is -inf"; Mean is Sum / numel; the except
fields are 6/7, or 4/5 where no element is finite, or NaN where all are NaN. bool
tensors give any/all in 0 and 1 (Mean and Norm are not recorded); integer tensors are
widened to float64; complex tensors use ``|z|``; Mean/Sum accumulate in float64, Norm in
float32 (float64 for float64 tensors).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from store import schema
from store.records import Call, Leaf

WIDTH = 8
_F64 = torch.float64
_F32 = torch.float32
_INF = math.inf
_LOW = (torch.float16, torch.bfloat16, torch.float32)


def stats_vector(t: torch.Tensor) -> torch.Tensor:
    """The float64 statistics vector (layout above) of a non-empty strided tensor, on its
    device; no host synchronisation (only kernels are queued)."""
    with torch.no_grad():
        x = t.detach()
        if x.dtype == torch.bool:
            anyv, allv = x.any(), x.all()
            return torch.stack([anyv, allv, anyv, allv, anyv, allv, anyv, allv]).to(_F64)
        if x.is_complex():
            x = x.abs()
        if not x.is_floating_point():
            v = x.to(_F64)  # integers: no NaN/Inf, so 4-7 repeat Max/Min
            mn, mx = torch.aminmax(v)
            return torch.stack([mx, mn, v.sum(), torch.linalg.vector_norm(v), mx, mn, mx, mn])
        mn, mx = torch.aminmax(x)
        total = x.sum(dtype=_F64)
        norm = torch.linalg.vector_norm(x, dtype=_F32 if x.dtype in _LOW else None)
        return torch.stack([
            mx, mn, total, norm,
            torch.nan_to_num(x, nan=-_INF).amax(),
            torch.nan_to_num(x, nan=_INF).amin(),
            torch.nan_to_num(x, nan=-_INF, posinf=-_INF).amax(),
            torch.nan_to_num(x, nan=_INF, neginf=_INF).amin(),
        ]).to(_F64)


@dataclass(frozen=True, slots=True)
class PendingLeaf:
    """A tensor leaf whose statistics are still on the device (``vector``)."""

    leaf: Leaf
    vector: torch.Tensor


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
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for _, leaves in calls:
            for x in leaves:
                if isinstance(x, PendingLeaf):
                    by_device.setdefault(x.vector.device, []).append(x.vector)
        host: dict[torch.device, list[list[float]]] = {}
        for device, vectors in by_device.items():
            host[device] = torch.stack(vectors).to("cpu").tolist()
            self.transfers += 1
        cursor = {d: 0 for d in host}
        out = []
        for call, leaves in calls:
            final = []
            for x in leaves:
                if isinstance(x, PendingLeaf):
                    d = x.vector.device
                    vals = host[d][cursor[d]]
                    cursor[d] += 1
                    final.append(_fill(x.leaf, vals))
                else:
                    final.append(x)
            out.append(replace(call, leaves=tuple(final)))
        return out


def _fill(leaf: Leaf, vals: list[float]) -> Leaf:
    """``leaf`` with the statistics of its gathered vector ``vals`` (layout above)."""
    mx, mn, total, norm, nn_max, nn_min, fin_max, fin_min = vals
    if leaf.dtype in schema.BOOL_DTYPES:
        return replace(leaf, max=mx, min=mn, has_nan=False, has_inf=False)
    if not leaf.shape:
        norm = abs(mx)
    fields = dict(max=mx, min=mn, mean=total / leaf.numel, norm=norm,
                  has_nan=math.isnan(mx) or math.isnan(mn), has_inf=nn_max == _INF or nn_min == -_INF)
    if not (math.isfinite(mx) and math.isfinite(mn)):
        if fin_max != -_INF:  # some element is finite
            fields.update(max_finite=fin_max, min_finite=fin_min)
        elif not (nn_max == -_INF and nn_min == _INF):  # only infinities (and NaN)
            fields.update(max_finite=nn_max, min_finite=nn_min)
        else:  # all NaN
            fields.update(max_finite=math.nan, min_finite=math.nan)
    return replace(leaf, **fields)
