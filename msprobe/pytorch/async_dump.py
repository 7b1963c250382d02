"""``async_dump: true``: gather statistics and tensors without synchronising the device
during the step; resolve and write them at ``stop()``/``step()`` (spec 1.3, 5.1; section 9
fix 14: ``md5`` is kept).

While recording, each tensor leaf gets a placeholder :class:`store.records.Leaf` (dtype,
shape, no statistics yet) and the gatherer keeps, on the tensor's device:

* one float64 statistics vector computed by device reductions
  (:func:`msprobe.pytorch.deferred.stats_vector`, no ``.item()``/``.cpu()``);
* with task ``tensor`` or ``summary_mode: md5``, a detached clone of the tensor.

Calls are held back (their order kept) and emitted by :meth:`AsyncGatherer.drain`, which
copies all statistic vectors of one device to the host with **one** transfer, fills the
leaves, stores the clones' bytes as payloads and computes CRC-32 from them.
The statistics are those of the device path of :mod:`msprobe.pytorch.deferred` (float64
sums there; on the CPU the host path sums in float64 too with the native extension, in
float32 for large float32 tensors without it, and in another order either way, so the last
digits of Norm and Mean can differ from a synchronous CPU dump).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch

from msprobe.pytorch.deferred import _fill, gather_by_device, stats_vector
from msprobe.pytorch.payload import tensor_bytes
from msprobe.pytorch.stats import crc32_hex, has_data, opaque
from store import schema
from store.records import Call, Leaf


class _Deferred:
    """Device-side data of one placeholder ``leaf`` (kept referenced so its id stays unique)."""

    __slots__ = ("leaf", "vector", "clone")

    def __init__(self, leaf: Leaf, vector: Optional[tuple], clone: Optional[torch.Tensor]) -> None:
        self.leaf, self.vector, self.clone = leaf, vector, clone


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
        readable = has_data(t)
        unread = opaque(t)  # no kernel reduces or copies it: null statistics
        vector = stats_vector(t) if readable and not unread else None
        # cloning a tensor whose storage was freed (resized to 0 bytes) reads freed memory
        keep = (self._put is not None or self._md5) and (readable or t.numel() == 0)
        clone = None
        if keep and t.is_quantized:
            # md5 hashes the integer codes (a copy; a quint4x2 view cannot be cloned); no
            # .pt is written for a quantized tensor (tensor_bytes), as on the sync path
            clone = t.detach().int_repr() if self._md5 and not unread else None
        elif keep and not unread:
            clone = t.detach().clone()
        elif keep and t.is_contiguous():  # its bytes, copied as uint8 (1-d: a 0-dim bits16 too)
            clone = t.detach().view(-1).view(torch.uint8).clone().view(t.dtype).view(t.shape)
        self._deferred[id(leaf)] = _Deferred(leaf, vector, clone)
        return leaf

    def replace(self, leaf: Leaf, **changes: Any) -> Leaf:
        """The placeholder ``leaf`` with ``changes`` (:meth:`Leaf.replace`), still resolved
        at :meth:`drain` (a leaf not made by :meth:`tensor_leaf` is simply replaced)."""
        new = leaf.replace(**changes)
        d = self._deferred.pop(id(leaf), None)
        if d is not None:
            d.leaf = new
            self._deferred[id(new)] = d
        return new

    def add(self, call: Call) -> None:
        """Hold ``call`` until :meth:`drain`."""
        self._calls.append(call)

    def drain(self) -> None:
        """Resolve every held call (one device-to-host copy per device) and emit them in order."""
        calls, self._calls = self._calls, []
        deferred, self._deferred = self._deferred, {}
        if not calls:
            return
        keys = [key for key, d in deferred.items() if d.vector is not None]
        host = dict(zip(keys, gather_by_device([deferred[k].vector for k in keys])[0]))
        for call in calls:
            if any(id(leaf) in deferred for leaf in call.leaves):
                call = dataclasses.replace(call, leaves=tuple(
                    self._resolve(leaf, deferred.get(id(leaf)), host.get(id(leaf))) for leaf in call.leaves))
            self._emit(call)

    def _resolve(self, leaf: Leaf, d: Optional[_Deferred], row: Optional[list[float]]) -> Leaf:
        if d is None:
            return leaf
        if row is not None:
            leaf = _fill(leaf, row)
        fields: dict[str, Any] = {}
        if d.clone is not None:
            if self._md5:
                fields["crc32"] = crc32_hex(d.clone)
            if self._put is not None:
                snap = tensor_bytes(d.clone)
                if snap is not None:
                    fields["payload"] = self._put(*snap)
        return leaf.replace(**fields) if fields else leaf
