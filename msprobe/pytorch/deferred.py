"""Device statistics without a host synchronisation per tensor (design: performance).

For tensors on an accelerator, :func:`stats_vector` computes Max, Min, Mean, Norm and the
NaN/Inf facts as one small float64 tensor *on the device*, with no ``.item()``; the
recorder keeps the entry (:class:`DeferredCall`) until a flush point, where
:meth:`DeferredStats.resolve` stacks every pending vector and copies them to the host in
**one** transfer per device, then builds the final leaves.

Vector layout (float64, length :data:`WIDTH`)::

    0 Max   1 Min   2 Mean   3 Norm   4 has_nan   5 has_inf   6 max_finite   7 min_finite

Max/Min propagate NaN; ``max_finite``/``min_finite`` are the max/min over finite elements
(over non-NaN ones if none is finite, NaN if all are NaN); bool tensors give any/all in
0/1 with Mean/Norm NaN (written as null); complex tensors use ``|z|``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

import torch

from store import schema
from store.records import Call, Leaf

WIDTH = 8
_F64 = torch.float64
_F32 = torch.float32


def stats_vector(t: torch.Tensor) -> torch.Tensor:
    """The float64 statistics vector of a non-empty strided tensor, on its device."""
    with torch.no_grad():
        x = t.detach()
        if x.dtype == torch.bool:
            anyv = x.any().to(_F64)
            allv = x.all().to(_F64)
            nan = torch.full((), math.nan, dtype=_F64, device=x.device)
            zero = torch.zeros((), dtype=_F64, device=x.device)
            return torch.stack([anyv, allv, nan, nan, zero, zero, anyv, allv])
        if x.is_complex():
            x = x.abs()
        if x.dtype in (torch.float16, torch.bfloat16, torch.float32):
            mn, mx = torch.aminmax(x)
            mean = x.mean(dtype=_F64)
            norm = torch.linalg.vector_norm(x, dtype=_F32).to(_F64)
            v = x
        else:
            v = x.to(_F64)
            mn, mx = torch.aminmax(v)
            mean = v.mean()
            norm = torch.linalg.vector_norm(v)
        if x.dim() == 0:
            norm = mx.to(_F64).abs()
        isnan = torch.isnan(v)
        isinf = torch.isinf(v)
        finite = ~(isnan | isinf)
        any_finite = finite.any()
        inf = torch.tensor(math.inf, dtype=v.dtype, device=v.device)
        keep = torch.where(any_finite, finite, ~isnan)
        fmax = torch.where(keep, v, -inf).amax().to(_F64)
        fmin = torch.where(keep, v, inf).amin().to(_F64)
        all_nan = ~keep.any()
        nanv = torch.full((), math.nan, dtype=_F64, device=v.device)
        fmax = torch.where(all_nan, nanv, fmax)
        fmin = torch.where(all_nan, nanv, fmin)
        return torch.stack([mx.to(_F64), mn.to(_F64), mean, norm,
                            isnan.any().to(_F64), isinf.any().to(_F64), fmax, fmin])


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


def _num(v: float) -> Optional[float]:
    return None if math.isnan(v) else v


def _fill(leaf: Leaf, vals: list[float]) -> Leaf:
    mx, mn, mean, norm, has_nan, has_inf, fmax, fmin = vals
    if leaf.dtype in schema.BOOL_DTYPES:
        return replace(leaf, max=mx, min=mn, has_nan=False, has_inf=False)
    nonfinite = not (math.isfinite(mx) and math.isfinite(mn))
    return replace(leaf, max=mx, min=mn, mean=mean, norm=norm, has_nan=bool(has_nan), has_inf=bool(has_inf),
                   max_finite=fmax if nonfinite else None, min_finite=fmin if nonfinite else None)
