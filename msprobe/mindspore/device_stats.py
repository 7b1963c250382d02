"""MindSpore tensor statistics on the tensor's device, brought to the host once per flush.

design.md, "Performance principles": the hot path never synchronises host and device per
tensor. ``Tensor.asnumpy()`` waits for MindSpore's asynchronous op queue to drain and copies
the whole tensor, so a recorded tensor instead costs (:meth:`DeviceStats.add`):

* one read of its dtype and shape (``Tensor.dtype`` of a tensor an op has just produced
  waits for that op's shape inference: it is read once per tensor);
* one copy op queued on its device (a value an in-place call is about to change is copied
  before the call runs, so its statistics are those of the value before the write):

  =========================  =============================================
  dtype                      copy (group)
  =========================  =============================================
  Float32                    ``x * 1`` (float32)
  Float16, BFloat16, Bool    cast to float32 (exact; Bool as 0/1)
  Float64                    ``x * 1`` (float64)
  integers                   cast to float64 (as the host path: exact below 2**53)
  Complex64/128              ``|z|`` cast to float64
  =========================  =============================================

At a flush (:meth:`DeviceStats.resolve`: the session's flush hooks at ``stop()``, ``step()``
and ``close()``, or when :attr:`DeviceStats.limit` tensors or :attr:`DeviceStats.budget`
bytes of copies are pending) the copies of each group are flattened and concatenated, and
a handful of segment reductions over the concatenation (``unsorted_segment_max``/``min``/
``sum`` over float64, segment ids built on the host) give every tensor's Max, Min, Sum and
sum of squares; the results of both groups are joined and brought to the host with **one**
``asnumpy``. The op count per flush does not depend on the number of tensors, apart from one
flattening view per tensor.

Values, as the host path (:func:`msprobe.core.arrays.array_stats`) gives them: Max/Min
exact (widening is exact), Mean = Sum / numel and Norm = sqrt(sum of squares) accumulated in
float64 (in the device's order, so within float64 rounding of the host's pairwise sums);
Bool Max/Min = any/all; 0-dim Mean = the value, Norm = ``|value|``. A tensor whose Sum or sum
of squares is not finite (it holds NaN or ±Inf, or float64 magnitudes that overflow) or
whose magnitudes need rescaling (:func:`msprobe.core.statistics.rescale_factor`) is
measured on the host instead, from its device copy: those copies are sliced out of the
concatenation and brought back with one more ``asnumpy`` (only in a flush that has such a
tensor), then :func:`array_stats` gives the NaN/Inf facts and ``Max_except_inf_nan`` /
``Min_except_inf_nan`` exactly as on the host path. (MindSpore 2.10 runs the
``unsorted_segment_*`` ops as classic Primitives, synchronously on the calling thread: eight
per flush.)

Where it is used (:func:`wanted`): on GPU and Ascend (``device_target``), where a host
synchronisation stalls the device. On CPU the host path is used: there ``asnumpy`` is a
drain of the op queue and a memory copy, and measured on ``benchmarks/ms_overhead.py``
(MindSpore 2.10, L1) the queued copies and reductions cost more process CPU time than they
save (docs/mindspore.md, "Statistics on the device"). The environment variable
``MSPROBE_MS_DEVICE_STATS`` overrides the choice: ``1`` on every device (the tests use it on
CPU), ``0`` nowhere.

The casts of the table keep every reduction on float64 and the Norm a ``Square`` and a
segment sum, so none of the kernels MindSpore 2.10 lacks on CPU is called (no
``LinalgVectorNorm``; no ``ReduceMax``/``ReduceMin``/``UnsortedSegment*``/``Square``/``Abs``
on BFloat16 or Bool: docs/mindspore.md, "Kernels MindSpore lacks on CPU"). If a device op
fails at a flush anyway (a kernel another backend lacks), every pending tensor of that
flush is measured on the host from its copy (one ``asnumpy`` each) and a warning is logged
once; recording goes on.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
from typing import Any, Callable, Optional

import numpy as np
from mindspore import Tensor, mint, ops
from mindspore.common import dtype as mstype
from mindspore.graph.api import _pynative_executor

from msprobe.core.arrays import array_stats
from msprobe.core.statistics import TensorStats, rescale_factor
from store.records import Call, Leaf

logger = logging.getLogger("msprobe")

#: ``device_target`` values whose tensors are measured on the device by default
DEVICE_TARGETS = frozenset({"GPU", "Ascend"})


def wanted() -> bool:
    """Whether recorders built now measure MindSpore tensors on their device: the
    environment variable ``MSPROBE_MS_DEVICE_STATS`` (``1``: yes, ``0``: no), else True
    when MindSpore's ``device_target`` is GPU or Ascend."""
    forced = os.environ.get("MSPROBE_MS_DEVICE_STATS", "")
    if forced not in ("", "0", "1"):
        raise ValueError(f"MSPROBE_MS_DEVICE_STATS: got {forced!r}; allowed: '0', '1' or unset")
    if forced:
        return forced == "1"
    import mindspore as ms
    return ms.get_context("device_target") in DEVICE_TARGETS

_F32, _F64 = mstype.float32, mstype.float64
_TO_F32 = frozenset({mstype.float16, mstype.bfloat16, mstype.bool_})
_COMPLEX = frozenset({mstype.complex64, mstype.complex128})

#: default number of pending tensors that triggers a flush
LIMIT = 4096
#: default bytes of pending device copies that trigger a flush (256 MiB)
BUDGET = 256 << 20


class Pending:
    """One recorded tensor waiting for its statistics: its device copy (flat after the
    flush) until :meth:`DeviceStats.resolve` sets ``stats``."""

    __slots__ = ("copy", "wide", "numel", "shape", "is_bool", "stats")

    def __init__(self, copy: Tensor, wide: bool, numel: int, shape: tuple, is_bool: bool) -> None:
        self.copy = copy          # float32 (wide False) or float64 (wide True) device tensor
        self.wide = wide
        self.numel = numel
        self.shape = shape
        self.is_bool = is_bool
        self.stats: Optional[TensorStats] = None


class PendingLeaf:
    """A tensor :class:`store.records.Leaf` whose statistics are still on the device.

    Reads of leaf fields (``io``, ``path``, ``leaf_kind``...) go to ``leaf``;
    :meth:`replace` keeps the pending statistics (a gradient reported for several slots)."""

    __slots__ = ("leaf", "item")

    def __init__(self, leaf: Leaf, item: Pending) -> None:
        self.leaf = leaf
        self.item = item

    def __getattr__(self, name: str) -> Any:
        return getattr(self.leaf, name)

    def replace(self, **changes: Any) -> "PendingLeaf":
        """This pending leaf with ``changes`` applied to its :class:`Leaf` fields."""
        return PendingLeaf(self.leaf.replace(**changes), self.item)

    def resolved(self) -> Leaf:
        """The final leaf (after :meth:`DeviceStats.resolve` measured ``item``)."""
        return fill(self.leaf, self.item.stats)


def fill(leaf: Leaf, s: Optional[TensorStats]) -> Leaf:
    """``leaf`` with the statistics ``s`` (None: left without statistics)."""
    if s is None:
        return leaf
    return leaf.replace(max=s.max, min=s.min, mean=s.mean, norm=s.norm, max_finite=s.max_finite,
                        min_finite=s.min_finite, has_nan=s.has_nan, has_inf=s.has_inf)


class DeviceStats:
    """Pending device statistics and the entries waiting for them (one per recorder).

    Args:
        limit: flush when this many tensors are pending (int > 0).
        budget: flush when the pending device copies hold this many bytes (int > 0).
        on_full: called (no arguments) by :meth:`add` when ``limit`` or ``budget`` is
            reached; the recorder resolves and emits there. None: only explicit flushes.

    Attributes:
        transfers: device→host copies made by :meth:`resolve` so far (tests read it).
    """

    def __init__(self, limit: int = LIMIT, budget: int = BUDGET,
                 on_full: Optional[Callable[[], None]] = None) -> None:
        if limit <= 0 or budget <= 0:
            raise ValueError(f"DeviceStats: limit and budget must be positive, got {limit}, {budget}")
        self.limit = limit
        self.budget = budget
        self.on_full = on_full
        self._items: list[Pending] = []
        self._bytes = 0
        self._calls: list[Call] = []
        self.transfers = 0
        self._warned = False

    def __len__(self) -> int:
        """Number of queued entries."""
        return len(self._calls)

    @property
    def pending(self) -> int:
        """Number of tensors waiting for statistics."""
        return len(self._items)

    def add(self, leaf: Leaf, t: Tensor, dt: Any) -> Optional[PendingLeaf]:
        """Queue the statistics of the non-empty MindSpore tensor ``t`` (dtype ``dt``, read
        once by the caller) whose leaf without statistics is ``leaf``; returns its
        :class:`PendingLeaf`, or None for a dtype not in the table above (the caller
        measures it on the host)."""
        grad = _pynative_executor.enable_grad()
        if grad:  # the copy is not part of the user's gradient graph
            _pynative_executor.set_enable_grad(False)
        try:
            if dt == _F32:
                copy, wide = t * 1, False
            elif dt in _TO_F32:
                copy, wide = ops.cast(t, _F32), False
            elif dt == _F64:
                copy, wide = t * 1, True
            elif dt in _COMPLEX:
                copy, wide = ops.cast(ops.abs(t), _F64), True
            elif dt in mstype.int_type or dt in mstype.uint_type:
                copy, wide = ops.cast(t, _F64), True
            else:
                return None
        finally:
            if grad:
                _pynative_executor.set_enable_grad(True)
        item = Pending(copy, wide, leaf.numel, leaf.shape, dt == mstype.bool_)
        self._items.append(item)
        self._bytes += leaf.numel * (8 if wide else 4)
        if (len(self._items) >= self.limit or self._bytes >= self.budget) and self.on_full is not None:
            self.on_full()  # resolves this tensor too: its PendingLeaf then holds the statistics
        return PendingLeaf(leaf, item)

    def queue(self, call: Call) -> None:
        """Queue ``call`` (its leaves may be :class:`PendingLeaf`) until :meth:`resolve`."""
        self._calls.append(call)

    def resolve(self) -> list[Call]:
        """Measure every pending tensor (one device→host copy, two when a tensor holds
        NaN/Inf or needs rescaling) and return the queued entries with their final leaves,
        in the order they were queued. Tensors whose entries are not queued yet keep their
        statistics in their :class:`PendingLeaf`."""
        items, self._items, self._bytes = self._items, [], 0
        calls, self._calls = self._calls, []
        if items:
            try:
                self._measure(items)
            except Exception as exc:  # a kernel the device lacks: the host measures the copies
                if not self._warned:
                    self._warned = True
                    logger.warning("msprobe: device statistics failed (%s: %s); measuring the "
                                   "tensors of this flush on the host", type(exc).__name__, exc)
                for it in items:
                    if it.stats is None:
                        it.stats = _host_stats(it.copy.asnumpy().reshape(it.shape), it.is_bool)
                        self.transfers += 1
        for it in items:
            it.copy = None  # the device memory goes back now
        out = []
        for call in calls:
            if any(isinstance(x, PendingLeaf) for x in call.leaves):
                call = dataclasses.replace(call, leaves=tuple(x.resolved() if isinstance(x, PendingLeaf) else x
                                                 for x in call.leaves))
            out.append(call)
        return out

    def _measure(self, items: list[Pending]) -> None:
        groups = [[it for it in items if not it.wide], [it for it in items if it.wide]]
        parts, flat = [], []
        for group in groups:
            if not group:
                flat.append(None)
                continue
            views = [ops.reshape(it.copy, (-1,)) for it in group]
            y = views[0] if len(views) == 1 else mint.cat(views)
            flat.append(y)
            sizes = np.fromiter((it.numel for it in group), np.int64, len(group))
            ids = Tensor(np.repeat(np.arange(len(group), dtype=np.int32), sizes))
            y64 = y if group[0].wide else ops.cast(y, _F64)
            k = len(group)
            parts += [ops.unsorted_segment_max(y64, ids, k), ops.unsorted_segment_min(y64, ids, k),
                      ops.unsorted_segment_sum(y64, ids, k), ops.unsorted_segment_sum(ops.square(y64), ids, k)]
        host = (parts[0] if len(parts) == 1 else mint.cat(parts)).asnumpy()
        self.transfers += 1
        redo: list[tuple[Pending, Tensor, int]] = []  # measured on the host: (item, group tensor, offset)
        base = 0
        for group, y in zip(groups, flat):
            k = len(group)
            mx, mn, total, squares = (host[base + j * k: base + (j + 1) * k] for j in range(4))
            base += 4 * k
            offset = 0
            for i, it in enumerate(group):
                s = _stats(it, float(mx[i]), float(mn[i]), float(total[i]), float(squares[i]))
                if s is None:
                    redo.append((it, y, offset))
                else:
                    it.stats = s
                offset += it.numel
        if redo:
            slices = [ops.narrow(y, 0, offset, it.numel) for it, y, offset in redo]
            # one dtype per concatenation: float32 copies are widened first (exact)
            slices = [ops.cast(x, _F64) if not it.wide else x for x, (it, _y, _o) in zip(slices, redo)]
            values = (slices[0] if len(slices) == 1 else mint.cat(slices)).asnumpy()
            self.transfers += 1
            offset = 0
            for it, _y, _o in redo:
                a = values[offset:offset + it.numel]
                offset += it.numel
                it.stats = _host_stats(a.reshape(it.shape), it.is_bool)


def _stats(it: Pending, mx: float, mn: float, total: float, squares: float) -> Optional[TensorStats]:
    """The statistics of ``it`` from its device reductions, or None when the host must
    measure it (NaN/Inf present, a sum overflowed, or magnitudes that need rescaling)."""
    s = TensorStats()
    s.max, s.min = mx, mn
    s.has_nan = s.has_inf = False
    if it.is_bool:
        return s
    if not (math.isfinite(total) and math.isfinite(squares)) or rescale_factor(s) is not None:
        return None
    if it.shape:
        s.mean = total / it.numel
        s.norm = math.sqrt(squares)
    else:  # 0-dim: its value (-0.0 included) and its magnitude
        s.mean, s.norm = mx, abs(mx)
    return s


def _host_stats(a: np.ndarray, is_bool: bool) -> TensorStats:
    """:func:`array_stats` of a copy's host values (Bool copies hold 0/1)."""
    return array_stats(a.astype(np.bool_) if is_bool else a)
