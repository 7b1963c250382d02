"""``async_dump: true``: gather statistics and tensors without synchronising the device
during the step; resolve and write them at ``stop()``/``step()`` (spec 1.3, 5.1; section 9
fix 14: ``md5`` is kept).

While recording, each tensor leaf gets a placeholder :class:`store.records.Leaf` (dtype,
shape, no statistics yet) and the gatherer keeps, on the tensor's device:

* one float64 vector of :data:`N_STATS` statistics computed by device reductions
  (:func:`device_stats`, no ``.item()``/``.cpu()``);
* with task ``tensor`` or ``summary_mode: md5``, a detached clone of the tensor.

Calls are held back (their order kept) and emitted by :meth:`AsyncGatherer.drain`, which
copies all statistic vectors of one device to the host with **one** transfer, fills the
leaves, stores the clones' bytes as payloads and computes CRC-32 from them.
The statistics are the same numbers the synchronous path computes
(:mod:`msprobe.pytorch.stats`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

import torch

from msprobe.pytorch.payload import tensor_bytes
from msprobe.pytorch.stats import crc32_hex, has_data
from store import schema
from store.records import Call, Leaf

_F64 = torch.float64
_F32 = torch.float32
_LOW_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
#: vector layout: max, min, mean, norm, finite max, finite min, non-NaN max, non-NaN min,
#: any NaN, any Inf, any finite, any non-NaN
N_STATS = 12


def device_stats(t: torch.Tensor) -> torch.Tensor:
    """The statistics vector (float64, shape ``[N_STATS]``, on ``t``'s device) of a tensor
    with data; never synchronises. Bool: ``max = any``, ``min = all``, the rest NaN."""
    with torch.no_grad():
        x = t.detach()
        nan = torch.tensor(float("nan"), dtype=_F64, device=x.device)
        if x.dtype == torch.bool:
            return torch.stack([x.any().to(_F64), x.all().to(_F64)] + [nan] * (N_STATS - 2))
        if x.is_complex():
            v = x.abs().to(_F64)
            head = [v.max(), v.min(), v.mean(), torch.linalg.vector_norm(v)]
        elif x.dtype in _LOW_FLOATS:
            mn, mx = torch.aminmax(x)
            v = x.to(_F64)
            head = [mx.to(_F64), mn.to(_F64), x.mean(dtype=_F64), torch.linalg.vector_norm(x, dtype=_F32).to(_F64)]
        else:
            v = x.to(_F64)
            mn, mx = torch.aminmax(v)
            head = [mx, mn, v.mean(), torch.linalg.vector_norm(v)]
        if not (v.is_floating_point()):
            v = v.to(_F64)
        is_nan = torch.isnan(v)
        finite = torch.isfinite(v)
        inf = torch.tensor(float("inf"), dtype=_F64, device=v.device)
        tail = [
            torch.where(finite, v, -inf).max(), torch.where(finite, v, inf).min(),
            torch.where(is_nan, -inf, v).max(), torch.where(is_nan, inf, v).min(),
            is_nan.any().to(_F64), torch.isinf(v).any().to(_F64),
            finite.any().to(_F64), (~is_nan).any().to(_F64),
        ]
        return torch.stack(head + tail)


class _Deferred:
    __slots__ = ("vector", "clone", "zero_dim")

    def __init__(self, vector: Optional[torch.Tensor], clone: Optional[torch.Tensor], zero_dim: bool) -> None:
        self.vector, self.clone, self.zero_dim = vector, clone, zero_dim


class AsyncGatherer:
    """Holds back the calls of one recorder and resolves them at :meth:`drain`.

    Args:
        emit: the session's ``emit(call)``.
        put_payload: ``put_payload(bytes, dtype, shape) -> ref`` or None (no tensor task).
        md5: compute CRC-32 (summary_mode md5).
        with_data: False for task ``structure`` (no statistics).
    """

    def __init__(self, emit: Callable[[Call], None], put_payload: Optional[Callable[..., Optional[str]]],
                 *, md5: bool, with_data: bool) -> None:
        self._emit = emit
        self._put = put_payload
        self._md5 = md5
        self._with_data = with_data
        self._calls: list[Call] = []
        self._deferred: dict[int, _Deferred] = {}

    def tensor_leaf(self, io: str, path: tuple, t: torch.Tensor) -> Leaf:
        """A placeholder leaf for ``t``; its values are gathered on the device."""
        leaf = Leaf(io=io, path=path, leaf_kind=schema.LEAF_TENSOR, type="torch.Tensor", dtype=str(t.dtype),
                    shape=tuple(t.shape), numel=t.numel(), requires_grad=bool(t.requires_grad))
        if not self._with_data or t.layout != torch.strided or t.device.type == "meta":
            return leaf
        vector = device_stats(t) if has_data(t) else None
        clone = t.detach().clone() if (self._put is not None or self._md5) else None
        self._deferred[id(leaf)] = _Deferred(vector, clone, t.dim() == 0)
        return leaf

    def add(self, call: Call) -> None:
        """Hold ``call`` until :meth:`drain`."""
        self._calls.append(call)

    def drain(self) -> None:
        """Resolve every held call (one device-to-host copy per device) and emit them in order."""
        calls, self._calls = self._calls, []
        deferred, self._deferred = self._deferred, {}
        if not calls:
            return
        by_device: dict[torch.device, list[int]] = {}
        for key, d in deferred.items():
            if d.vector is not None:
                by_device.setdefault(d.vector.device, []).append(key)
        host: dict[int, list[float]] = {}
        for keys in by_device.values():
            rows = torch.stack([deferred[k].vector for k in keys]).cpu().tolist()
            host.update(zip(keys, rows))
        for call in calls:
            if any(id(leaf) in deferred for leaf in call.leaves):
                call = dataclasses.replace(call, leaves=tuple(
                    self._resolve(leaf, deferred.get(id(leaf)), host.get(id(leaf))) for leaf in call.leaves))
            self._emit(call)

    def _resolve(self, leaf: Leaf, d: Optional[_Deferred], row: Optional[list[float]]) -> Leaf:
        if d is None:
            return leaf
        fields: dict[str, Any] = {}
        if row is not None:
            mx, mn, mean, norm, fmax, fmin, nmax, nmin, any_nan, any_inf, any_fin, any_notnan = row
            if leaf.dtype == "torch.bool":
                fields.update(max=mx, min=mn, has_nan=False, has_inf=False)
            else:
                if d.zero_dim:
                    norm = abs(mx)
                fields.update(max=mx, min=mn, mean=mean, norm=norm, has_nan=bool(any_nan), has_inf=bool(any_inf))
                if not (math.isfinite(mx) and math.isfinite(mn)):
                    if any_fin:
                        fields.update(max_finite=fmax, min_finite=fmin)
                    elif any_notnan:
                        fields.update(max_finite=nmax, min_finite=nmin)
                    else:
                        fields.update(max_finite=float("nan"), min_finite=float("nan"))
        if d.clone is not None:
            if self._md5:
                fields["crc32"] = crc32_hex(d.clone)
            if self._put is not None:
                snap = tensor_bytes(d.clone)
                if snap is not None:
                    fields["payload"] = self._put(*snap)
        return dataclasses.replace(leaf, **fields)
