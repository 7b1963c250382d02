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

**Batched statistics** (:class:`StatsBatch`, used by the recorder for every tensor the
Triton kernel does not take): at record time a tensor's values are copied, widened to
float64, into the next free slot of a staging buffer of its device (one kernel: a copy, or
``abs`` for a complex tensor; the values are those of the moment of the call, so a later
in-place change does not reach them). When the buffer is full, and at the flush point,
the whole buffer is reduced at once with segmented reductions
(``torch.segment_reduce`` over the tensors' lengths: about 25 kernels per buffer, 35
where it holds float64 or complex128 values, whatever the number of tensors in it) into a ``(tensors, 9)`` float64 matrix in the
layout above, value 8 the rescale factor ``f`` (1.0 except for float64 magnitudes
outside 2**±400). The memory budget is the buffer: :data:`BATCH_ELEMENTS` float64
values (32 MiB) per device; a tensor of more than :data:`BATCH_MAX_ELEMENTS` elements
takes the per-tensor kernels (its own work then dwarfs their launches). Amortised over
a flush, a recorded tensor costs about one kernel (``benchmarks/device_ops.py``).

**tensor.bench_path** (:class:`HeldCall`): a forward call whose CRC-32s are on the device is
queued with its tensors' values held: a staged tensor's in its CRC-32 staging row (kept
after the reduction, :attr:`~msprobe.pytorch.device_checksum.CrcBatch.keep_rows`), another
tensor's as a host copy made when the call ended. At the flush point
:meth:`DeferredStats.resolve` asks :attr:`DeferredStats.bench_decide` about each such call,
in recording order, and stores the selected calls' tensors (one copy per device of the
staged values); the rest is dropped.
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, replace

import torch

from msprobe.core.statistics import RESCALE_BIG, RESCALE_SMALL
from msprobe.pytorch import triton_stats
from msprobe.pytorch.device_checksum import CrcBatch, CrcRow, XorBatch, XorRow, crc_hex, xor_hex
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


#: the staging buffer of :class:`StatsBatch`, in float64 elements per device (32 MiB): the
#: memory the batched statistics hold besides their results (72 bytes per tensor)
BATCH_ELEMENTS = 1 << 22
#: tensors with more elements than this take the per-tensor kernels (:func:`stats_vector`)
BATCH_MAX_ELEMENTS = 1 << 20
#: columns of a batch's result matrix: the layout above and the rescale factor ``f``
BATCH_WIDTH = WIDTH + 1


@dataclass(frozen=True, slots=True)
class Row:
    """A tensor staged in a :class:`StatsBatch`: row ``index`` of ``chunk``'s result."""

    chunk: "_Chunk"
    index: int


class _Chunk:
    """One staging buffer of a device: ``buf`` (float64, ``capacity`` elements) filled
    from the start, ``lengths`` the staged tensors' element counts in order; ``result``
    (a ``(len(lengths), BATCH_WIDTH)`` float64 matrix on the device) once reduced."""

    __slots__ = ("buf", "used", "lengths", "result", "wide")

    def __init__(self, device: torch.device, capacity: int) -> None:
        self.buf = torch.empty(capacity, dtype=_F64, device=device)
        self.used = 0
        self.lengths: list[int] = []
        self.result: "torch.Tensor | None" = None
        self.wide = False  # holds float64 or complex128 values (which may need rescaling)

    def put(self, x: torch.Tensor, n: int) -> Row:
        """Copy the values of ``x`` (``n`` elements, detached, real or complex) into the
        next slot: widened to float64, ``|z|`` of a complex tensor; one kernel."""
        shape = tuple(x.shape)
        stride, step = [], 1
        for size in reversed(shape):
            stride.append(step)
            step *= size
        slot = self.buf.as_strided(shape, tuple(reversed(stride)), self.used)
        if x.is_complex():
            torch.abs(x, out=slot)
        else:
            slot.copy_(x)
        self.used += n
        self.lengths.append(n)
        if x.dtype in _WIDE:
            self.wide = True
        return Row(self, len(self.lengths) - 1)

    def reduce(self) -> None:
        """Reduce the staged values (:func:`segment_stats`; where the device lacks a
        kernel it needs, :func:`torch_parts` per tensor, the same values) and free the
        buffer."""
        if self.result is None:
            flat = self.buf[:self.used]
            try:
                self.result = segment_stats(flat, self.lengths, self.wide)
            except (RuntimeError, NotImplementedError):  # e.g. no segment_reduce on this device
                self.result = _rows_one_by_one(flat, self.lengths)
            self.buf = None


def _rows_one_by_one(flat: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """:func:`segment_stats` computed tensor by tensor with :func:`torch_parts` (13
    kernels each): the fallback for a device without ``segment_reduce``."""
    rows, start = [], 0
    for n in lengths:
        extremes, total, norm, scale = torch_parts(flat[start:start + n])
        rows.append(torch.cat([extremes, torch.stack([total, norm, scale])]))
        start += n
    return torch.stack(rows)


class StatsBatch:
    """Stages tensors for statistics computed together (module docstring, "Batched
    statistics"); one per recorder.

    Args:
        capacity: elements of one staging buffer (float64) per device.
        largest: tensors with more elements are not staged (:meth:`stage` returns None).
    """

    def __init__(self, capacity: int = BATCH_ELEMENTS, largest: int = BATCH_MAX_ELEMENTS) -> None:
        if not 0 < largest <= capacity:
            raise ValueError(f"need 0 < largest <= capacity, got largest={largest}, capacity={capacity}")
        self.capacity = capacity
        self.largest = largest
        self._open: dict[torch.device, _Chunk] = {}

    def stage(self, t: torch.Tensor) -> "Row | None":
        """Copy the values of the non-empty strided tensor ``t`` into its device's buffer
        (a full buffer is reduced first, queued kernels only); None for a tensor of more
        than ``largest`` elements. No host synchronisation."""
        with torch.no_grad():
            x = computable(t)  # a quantized tensor: its dequantized values (no grad: no detach needed)
            n = x.numel()
            if n > self.largest:
                return None
            chunk = self._open.get(x.device)
            if chunk is None or chunk.used + n > self.capacity:
                if chunk is not None:
                    chunk.reduce()
                chunk = self._open[x.device] = _Chunk(x.device, self.capacity)
            return chunk.put(x, n)

    def reduce_all(self) -> None:
        """Reduce every buffer still open (queued kernels only)."""
        open_, self._open = self._open, {}
        for chunk in open_.values():
            chunk.reduce()


def device_stats(t: torch.Tensor, batch: "StatsBatch | None") -> "Parts | Row":
    """The pending statistics of the non-empty strided tensor ``t``: the Triton kernel's
    vector where it applies (:func:`stats_vector`), else a :class:`Row` of ``batch``,
    else (no batch, or a tensor too large for it) the per-tensor parts."""
    if batch is not None and not (t.is_floating_point() and t.dtype != _F64 and triton_stats.usable(t)):
        row = batch.stage(t)
        if row is not None:
            return row
    return stats_vector(t)


def _lengths_on(lengths: list[int], device: torch.device) -> torch.Tensor:
    """``lengths`` as an int64 tensor on ``device`` without a host synchronisation (on an
    accelerator: a pinned host tensor copied with ``non_blocking=True``)."""
    host = torch.tensor(lengths, dtype=torch.int64)
    if device.type == "cpu":
        return host
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


_WIDE = (_F64, torch.complex128)


def segment_stats(flat: torch.Tensor, lengths: list[int], rescale: bool = True) -> torch.Tensor:
    """The statistics of consecutive segments of the 1-d float64 tensor ``flat``
    (segment ``i`` has ``lengths[i] > 0`` elements; their sum is ``flat.numel()``) as a
    ``(len(lengths), BATCH_WIDTH)`` float64 matrix on ``flat``'s device: the layout of
    the module docstring, column 8 the factor ``f`` that Sum and Norm are divided by
    (:func:`_rescale_parts`; ``rescale=False``: 1.0, for values of a type narrower than
    float64, whose squares neither overflow nor underflow in float64). A fixed number of
    kernels (about 25, 35 with ``rescale``), none of them a host synchronisation
    (``segment_reduce(..., unsafe=True)`` skips its checks, which would read ``lengths``
    back)."""
    lens = _lengths_on(lengths, flat.device)

    def seg(v: torch.Tensor, how: str) -> torch.Tensor:
        return torch.segment_reduce(v, how, lengths=lens, unsafe=True)

    # NaN is removed before every max/min: has_nan is counted apart, not left to the
    # kernel's NaN propagation
    has_nan = seg(flat.isnan().to(_F64), "sum") > 0
    nn_max = seg(torch.nan_to_num(flat, nan=-_INF, posinf=_INF, neginf=-_INF), "max")
    nn_min = seg(torch.nan_to_num(flat, nan=_INF, posinf=_INF, neginf=-_INF), "min")
    fin_max = seg(torch.nan_to_num(flat, nan=-_INF, posinf=-_INF, neginf=-_INF), "max")
    fin_min = seg(torch.nan_to_num(flat, nan=_INF, posinf=_INF, neginf=_INF), "min")
    mx = nn_max.masked_fill(has_nan, math.nan)
    mn = nn_min.masked_fill(has_nan, math.nan)
    if rescale:
        m = torch.maximum(mx.abs(), mn.abs())  # NaN where has_nan: then f is 1.0
        scale = (torch.ones_like(m).masked_fill_((m > 0) & (m <= RESCALE_SMALL), _SCALE_TINY)
                 .masked_fill_(m >= RESCALE_BIG, _SCALE_BIG))
        y = flat / torch.repeat_interleave(scale, lens, output_size=flat.numel())
    else:
        scale, y = torch.ones_like(mx), flat
    total = seg(y, "sum")
    norm = seg(y * y, "sum").sqrt()
    return torch.stack([mx, mn, nn_max, nn_min, fin_max, fin_min, total, norm, scale], dim=1)


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
    """A tensor leaf whose statistics are still on the device (``vector``: its parts, or
    its :class:`Row` of a :class:`StatsBatch`), or in summary_mode xor its checksum
    (an :class:`~msprobe.pytorch.device_checksum.XorRow`); in summary_mode md5 ``crc``,
    its CRC-32 (:class:`~msprobe.pytorch.device_checksum.CrcRow`)."""

    leaf: Leaf
    vector: "Parts | Row | XorRow"
    crc: "CrcRow | None" = None  # summary_mode md5: the CRC-32 staged on the device
    # task tensor: (host copy of the values, filled without waiting; the device copied from)
    payload: "tuple[torch.Tensor, torch.device] | None" = None


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A C-contiguous host tensor receiving the values of the strided tensor ``t`` (task
    tensor): on a CUDA device pinned memory filled with ``non_blocking=True``, so the copy
    is only queued; the holder waits once per flush point (:meth:`DeferredStats.resolve`)
    before reading it. A lazily conjugated or negated view is copied as its values."""
    pinned = t.device.type == "cuda"
    host = torch.empty(tuple(t.shape), dtype=t.dtype, pin_memory=pinned)
    with torch.no_grad():
        host.copy_(t, non_blocking=pinned)
    return host


def payload_copyable(t: torch.Tensor) -> bool:
    """Whether :func:`host_copy` takes ``t``: not quantized, not an opaque dtype (those keep
    :func:`msprobe.pytorch.payload.tensor_bytes`' own handling)."""
    from msprobe.pytorch.stats import OPAQUE_DTYPES

    return not t.is_quantized and t.dtype not in OPAQUE_DTYPES


#: bytes of values held between flush points at which the recorder resolves at once: task
#: tensor's pending host copies (pinned memory); with ``tensor.bench_path`` also the CRC-32
#: staging matrices kept for the calls not yet decided and the copies of their tensors that
#: were not staged (:class:`HeldCall`)
PAYLOAD_BUDGET = 256 << 20


@dataclass(frozen=True, slots=True)
class HostCopy:
    """A queued host copy (:func:`host_copy`) of a tensor of ``device``."""

    host: torch.Tensor
    device: torch.device


@dataclass(frozen=True, slots=True)
class HeldCall:
    """``tensor.bench_path``: a forward call whose selection waits for the flush point
    (some of its CRC-32s are still on the device, or an earlier call waits too).

    Attributes:
        keys: ``(io, path)`` of the tensor leaves a selected call stores.
        copies: ``{(io, path): value}`` of those tensors whose values are not in a CRC-32
            staging row (their CRC-32 was computed on the host): a :class:`HostCopy`
            queued when the call ended, or where no host copy applies (quantized, opaque
            dtypes) a detached clone, stored through :attr:`DeferredStats.store`.
        nbytes: bytes of the host copies in ``copies`` (counted against
            :data:`PAYLOAD_BUDGET`; the rare clones are not).
    """

    keys: frozenset
    copies: dict
    nbytes: int = 0


def _torch_dtype(text: str) -> "torch.dtype | None":
    """The ``torch.dtype`` named ``text`` (``"torch.bfloat16"``), None for another name."""
    dtype = getattr(torch, text[6:], None) if text.startswith("torch.") else None
    return dtype if isinstance(dtype, torch.dtype) else None


class DeferredStats:
    """Entries waiting for their device statistics, resolved together at a flush point.

    Args:
        limit: resolve on its own when this many vectors are pending (bounds memory).
        batch: the :class:`StatsBatch` whose rows the pending leaves may hold (a new one
            by default; the recorder hands it to its leaf builder).
    """

    def __init__(self, limit: int = 4096, batch: "StatsBatch | None" = None) -> None:
        self._calls: list[tuple[Call, list, "HeldCall | None"]] = []
        self._pending = 0
        self.limit = limit
        self.batch = batch if batch is not None else StatsBatch()
        self.xor_batch = XorBatch()  # summary_mode xor: the leaves' checksums
        self.crc_batch = CrcBatch()  # summary_mode md5: the leaves' CRC-32
        # task tensor: put(data, dtype, shape) -> payload reference, for PendingLeaf.payload
        # (Session.put_payload; the recorder sets it)
        self.put_payload = None
        self._payload_bytes = 0
        self.transfers = 0  # number of device→host copies made (tests read this)
        # tensor.bench_path (the recorder sets both): decide(call, held) -> True when the
        # call (its leaves final) is selected, and store(tensor) -> payload reference
        self.bench_decide = None
        self.store = None

    def __len__(self) -> int:
        return len(self._calls)

    def add(self, call: Call, leaves: list, held: "HeldCall | None" = None) -> bool:
        """Queue ``call`` whose ``leaves`` may hold :class:`PendingLeaf`; ``held``:
        tensor.bench_path, the call's tensors waiting for its selection. True if the queue
        reached its limit or its memory budget and should be resolved now."""
        self._calls.append((call, leaves, held))
        for x in leaves:
            if isinstance(x, PendingLeaf):
                self._pending += 1
                if x.payload is not None:
                    self._payload_bytes += x.payload[0].numel() * x.payload[0].element_size()
        if held is not None:
            self._payload_bytes += held.nbytes
        return (self._pending >= self.limit
                or self._payload_bytes + self.crc_batch.kept_bytes >= PAYLOAD_BUDGET)

    def resolve(self) -> list[Call]:
        """Gather every pending vector (one copy per device) and return the final calls,
        in the order they were queued."""
        calls, self._calls, self._pending, self._payload_bytes = self._calls, [], 0, 0
        pending = [x for _, leaves, _ in calls for x in leaves if isinstance(x, PendingLeaf)]
        self.batch.reduce_all()
        self.xor_batch.fold_all()
        self.crc_batch.reduce_all()
        items: list[Parts] = []  # per-tensor parts, and each reduced chunk's result once
        chunks: dict[int, int] = {}

        def spot(v) -> tuple[int, int, int]:
            """(item, first value, count; 0: the whole item) of one pending value"""
            if isinstance(v, (Row, XorRow, CrcRow)):
                i = chunks.get(id(v.chunk))
                if i is None:
                    i = chunks[id(v.chunk)] = len(items)
                    # XOR and CRC words travel as two int32 halves: exact in the float64 gathered
                    items.append((v.chunk.result if isinstance(v, Row) else v.chunk.result.view(torch.int32),))
                width = BATCH_WIDTH if isinstance(v, Row) else 2
                return i, v.index * width, width
            items.append(v)
            return len(items) - 1, 0, 0

        spots = [(spot(x.vector), None if x.crc is None else spot(x.crc)) for x in pending]
        host, copies = gather_by_device(items)
        self.transfers += copies

        def value(where: tuple[int, int, int]) -> list:
            i, start, n = where
            return host[i][start:start + n] if n else host[i]

        _wait_for_copies({x.payload[1] for x in pending if x.payload is not None})
        finals = []
        for x, (where, crc_where) in zip(pending, spots):
            if isinstance(x.vector, XorRow):
                leaf = x.leaf.replace(crc32=xor_hex(*value(where)))
            else:
                leaf = _fill(x.leaf, value(where))
                if crc_where is not None:
                    leaf = leaf.replace(crc32=crc_hex(value(crc_where)[0], x.crc.nbytes))
            if x.payload is not None:
                leaf = leaf.replace(payload=self._put(x.payload[0], leaf.dtype))
            finals.append(leaf)
        it = iter(finals)
        out = [replace(call, leaves=tuple(next(it) if isinstance(x, PendingLeaf) else x for x in leaves))
               for call, leaves, _ in calls]
        if any(held is not None for _, _, held in calls):
            self._held_payloads(calls, out)
        return out

    def _held_payloads(self, calls: list, out: list[Call]) -> None:
        """tensor.bench_path: decide, in the order the calls were recorded, which held calls
        are selected (:attr:`bench_decide`), and give the selected calls' tensor leaves
        their payloads, in place in ``out``: a staged tensor's values are read from its
        CRC-32 staging row (one copy per device for all of them), a held copy is stored as
        it is. Nothing is copied when no call is selected."""
        staged: list[tuple[int, int, CrcRow]] = []
        kept: list[tuple[int, int, object]] = []
        for i, ((_, leaves, held), call) in enumerate(zip(calls, out)):
            if held is None or self.bench_decide is None or not self.bench_decide(call, held):
                continue
            for j, (x, leaf) in enumerate(zip(leaves, call.leaves)):
                key = (leaf.io, tuple(leaf.path))
                if leaf.leaf_kind != schema.LEAF_TENSOR or leaf.payload is not None or key not in held.keys:
                    continue
                if isinstance(x, PendingLeaf) and x.crc is not None:
                    staged.append((i, j, x.crc))
                elif key in held.copies:
                    kept.append((i, j, held.copies[key]))
        if not staged and not kept:
            return
        refs: dict[tuple[int, int], "str | None"] = {}
        by_device: dict[torch.device, list] = {}
        for i, j, row in staged:
            by_device.setdefault(row.chunk.rows.device, []).append((i, j, row))
        for rows in by_device.values():  # one device→host copy per device
            flat = torch.cat([row.values() for _, _, row in rows]).to("cpu")
            self.transfers += 1
            start = 0
            for i, j, row in rows:
                leaf = out[i].leaves[j]
                host = flat[start:start + row.nbytes].clone().view(row.dtype)
                start += row.nbytes
                dtype = _torch_dtype(leaf.dtype)
                if dtype is not None and dtype != row.dtype:  # bfloat16/float8 staged as float32: exact
                    host = host.to(dtype)
                refs[(i, j)] = self._put(host.reshape(leaf.shape), leaf.dtype)
        _wait_for_copies({c.device for _, _, c in kept if isinstance(c, HostCopy)})
        for i, j, c in kept:
            leaf = out[i].leaves[j]
            if isinstance(c, HostCopy):
                refs[(i, j)] = self._put(c.host, leaf.dtype)
            elif self.store is not None:
                refs[(i, j)] = self.store(c)
        for i in {i for i, _ in refs}:
            call = out[i]
            out[i] = replace(call, leaves=tuple(
                leaf.replace(payload=refs[(i, j)]) if (i, j) in refs else leaf for j, leaf in enumerate(call.leaves)))


    def _put(self, host: torch.Tensor, dtype: str) -> "str | None":
        """Store one host copy (its C-order bytes) through :attr:`put_payload`."""
        if self.put_payload is None:
            return None
        n = host.numel() * host.element_size()
        data = ctypes.string_at(host.data_ptr(), n) if n else b""
        return self.put_payload(data, dtype, tuple(host.shape))


def _wait_for_copies(devices: set) -> None:
    """Wait once per accelerator in ``devices`` for the queued host copies."""
    for device in devices:
        if device.type == "cpu":
            continue
        backend = getattr(torch, device.type, None)
        sync = getattr(backend, "synchronize", None)
        if sync is not None:
            sync(device)


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
