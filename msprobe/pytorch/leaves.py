"""Turn nested PyTorch call arguments into dump records (spec section 3.3, fixes 4/13 of 9).

Every leaf of a nested input/output becomes one :class:`store.records.Leaf`:

* tensors: ``{"type": "torch.Tensor", "dtype", "shape", "Max", "Min", "Mean", "Norm",
  "requires_grad"}`` (+ ``md5`` in summary_mode md5); parameters are ``torch.Tensor`` too;
* ``numpy.ndarray``: ``{"type": "numpy.ndarray", "dtype" (numpy's name), "shape", "Max", "Min",
  "Mean", "Norm"}`` in float64 (all null if empty; spec 3.3, section 9), and with task tensor
  the values of ``torch.tensor(ndarray)`` as the payload (a ``.pt`` file, spec 1.1);
* ``None`` (and a missing gradient): JSON ``null``;
* lists, tuples, structseqs: JSON lists; dicts, namedtuples, dataclasses: JSON objects;
* other values: ``{"type": ..., "value": ...}``: int, float, bool, str, slice, Ellipsis,
  ``torch.dtype``, ``torch.device`` (``"cpu"``, ``"cuda:1"``), ``torch.Size``,
  ``torch.memory_format`` (``{"type", "format"}``), numpy scalars (numpy type name), and any
  other object as its qualified type name with a short, safe ``repr``; ``ReduceOp`` and
  ``ProcessGroup`` as :func:`msprobe.pytorch.dist_hooks.distributed_value` says.

Nesting deeper than :data:`MAX_DEPTH` is recorded as a value, never raised.
"""
from __future__ import annotations

import contextlib
import functools
import json
import threading
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch

from msprobe.core.arrays import array_stats
from msprobe.core.checksum import xor64_hex
from msprobe.core.filters import NameList
from msprobe.core.statistics import TensorStats
from msprobe.core.values import MAX_DEPTH, qualname, slice_part, walk  # noqa: F401  (MAX_DEPTH: documented here)
from msprobe.core.values import value_record as core_value_record
from msprobe.pytorch import stats as _stats  # FUSED_CRC / fused_stats_crc looked up at call time
from msprobe.pytorch.compiled import is_fake
from msprobe.pytorch.deferred import PendingLeaf, StatsBatch, device_stats, host_copy, payload_copyable
from msprobe.pytorch.device_checksum import CrcBatch, XorBatch, crc_dtype, stageable as xor_stageable
from msprobe.pytorch.dist_hooks import distributed_value
from msprobe.pytorch.payload import tensor_bytes
from msprobe.pytorch.stats import (NATIVE, NATIVE_KIND, PLAIN_TYPES, crc32_hex, has_data, materialized,
                                   native_stats, opaque, storage_holds, tensor_stats)
from msprobe.pytorch.stats_memo import StatsMemo
from store import schema
from store.direct_io import ALIGN as PAGE, MIN_DIRECT_BYTES
from store.records import LEAF_FIELDS, NULL_TAIL, Leaf, make_leaf

_copy = torch._C.TensorBase.copy_
_detach = torch._C.TensorBase.detach
_NDARRAY = "ndarray"  # private walk kind: a numpy array argument (stored as a tensor leaf)
_STRIDED = torch.strided
_TENSOR = schema.LEAF_TENSOR


def value_record(obj: Any) -> dict:
    """The JSON record of a non-tensor, non-container value: PyTorch's own types here
    (dtype and device wherever they appear, spec 9 fix 13), distributed objects, then the
    framework-neutral records of :func:`msprobe.core.values.value_record`."""
    if isinstance(obj, torch.dtype):
        return {"type": "torch.dtype", "value": str(obj)}
    if isinstance(obj, torch.device):
        return {"type": "torch.device", "value": str(obj)}
    if isinstance(obj, torch.Size):
        return {"type": "torch.Size", "value": list(obj)}
    if isinstance(obj, torch.memory_format):
        return {"type": "torch.memory_format", "format": str(obj).rpartition(".")[2]}
    if not isinstance(obj, (bool, int, float, str, slice, np.generic)) and obj is not Ellipsis:
        dist_record = distributed_value(obj)
        if dist_record is not None:
            return dist_record
    return core_value_record(obj, _slice_part)


def _slice_part(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and v.numel() == 1 and v.layout == torch.strided and v.device.type != "meta":
        return v.item() if not v.is_floating_point() else float(v.item())
    return slice_part(v)


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """``t.to_local()`` (detached) for a ``torch.distributed.tensor.DTensor``, else ``t``."""
    if type(t) is torch.Tensor:
        return t
    to_local = getattr(t, "to_local", None)
    if to_local is None or type(t).__name__ != "DTensor":
        return t
    with torch.no_grad():
        return to_local()


_FUNCTORCH = getattr(torch._C, "_functorch", None)
_is_wrapped = getattr(_FUNCTORCH, "is_functorch_wrapped_tensor", None)
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)
#: switches torch.func's transforms off for the block (operations then see plain tensors)
_no_functorch = getattr(torch._C, "_DisableFuncTorch", contextlib.nullcontext)


def functorch_value(t: torch.Tensor) -> "tuple[bool, Optional[torch.Tensor]]":
    """``(wrapped, value)`` of a tensor met inside ``torch.func`` transforms.

    Inside ``torch.func.grad``/``vjp``/``jvp`` (and ``functionalize``) the arguments are
    wrappers whose memory cannot be read (``untyped_storage()`` raises): ``value`` is the
    tensor they wrap, unwrapped level by level: the same values, dtype and shape.
    Inside ``torch.func.vmap`` a batched tensor holds every sample of the batch: there is no
    one tensor of the call's shape to summarise, and ``value`` is None (the leaf gets null
    statistics). ``wrapped`` is False (and ``value`` is ``t``) for an ordinary tensor."""
    if _is_wrapped is None or not _is_wrapped(t):
        return False, t
    for _ in range(64):  # nested transforms: one wrapper per level
        if not _is_wrapped(t):
            return True, t
        if _FUNCTORCH.is_batchedtensor(t):
            return True, None
        try:
            t = _FUNCTORCH.get_unwrapped(t)
        except RuntimeError:
            return True, None
    return True, None


@functools.lru_cache(maxsize=1)
def _snapshot_aligns() -> bool:
    """Whether the native ``snapshot_at`` takes ``align`` (an extension built before it had
    the argument raises TypeError: snapshots are then plain ``bytes``)."""
    probe = np.zeros(1, dtype=np.float32)
    try:
        NATIVE.snapshot_at(probe.ctypes.data, 1, 0, 0, False, PAGE)
    except TypeError:
        return False
    return True


class LeafBuilder:
    """Builds the leaves of one recorded argument structure.

    Args:
        md5: also compute CRC-32 (summary_mode md5). A plain contiguous CPU float32/float64/
            bfloat16/float16 tensor (:func:`_native_kind`) gets its statistics and CRC-32
            from one read of its memory (:func:`msprobe.pytorch.stats.fused_stats_crc`) when
            ``stats.FUSED_CRC`` is set; other tensors, or without it, two passes
            (``tensor_stats``, ``crc32_hex``). With :attr:`crc_batch` set, a device
            tensor's CRC-32 is computed on the device and filled in at the flush point
            (:mod:`msprobe.pytorch.device_checksum`).
        with_data: compute statistics (False for task ``structure``).
        capture: task ``tensor``: ``capture(tensor) -> payload reference or None`` stores
            the tensor's values; the reference goes to the leaf's ``payload``.
        defer: ``async_dump``: ``defer(io, path, tensor) -> placeholder leaf`` replaces the
            synchronous statistics (see :mod:`msprobe.pytorch.async_dump`).
        high: config.json ``precision: "high"``: statistics accumulated in float64 on every
            path (``tensor_stats(..., high=True)``).
        tensor_list: task statistics with ``tensor_list``: the entry names whose tensors
            are stored through ``capture`` (:meth:`for_entry` turns ``capture`` on and off
            per entry; off until the first call).
        xor: summary_mode xor: instead of the statistics, the 64-bit XOR fold of the
            tensor's C-order bytes (:func:`msprobe.core.checksum.xor64_hex`) in the
            leaf's ``crc32`` (dump.json ``md5``); computed on the host, also with
            ``async_dump``, except for a device tensor when :attr:`xor_batch` is set (then
            folded on the device and filled in at the flush point).

    The recorder sets :attr:`batch`, :attr:`xor_batch`, :attr:`crc_batch` and
    :attr:`defer_payloads` to the staging of its :class:`~msprobe.pytorch.deferred.DeferredStats`
    (which resolves the :class:`~msprobe.pytorch.deferred.PendingLeaf` values at its flush
    points); with their defaults (None, False) every device tensor's statistics take the
    per-tensor kernels, and its checksums and payload are read on the host per tensor.
    """

    __slots__ = ("md5", "xor", "high", "tensor_list", "_capture_all", "_snapshot_all", "with_data", "_defer_all", "capture", "defer", "batch", "xor_batch", "crc_batch", "defer_payloads", "memo", "pending_made", "_scratch",
                 "_snapshot", "_page_args", "_texts", "_small", "_small_table")

    def __init__(self, *, md5: bool, with_data: bool = True, defer_all: bool = False,
                 capture: Optional[Callable[[torch.Tensor], Optional[str]]] = None, xor: bool = False,
                 high: bool = False, tensor_list: Optional[NameList] = None) -> None:
        self.md5 = md5
        self.high = high
        self.xor = xor and with_data
        self.with_data = with_data
        # accelerator tensors always take the deferred (sync-free) path; defer_all sends
        # CPU tensors there too (tests of the deferred path on machines without a device)
        self._defer_all = bool(defer_all)
        self.capture = capture
        self.defer: Optional[Callable[[str, tuple, torch.Tensor], Leaf]] = None
        # device statistics are staged here and reduced together at the flush point
        # (msprobe.pytorch.deferred, "Batched statistics"); None: per-tensor kernels
        self.batch: Optional[StatsBatch] = None
        # summary_mode xor: device tensors' checksums folded on the device at the flush
        # point (msprobe.pytorch.device_checksum); None: copied to the host per tensor
        self.xor_batch: Optional[XorBatch] = None
        # summary_mode md5: device tensors' CRC-32 computed on the device, read at the flush
        # point (msprobe.pytorch.device_checksum); None: copied to the host per tensor
        self.crc_batch: Optional[CrcBatch] = None
        # task tensor: device tensors' host copies queued (pinned memory, non_blocking) and
        # stored at the flush point by whoever resolves the PendingLeaf (the recorder's
        # DeferredStats); False: copied and stored per tensor
        self.defer_payloads = False
        # statistics of tensors recorded twice in a row; the recorder clears it before
        # every intercepted call (msprobe.pytorch.stats_memo)
        self.memo = StatsMemo()
        self.memo.layout_free = not md5  # a CRC-32 depends on the elements' order
        # True once tensor_leaf made a PendingLeaf (device statistics): until then no
        # call can hold one and the recorder skips looking for them
        self.pending_made = False
        self._scratch = _Scratch()  # md5: C-order copies of transposed views
        # task tensor with PayloadCapture and the native pass: copy and statistics in one read
        self._snapshot = (getattr(capture, "snapshot", None)
                          if NATIVE is not None and hasattr(NATIVE, "snapshot_at") else None)
        # large snapshots start on a page (a tensor file or shard then writes them without
        # another copy: store.direct_io); None where the extension predates snapshot_at's align
        self._page_args = (0, False, PAGE) if self._snapshot is not None and _snapshot_aligns() else None
        self._texts = _ValueTexts()  # record texts of the scalars met (leaves)
        self.tensor_list = tensor_list
        self._capture_all, self._snapshot_all = self.capture, self._snapshot
        if tensor_list is not None:
            self.capture = self._snapshot = None
        self._set_small()  # sets _small and _small_table

    def _set_small(self) -> None:
        """Whether _small_leaf may build leaves (without payload or deferral, with the
        CRC-32 of summary_mode md5 where the fused pass exists, ``stats.FUSED_CRC``, read
        here; the capture is checked per leaf: tensor_list switches it per entry)."""
        crc = (_stats.FUSED_CRC or 0) if self.md5 else 0
        self._small = (_small_leaf is not None and self.with_data and (crc or not self.md5) and not self.xor
                       and not self._defer_all)
        self._small_table = _small_table(MEMO_MIN_BYTES, crc) if self._small else ()

    @property
    def defer_all(self) -> bool:
        """Send CPU tensors through the device path too (accelerator tensors always take
        it): the deferred statistics, and no CPU-only shortcut (the native small-leaf,
        plain-leaf, fused CRC-32 and snapshot passes). For measuring and testing the device
        path on machines without a device; may be set at any time."""
        return self._defer_all

    @defer_all.setter
    def defer_all(self, value: bool) -> None:
        self._defer_all = bool(value)
        self._set_small()

    def for_entry(self, name: str) -> None:
        """The leaves built next belong to the entry ``name``: with ``tensor_list``, its
        tensors are stored (task statistics' full tensors) only if ``name`` contains one
        of its strings; without it a no-op. The recorder calls this before building each
        entry's leaves, on the thread that builds them (forward and backward of one step
        never build leaves at the same time)."""
        if self.tensor_list is None:
            return
        if self.tensor_list.matches(name):
            self.capture, self._snapshot = self._capture_all, self._snapshot_all
        else:
            self.capture = self._snapshot = None

    def _align(self, nbytes: int) -> tuple:
        """snapshot_at's arguments after ``kind`` for a snapshot of ``nbytes`` bytes:
        page-aligned from :data:`store.direct_io.MIN_DIRECT_BYTES` bytes on (those files are
        written around the page cache), else none."""
        if self._page_args is not None and nbytes >= MIN_DIRECT_BYTES:
            return self._page_args
        return ()

    def tensor_leaf(self, io: str, path: tuple, t: torch.Tensor, keep: bool = False) -> "Leaf | PendingLeaf":
        """The leaf of one tensor: a :class:`Leaf`, or a :class:`PendingLeaf` whose
        statistics stay on the device until the recorder's next flush point. A DTensor
        (FSDP2 parameters and gradients) is recorded by its local shard: statistics, shape
        and numel of ``t.to_local()`` (no communication while recording; docs/distributed.md).
        ``keep``: ``t`` lives on anyway (a parameter's ``.grad``): the memo may hold it
        until its next clear, like a parameter. A tensor without values (a ``FakeTensor``,
        or a wrapper of one: :func:`msprobe.pytorch.compiled.is_fake`) gets dtype, shape and
        ``requires_grad`` with null statistics, and no payload."""
        if type(t) not in PLAIN_TYPES and is_fake(t):
            return Leaf(io=io, path=path, leaf_kind=schema.LEAF_TENSOR, type="torch.Tensor",
                        dtype=str(t.dtype), shape=tuple(t.shape), numel=t.numel(),
                        requires_grad=bool(t.requires_grad))
        if self.xor:
            return self._xor_leaf(io, path, t)
        if self._small and self.capture is None:
            # the commonest case in one native call: see _SMALL_LEAF
            leaf = _small_leaf(t, io, path, self._small_table)
            if leaf is not None:
                return leaf
        # the common case (see _plain_leaf): statistics (and task tensor's payload) of a
        # plain contiguous CPU tensor
        if (self.defer is None and self.with_data and not self._defer_all and NATIVE is not None
                and (not self.md5 or _stats.FUSED_CRC is not None)):
            leaf = self._plain_leaf(io, path, t, keep)
            if leaf is not None:
                return leaf
        if t.is_nested:
            return self._nested_leaf(io, path, t)
        if _transforms_active():
            # inside torch.func transforms every operation on a tensor (the detach, copy or
            # reduction of statistics, CRC-32 and payload) would give a transform's wrapper
            # without memory: the leaf is built with the transforms switched off
            with _no_functorch():
                return self._general_leaf(io, path, t, keep)
        return self._general_leaf(io, path, t, keep)

    def _general_leaf(self, io: str, path: tuple, t: torch.Tensor, keep: bool) -> "Leaf | PendingLeaf":
        """:meth:`tensor_leaf` of any tensor (the path besides :meth:`_plain_leaf`)."""
        t = local_shard(t)
        wrapped, value = functorch_value(t)
        if wrapped:  # inside torch.func transforms
            if value is None:  # vmap: no one tensor of this shape holds the values
                return Leaf(io=io, path=path, leaf_kind=schema.LEAF_TENSOR, type="torch.Tensor",
                            dtype=str(t.dtype), shape=tuple(t.shape), numel=t.numel(),
                            requires_grad=bool(t.requires_grad))
            requires_grad = bool(t.requires_grad)
            t = value
            if requires_grad != bool(t.requires_grad):  # the wrapper's own flag is the one to record
                leaf = self._general_leaf(io, path, t, keep)
                return leaf.replace(requires_grad=requires_grad) if isinstance(leaf, Leaf) else leaf
        t = materialized(t)  # a ZeroTensor: its zeros (it has no memory to read)
        if self.defer is not None:
            return self.defer(io, path, t)
        if (self.with_data and (not t.is_cpu or self._defer_all) and has_data(t) and not opaque(t)
                and (not self.md5 or (self.crc_batch is not None and (crc_as := crc_dtype(t)) is not None))):
            # statistics (and the CRC-32 of summary_mode md5) stay on the device until the
            # recorder's next flush point; task tensor's copy to the host is queued and
            # stored there too, where the recorder takes it (defer_payloads)
            copy = payload = None
            if self.capture is not None and self.defer_payloads and payload_copyable(t):
                copy = (host_copy(t), t.device)
            else:
                payload = self._payload_of(t)
            self.pending_made = True
            return PendingLeaf(Leaf(io=io, path=path, leaf_kind=schema.LEAF_TENSOR, type="torch.Tensor",
                                    dtype=str(t.dtype), shape=tuple(t.shape), numel=t.numel(),
                                    requires_grad=bool(t.requires_grad), payload=payload),
                               device_stats(t, self.batch), self.crc_batch.stage(t, crc_as) if self.md5 else None,
                               copy)
        st = crc = payload = None
        if self.with_data:
            memo = self.memo
            # an opaque view (null statistics) has the memo key of its whole tensor when
            # dense (layout_free): neither may take the other's value
            remember = t.layout is _STRIDED and not opaque(t)
            hit = memo.get(t) if remember else None
            if hit is not None:
                st, crc = hit
                payload = self._payload_of(t)
                if keep:  # recorded before as an ordinary tensor: hold it from now on
                    memo.put(t, hit, keep=True)
            else:
                native = not self._defer_all  # defer_all: the code a device tensor takes
                kind = _native_kind(t) if native and self.md5 and _stats.FUSED_CRC is not None else None
                c_order = None
                if kind is None and native and self.md5 and _stats.FUSED_CRC is not None:
                    # a transposed view: its CRC-32 is over its C-order bytes
                    kind = _native_kind(t, contiguous=False)
                    c_order = None if kind is None else self._scratch.c_order(t)
                    if c_order is None:
                        kind = None
                if kind is not None:  # statistics and CRC-32 in one pass over the memory
                    st, crc = _stats.fused_stats_crc(t if c_order is None else c_order, kind)
                    payload = self._payload_of(t)
                elif (self._snapshot is not None and not self.md5 and native
                      and (kind := _native_kind(t, contiguous=False)) is not None):
                    # task tensor, a transposed view: the statistics are those of its C-order
                    # copy, read right after the copy is made (what summary_mode md5 reads too)
                    payload, reduced = self._snapshot(t, lambda: _copy_reduce(t, kind))
                    st = native_stats(t, reduced) if reduced is not None else tensor_stats(t, high=self.high)
                else:
                    payload = self._payload_of(t)
                    st = tensor_stats(t, high=self.high)
                    if self.md5:
                        crc = _crc_or_none(t)
                if remember:
                    memo.put(t, (st, crc), keep=keep)
        if st is None:
            return Leaf(io=io, path=path, leaf_kind=schema.LEAF_TENSOR, type="torch.Tensor",
                        dtype=str(t.dtype), shape=tuple(t.shape), numel=t.numel(),
                        requires_grad=bool(t.requires_grad), payload=payload)
        return _stats_leaf(io, path, t, t.numel(), st, crc, payload)

    def _xor_leaf(self, io: str, path: tuple, t: torch.Tensor) -> Leaf:
        """:meth:`tensor_leaf` in summary_mode xor: dtype, shape, ``requires_grad``, the
        payload (task tensor) and the XOR checksum of the C-order bytes in the tensor's own
        dtype (bfloat16 and float8 are not widened), no statistics. A nested tensor's
        checksum is over its components' bytes one after the other; tensors whose bytes
        cannot be read (meta, sparse, quantized, freed storage) get no checksum."""
        if t.is_nested:
            requires_grad = bool(t.requires_grad)
            try:
                with torch.no_grad():
                    parts = [p.detach().reshape(-1) for p in t.unbind()]
                    t = torch.cat(parts) if parts else torch.empty(0, dtype=t.dtype)
            except (RuntimeError, TypeError, NotImplementedError):
                return Leaf(io=io, path=path, leaf_kind=schema.LEAF_TENSOR, type="torch.Tensor",
                            dtype=str(t.dtype), requires_grad=requires_grad)
            return Leaf(io=io, path=path, leaf_kind=schema.LEAF_TENSOR, type="torch.Tensor", dtype=str(t.dtype),
                        numel=t.numel(), crc32=_xor_or_none(t), requires_grad=requires_grad)
        with (_no_functorch() if _transforms_active() else contextlib.nullcontext()):
            t = local_shard(t)
            wrapped, value = functorch_value(t)
            requires_grad = bool(t.requires_grad)
            if wrapped:
                if value is None:  # vmap: no one tensor of this shape holds the values
                    return Leaf(io=io, path=path, leaf_kind=schema.LEAF_TENSOR, type="torch.Tensor",
                                dtype=str(t.dtype), shape=tuple(t.shape), numel=t.numel(),
                                requires_grad=requires_grad)
                t = value
            t = materialized(t)
            if (self.xor_batch is not None and self.defer is None and (not t.is_cpu or self._defer_all)
                    and xor_stageable(t)):
                # a device tensor: its checksum is folded on the device, read at the flush point
                payload = self._payload_of(t)
                self.pending_made = True
                return PendingLeaf(Leaf(io=io, path=path, leaf_kind=schema.LEAF_TENSOR, type="torch.Tensor",
                                        dtype=str(t.dtype), shape=tuple(t.shape), numel=t.numel(),
                                        requires_grad=requires_grad, payload=payload), self.xor_batch.stage(t))
            return Leaf(io=io, path=path, leaf_kind=schema.LEAF_TENSOR, type="torch.Tensor", dtype=str(t.dtype),
                        shape=tuple(t.shape), numel=t.numel(), crc32=_xor_or_none(t),
                        requires_grad=requires_grad, payload=self._payload_of(t))

    def _nested_leaf(self, io: str, path: tuple, t: torch.Tensor) -> Leaf:
        """The leaf of a nested tensor (``torch.nested``, strided or jagged layout; the
        fast path of ``nn.TransformerEncoder`` with a padding mask makes them): its
        components have different shapes, so the record's ``shape`` is null; ``numel``,
        the statistics and the CRC-32 (md5) are those of all components' values, each in C
        order, one after the other. Task tensor writes no file for it. Values that cannot
        be read give null statistics."""
        flat = None
        if self.with_data:
            try:
                with torch.no_grad():
                    parts = [p.detach().reshape(-1) for p in t.unbind()]
                    flat = torch.cat(parts) if parts else torch.empty(0, dtype=t.dtype)
            except (RuntimeError, TypeError, NotImplementedError):
                flat = None
        requires_grad = bool(t.requires_grad)
        if flat is None:
            return Leaf(io=io, path=path, leaf_kind=schema.LEAF_TENSOR, type="torch.Tensor", dtype=str(t.dtype),
                        requires_grad=requires_grad)
        st = tensor_stats(flat, high=self.high)
        crc = _crc_or_none(flat) if self.md5 else None
        return Leaf(io=io, path=path, leaf_kind=schema.LEAF_TENSOR, type="torch.Tensor", dtype=str(t.dtype),
                    numel=flat.numel(), max=st.max, min=st.min, mean=st.mean, norm=st.norm,
                    max_finite=st.max_finite, min_finite=st.min_finite, crc32=crc,
                    requires_grad=requires_grad, has_nan=st.has_nan, has_inf=st.has_inf)

    def _plain_leaf(self, io: str, path: tuple, t: torch.Tensor, keep: bool) -> Optional[Leaf]:
        """:meth:`tensor_leaf` of a plain (``torch.Tensor``/``nn.Parameter``), contiguous,
        non-empty CPU tensor of a dtype the native pass reads, with data (what
        :func:`_native_kind` accepts), without CRC-32 or, with CRC-32 (summary_mode md5), of
        at most :data:`MEMO_MIN_BYTES` bytes without a payload: the same payload (task
        tensor), memo, statistics, CRC-32 and leaf as the general path; None for any other tensor (the caller
        takes the general path), and with a payload to take inside ``torch.func``
        transforms (see :meth:`tensor_leaf`).

        Written for the caches a training step leaves behind: each distinct PyTorch
        attribute or method read here costs microseconds when the operator before evicted its
        code (``benchmarks/RESULTS.md``, "The same Python is 5–15× slower inside a training
        step"), so each is read once (``numel``, ``dtype``;
        ``dim`` only for one element), and the memo key and the storage are computed once
        (the storage is handed to the memo). The ``n``
        elements from the data pointer must lie in the storage's allocation: a storage
        freed or shrunk with ``resize_`` (FSDP frees parameter memory so) leaves a view's
        pointer at its offset, not 0, and reading there would crash the process;
        ``torch.func.functionalize``'s wrappers have no allocation (address 0) and other
        ``torch.func`` wrappers no storage (it raises)."""
        # _native_kind's tests, inlined (keep the two alike); its storage test is the
        # allocation bounds check below
        if (type(t) not in PLAIN_TYPES or not t.is_cpu or t.layout is not _STRIDED or t.is_nested or t.is_neg()
                or not t.is_contiguous()):
            return None
        dtype = t.dtype
        kind = NATIVE_KIND.get(dtype)
        n = t.numel()
        if kind is None or not n:
            return None
        try:
            storage = t.untyped_storage()
            start = storage.data_ptr()
            ptr = t.data_ptr()
            end = start + storage.nbytes()
        except (RuntimeError, NotImplementedError):  # no storage: a torch.func transform's wrapper
            return None
        # the n elements from ptr lie in the allocation: not for a storage freed or shrunk by
        # resize_ (a view's pointer is then its offset, not 0) nor functionalize's wrappers (0)
        if (not start or ptr < start or ptr + n * _ITEMSIZE[kind] > end
                or (self.capture is not None and _transforms_active())):
            return None
        zero_dim = n == 1 and not t.dim()
        if n * _ITEMSIZE[kind] <= MEMO_MIN_BYTES and self.capture is None:
            # reducing a small tensor again costs less than the memo's lookup and entry
            # (the same native pass over the same memory: the same statistics)
            if self.md5:  # the fused statistics + CRC-32 pass of the general path
                st, crc = _stats.fused_stats_crc(t, kind)
                return _stats_leaf(io, path, t, n, st, crc, None, dtype)
            st = native_stats(t, NATIVE.reduce_at(ptr, n, kind), n, zero_dim)
            return _stats_leaf(io, path, t, n, st, None, None, dtype)
        if self.md5:
            return None  # a CRC-32's memo key depends on the layout: the general path
        memo = self.memo
        # StatsMemo's key of a dense tensor (layout_free; the count inlined from stats_memo.dense_count)
        key = (ptr, dtype, -1 if zero_dim else n, False, False)
        hit = memo.get_at(key, t)
        reduced = None
        if self._snapshot is not None:
            # task tensor: the payload's copy and the statistics from one read of the memory.
            # After a memo hit too: the copy comes with fresh statistics that describe the
            # bytes stored (a write no version counter saw leaves the memo's stale:
            # _payload_of; the limits: msprobe.pytorch.stats_memo)
            payload, reduced = self._snapshot(
                t, lambda: NATIVE.snapshot_at(ptr, n, kind, *self._align(n * t.element_size())))
        else:
            payload = None if self.capture is None else self.capture(t)  # _payload_of, inlined
        if hit is not None and reduced is None:
            st = hit[0]
            if keep:  # recorded before as an ordinary tensor: hold it from now on
                memo.put_at(key, t, hit, keep=True, storage=storage)
        else:
            st = native_stats(t, reduced if reduced is not None else NATIVE.reduce_at(ptr, n, kind), n, zero_dim)
            memo.put_at(key, t, (st, None), keep=keep, storage=storage)
        return _stats_leaf(io, path, t, n, st, None, payload, dtype)

    def _payload_of(self, t: torch.Tensor) -> Optional[str]:
        """Task tensor: the payload reference of ``t`` after a memo hit:
        ``capture(t)`` (None without a capture).

        The memo's reference is not reused as it is: a memo entry proves only what version
        counters and intercepted calls can see (:mod:`msprobe.pytorch.stats_memo`), and a
        write through ``x.numpy()``, ``x.untyped_storage()`` or an operator on ``x.data``
        outside the API list would leave the file with the first record's values (stale
        statistics are documented there; a tensor file must hold the recorded values, spec
        1.1). The capture snapshots the values afresh."""
        if self.capture is None:
            return None
        return self.capture(t)

    def ndarray_leaf(self, io: str, path: tuple, a: np.ndarray) -> Leaf:
        """The leaf of one ``numpy.ndarray`` argument (spec 3.3): numpy dtype name, shape and
        float64 statistics (:func:`msprobe.core.arrays.array_stats`; all None if empty); with
        task tensor the payload of ``torch.tensor(a)`` (arrays torch cannot hold, such as
        object arrays, get statistics only when numpy can compute them, and no file)."""
        shape = tuple(int(d) for d in a.shape)
        numel = int(a.size)
        st = None
        if self.xor:
            try:
                xor = xor64_hex(np.ascontiguousarray(a).view(np.uint8).reshape(-1)) if a.dtype != object else None
            except (TypeError, ValueError):
                xor = None
            payload = None
            if self.capture is not None:
                try:
                    payload = self._payload_of(torch.tensor(a))
                except (TypeError, ValueError, RuntimeError):
                    payload = None
            return Leaf(io=io, path=path, leaf_kind=schema.LEAF_TENSOR, type="numpy.ndarray", dtype=str(a.dtype),
                        shape=shape, numel=numel, crc32=xor, payload=payload)
        if self.with_data:
            try:
                st = array_stats(a)
            except (TypeError, ValueError):
                st = None
        payload = crc = None
        if self.with_data and (self.capture is not None or self.md5):
            try:
                t = torch.tensor(a)
            except (TypeError, ValueError, RuntimeError):
                t = None
            if t is not None:
                payload = self._payload_of(t)
                crc = crc32_hex(t) if self.md5 else None
        if st is None:
            return Leaf(io=io, path=path, leaf_kind=schema.LEAF_TENSOR, type="numpy.ndarray", dtype=str(a.dtype),
                        shape=shape, numel=numel, crc32=crc, payload=payload)
        return Leaf(io=io, path=path, leaf_kind=schema.LEAF_TENSOR, type="numpy.ndarray", dtype=str(a.dtype),
                    shape=shape, numel=numel, max=st.max, min=st.min, mean=st.mean, norm=st.norm,
                    max_finite=st.max_finite, min_finite=st.min_finite, crc32=crc,
                    has_nan=st.has_nan, has_inf=st.has_inf, payload=payload)

    def leaves(self, io: str, value: Any, out: list[Leaf], path: tuple = ()) -> None:
        """Append the leaves of ``value`` (found under top-level key ``io``) to ``out``.

        Tensors, ``None``, plain scalars (exactly ``bool``, ``int``, ``float``, ``str``)
        and non-empty plain lists and tuples of those take a direct path (no walk
        generator; a scalar's record text comes from :class:`_ValueTexts`); anything else,
        and lists holding anything else, are walked (:meth:`walk_leaves`). Both give the
        same leaves."""
        cls = type(value)  # not __class__, which an object may fake
        if isinstance(value, torch.Tensor):  # the common case, without the walk's generator
            out.append(self.tensor_leaf(io, path, value))
        elif value is None:
            out.append(make_leaf((io, path, _NONE) + NULL_TAIL))
        elif cls in _SCALARS:
            out.append(make_leaf((io, path, _VALUE) + self._texts.tail(value, cls)))
        elif (cls is tuple or cls is list) and value and all(v is None or type(v) in _SCALARS for v in value):
            tail = self._texts.tail
            for i, v in enumerate(value):
                out.append(make_leaf((io, path + (i,)) + ((_NONE,) + NULL_TAIL if v is None
                                                          else (_VALUE,) + tail(v, type(v)))))
        else:
            self.walk_leaves(io, value, out, path)

    def walk_leaves(self, io: str, value: Any, out: list[Leaf], path: tuple = ()) -> None:
        """:meth:`leaves` of any value by walking it (:func:`msprobe.core.values.walk`)."""
        for p, v, kind in _walk(value, path, 0):
            if kind == schema.LEAF_TENSOR:
                out.append(self.tensor_leaf(io, p, v))
            elif kind == _NDARRAY:
                out.append(self.ndarray_leaf(io, p, v))
            elif kind == schema.LEAF_VALUE:
                out.append(Leaf(io=io, path=p, leaf_kind=kind, type=v.get("type"),
                                value_json=record_text(v)))
            else:
                out.append(Leaf(io=io, path=p, leaf_kind=kind))

    def sequence(self, io: str, values: Any, out: list[Leaf]) -> None:
        """Leaves of a top-level list (``input_args``, ``output``): element ``i`` at path ``(i,)``."""
        for i, v in enumerate(values):
            self.leaves(io, v, out, (i,))

    def mapping(self, io: str, values: dict, out: list[Leaf]) -> None:
        """Leaves of a top-level object (``input_kwargs``, ``parameters``)."""
        for k, v in values.items():
            self.leaves(io, v, out, (str(k),))


#: contiguous CPU tensors of at most this many bytes (no tensor payload) are reduced at
#: every record instead of going through the statistics memo, in summary_mode md5 by the
#: fused statistics + CRC-32 pass on the plain leaf path: the native pass over 16 KiB costs
#: about a microsecond, a memo lookup plus entry about three (benchmarks/host_cost.py, the
#: dispatch workload)
MEMO_MIN_BYTES = 16 << 10

#: bytes per element of each native kind (:data:`~msprobe.pytorch.stats.NATIVE_KIND`)
_ITEMSIZE = {kind: torch.empty(0, dtype=dtype).element_size() for dtype, kind in NATIVE_KIND.items()}

#: ``NATIVE.small_leaf(t, io, path, table)`` (``fused_stats.c``), None without the
#: extension or with one whose ``SMALL_LEAF_TABLE`` is not 3 (the form of :func:`_small_table`): the leaf of a tensor that :meth:`LeafBuilder._plain_leaf` reduces without the memo
#: (at most :data:`MEMO_MIN_BYTES` bytes, no payload; with summary_mode md5 C-contiguous, and
#: its CRC-32 from the same pass as :func:`~msprobe.pytorch.stats.fused_stats_crc`) and whose
#: values are all finite and need no rescaling, built in one call (the same tests, reduction,
#: statistics, CRC-32 and leaf fields, bit for bit); None for any other tensor, which then takes the Python paths. One
#: native call instead of ~15 Python-level attribute reads and three Python frames saves
#: ~1.5 us per tensor warm, more inside a training step (benchmarks/host_cost.py)
_small_leaf = getattr(NATIVE, "small_leaf", None) if getattr(NATIVE, "SMALL_LEAF_TABLE", None) == 3 else None
_SMALL_DTYPES = {dtype: (kind, _ITEMSIZE[kind], str(dtype)) for dtype, kind in NATIVE_KIND.items()}


def _small_table(max_bytes: int, crc: int = 0) -> tuple:
    """The ``table`` argument of ``NATIVE.small_leaf`` for tensors of at most ``max_bytes``
    bytes (:data:`MEMO_MIN_BYTES`, read when a :class:`LeafBuilder` is made); ``crc``: 0, or
    the address of the CRC-32 function (``stats.FUSED_CRC``) for summary_mode md5."""
    template = Leaf(io="", path=(), leaf_kind=_TENSOR, type="torch.Tensor", has_nan=False, has_inf=False)
    slots = tuple(LEAF_FIELDS.index(name) for name in _SMALL_SLOTS)
    return (PLAIN_TYPES, _STRIDED, _SMALL_DTYPES, max_bytes, Leaf, tuple(template), slots, int(crc))


#: the fields ``small_leaf`` sets, in the order it takes their places (``slots``)
_SMALL_SLOTS = ("io", "path", "dtype", "shape", "numel", "max", "min", "mean", "norm", "requires_grad", "crc32")


#: the exact types whose leaves :meth:`LeafBuilder.leaves` builds without walking
_SCALARS = frozenset({bool, int, float, str})
_NONE = schema.LEAF_NONE
_VALUE = schema.LEAF_VALUE


#: ints of this magnitude or more are not remembered by :class:`_ValueTexts`
_BIG_INT = 1 << 64


class _ValueTexts:
    """The leaf fields of plain scalars, remembered: a recorded call's scalar arguments
    (``p=0.0``, ``dim=1``, ``training=True``, ``alpha=-0.01``) repeat from call to call and
    step to step, and building a record and its JSON text (``json.dumps``) each time cost
    ~15 us per scalar inside a training step (180 per step of the encoder benchmark at L1).

    :meth:`tail` gives the fields after ``leaf_kind`` of the value leaf of one scalar:
    ``type``, then None up to ``value_json``, the record text, both from
    :func:`value_record` and ``json.dumps``, as :meth:`LeafBuilder.walk_leaves` makes them.
    Keys: the value itself for ``bool``/``int``/``str`` (one dict per type: ``True`` and
    ``1`` stay apart); ``float.hex()`` for floats (``0.0`` and ``-0.0`` compare equal but
    are recorded as different texts; every NaN has the same text). Strings longer than
    :data:`MAX_KEY_STR` characters, ints of magnitude 2**64 or more and NaNs are not
    remembered. Each type holds at most
    :data:`MAX_ENTRIES` texts; a full one starts afresh."""

    MAX_ENTRIES = 4096
    MAX_KEY_STR = 64

    __slots__ = ("_by_type",)

    def __init__(self) -> None:
        self._by_type: dict[type, dict] = {bool: {}, int: {}, float: {}, str: {}}

    def tail(self, value: Any, cls: type) -> tuple:
        """The leaf fields after ``leaf_kind`` of the scalar ``value`` of exact type
        ``cls`` (one of :data:`_SCALARS`).

        Raises:
            KeyError: ``cls`` is not one of :data:`_SCALARS`.
        """
        if cls is float:
            if value != value:  # NaN
                return _value_tail(value)[0]
            key = value.hex()
        elif (cls is str and len(value) > self.MAX_KEY_STR) or (cls is int and not -_BIG_INT < value < _BIG_INT):
            return _value_tail(value)[0]
        else:
            key = value
        texts = self._by_type[cls]
        tail = texts.get(key)
        if tail is None:
            tail, described = _value_tail(value)
            if described:
                if len(texts) >= self.MAX_ENTRIES:
                    texts.clear()
                texts[key] = tail
        return tail


def _value_tail(value: Any) -> tuple[tuple, bool]:
    """``(fields, described)``: the fields after ``leaf_kind`` of the value leaf of
    ``value`` (``type`` and ``value_json`` from :func:`value_record`, None between them),
    and False when :func:`value_record` raised and the record says ``"<unrecordable>"``
    (as :func:`msprobe.core.values.walk` records it; not to be remembered)."""
    try:
        record, described = value_record(value), True
    except Exception:  # noqa: BLE001 - recorded as such, like the walk does
        record, described = {"type": qualname(value), "value": "<unrecordable>"}, False
    # (a value whose JSON text fails, an int beyond Python's digit limit, is never remembered)
    tail = [None] * (len(LEAF_FIELDS) - _TAIL_START)
    tail[_TYPE_AT] = record.get("type")
    tail[_VALUE_JSON_AT] = record_text(record)
    return tuple(tail), described


#: where the fields after ``leaf_kind`` start in a leaf, and ``type``/``value_json`` among them
_TAIL_START = LEAF_FIELDS.index("leaf_kind") + 1
_TYPE_AT = LEAF_FIELDS.index("type") - _TAIL_START
_VALUE_JSON_AT = LEAF_FIELDS.index("value_json") - _TAIL_START


def record_text(record: dict) -> str:
    """``json.dumps(record)``; where the value has no JSON text (an int of more digits
    than Python converts to text: ``ValueError``), the record with ``"value":
    "<unrecordable>"`` instead, as for a value whose description fails: one argument never
    stops the recording."""
    try:
        return json.dumps(record)
    except (ValueError, TypeError, OverflowError, RecursionError):
        return json.dumps({"type": record.get("type"), "value": "<unrecordable>"})


def _native_kind(t: torch.Tensor, contiguous: bool = True) -> Optional[int]:
    """The native pass's ``kind`` code (:data:`~msprobe.pytorch.stats.NATIVE_KIND`) of ``t``
    when the pass may read its memory directly: a plain (``torch.Tensor``/``nn.Parameter``)
    C-contiguous, non-empty CPU tensor with data, not a negative-bit view, of a dtype the
    pass reads (real floats: never a conjugate view); else None. The plain leaf path and the
    fused statistics + CRC-32 pass (:func:`msprobe.pytorch.stats.fused_stats_crc`) take such
    tensors. ``contiguous=False``: the same for a tensor in any layout (its C-order copy is
    what the pass then reads: :class:`_Scratch`)."""
    if (type(t) not in PLAIN_TYPES or not t.is_cpu or t.layout is not _STRIDED or t.is_nested or t.is_neg()
            or (contiguous and not t.is_contiguous())):
        return None
    kind = NATIVE_KIND.get(t.dtype)
    if kind is None or not t.numel():
        return None
    if not storage_holds(t):  # no storage to read (a torch.func wrapper), freed, or shrunk below t
        return None
    return kind


class _Scratch(threading.local):
    """A reusable C-order copy of a non-contiguous tensor, per thread (summary_mode md5:
    the CRC-32 is over C-order bytes). ``x.contiguous()`` allocates fresh memory for every
    copy, and each first touch of a page costs more than the copy itself (on the benchmark
    VM ~500 us per 1 MiB view for copy + CRC-32, plus ~110 us for its statistics in memory
    order); the scratch buffer is allocated once, grows to the largest view met up to
    :data:`SCRATCH_BYTES`, and the fused pass then reads the copy once for statistics and
    CRC-32 together."""

    def __init__(self) -> None:
        self.buf: Optional[torch.Tensor] = None

    def c_order(self, t: torch.Tensor) -> Optional[torch.Tensor]:
        """A C-contiguous copy of ``t`` (same dtype and shape) in the scratch buffer, valid
        until the next call on this thread; None when ``t`` is larger than
        :data:`SCRATCH_BYTES` or empty, or the copy fails."""
        nbytes = t.numel() * t.element_size()
        if not 0 < nbytes <= SCRATCH_BYTES:
            return None
        buf = self.buf
        if buf is None or buf.numel() < nbytes:
            buf = self.buf = torch.empty(max(nbytes, 1 << 16), dtype=torch.uint8)
        try:
            out = buf[:nbytes].view(t.dtype).view(t.shape)
            with torch.no_grad():
                _copy(out, _detach(t))  # the C methods: Tensor.copy_ may be an API wrapper now
        except RuntimeError:
            return None
        return out


#: the largest non-contiguous tensor (unit: bytes) copied into a thread's scratch buffer in
#: summary_mode md5; larger ones take the two passes of ``tensor_stats`` and ``crc32_hex``
SCRATCH_BYTES = 4 << 20


def _copy_reduce(t: torch.Tensor, kind: int) -> tuple:
    """``(C-order copy of t's bytes, the native reduction of that copy)`` (task tensor, a
    non-contiguous ``t`` of native kind ``kind``): the copy is :func:`tensor_bytes`' (a
    read-only uint8 array), reduced right after it is written; ``(None, None)`` when ``t``
    cannot be copied."""
    snap = tensor_bytes(t)
    if snap is None or not len(snap[0]):
        return None, None
    return snap[0], NATIVE.reduce(snap[0], kind)


def _xor_or_none(t: torch.Tensor) -> Optional[str]:
    """:func:`~msprobe.core.checksum.xor64_hex` of ``t``'s C-order bytes
    (:func:`~msprobe.pytorch.payload.tensor_bytes`), None when they cannot be read."""
    try:
        snap = tensor_bytes(t)
        return None if snap is None else xor64_hex(snap[0])
    except Exception:  # noqa: BLE001  (a missing checksum, never a stopped recording)
        return None


def _crc_or_none(t: torch.Tensor) -> Optional[str]:
    """:func:`~msprobe.pytorch.stats.crc32_hex` of ``t``, None when it fails (a missing
    CRC-32, never a stopped recording)."""
    try:
        return crc32_hex(t)
    except Exception:  # noqa: BLE001
        return None


#: ``str(dtype)`` by dtype (_dtype_text)
_DTYPE_TEXT: dict = {}


def _dtype_text(dtype: torch.dtype) -> str:
    """``str(dtype)`` (``"torch.float32"``), remembered: inside a training step each
    ``torch.dtype.__str__`` call costs microseconds (its code has left the CPU caches)."""
    text = _DTYPE_TEXT.get(dtype)
    if text is None:
        text = _DTYPE_TEXT[dtype] = str(dtype)
    return text


def _stats_leaf(io: str, path: tuple, t: torch.Tensor, numel: int, st: TensorStats, crc: Optional[str],
                payload: Optional[str], dtype: Optional[torch.dtype] = None) -> Leaf:
    """The tensor leaf of ``t`` (``numel`` elements; ``dtype``: ``t.dtype`` when the caller
    has read it) with statistics ``st``, CRC-32 ``crc`` (8 hex digits or None) and payload
    reference ``payload`` (or None)."""
    if dtype is None:
        dtype = t.dtype
    # make_leaf: the fields in LEAF_FIELDS order, without keyword parsing (hot path)
    return make_leaf((io, path, _TENSOR, "torch.Tensor", _DTYPE_TEXT.get(dtype) or _dtype_text(dtype),
                      tuple(t.shape), numel, st.max, st.min, st.mean, st.norm, st.max_finite, st.min_finite, crc,
                      bool(t.requires_grad), st.has_nan, st.has_inf, None, payload, None))


def _leaf_kind(value: Any) -> Optional[str]:
    if isinstance(value, torch.Tensor):
        return schema.LEAF_TENSOR
    if isinstance(value, np.ndarray):
        return _NDARRAY
    if isinstance(value, torch.Size):
        return schema.LEAF_VALUE
    return None


def _walk(value: Any, path: tuple, depth: int) -> Iterator[tuple[tuple, Any, str]]:
    return walk(value, leaf_kind=_leaf_kind, record=value_record, as_list=is_structseq, path=path, depth=depth)


def is_structseq(value: Any) -> bool:
    """True for PyTorch's named-tuple-like return types (``torch.return_types.max``...),
    which dump.json records as lists."""
    return isinstance(value, tuple) and (type(value).__module__ == "torch.return_types"
                                         or hasattr(type(value), "n_sequence_fields"))


class HoldingLeafBuilder(LeafBuilder):
    """A :class:`LeafBuilder` for ``tensor.bench_path`` (:mod:`msprobe.core.bench`): it
    stores no tensor while building leaves, and while :attr:`held` is a list it appends
    ``(io, path, tensor)`` of every tensor leaf it builds, so that the recorder can store
    the tensors of a call afterwards (:attr:`store`, the capture it was given), once the
    call turns out to be selected. A tensor whose CRC-32 is staged on the device (a
    :class:`~msprobe.pytorch.deferred.PendingLeaf` with a ``crc`` row) is appended as
    ``(io, path, None)``: its staging row holds its values. Arguments as for
    :class:`LeafBuilder`."""

    __slots__ = ("held", "store")

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.held: Optional[list] = None
        self.store = self.capture
        self.capture = self._capture_all = self._snapshot = self._snapshot_all = None

    def tensor_leaf(self, io: str, path: tuple, t: torch.Tensor, keep: bool = False) -> "Leaf | PendingLeaf":
        leaf = super().tensor_leaf(io, path, t, keep)
        if self.held is not None:
            staged = isinstance(leaf, PendingLeaf) and leaf.crc is not None
            self.held.append((io, path, None if staged else t))
        return leaf
