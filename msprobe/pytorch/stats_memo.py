"""Reuse the statistics of a tensor recorded twice in a row (output of one call, input of the next).

About half the tensor bytes a training step records are recorded twice: a call's output is
the next call's input, a module's output is its last call's output, and in backward the
gradient a node produces is the gradient the next node receives. :class:`StatsMemo`
remembers the statistics (and CRC-32) of recently recorded tensors so the second record
costs a dictionary lookup instead of a pass over the data.

An entry is reused only while all of these hold:

* the tensor views exactly the same elements (same data pointer, dtype, shape, strides,
  neg/conj bits) as the tensor the entry was made for: the same object, or an alias such
  as the view autograd passes to the next node. Without CRC-32 (summary_mode statistics),
  a dense tensor also matches any dense tensor over the same block of memory (``x.t()``,
  ``x.reshape(...)`` of a contiguous ``x``): the same elements in another order. The memo
  holds that tensor's memory (a detached alias sharing its version counter: its memory
  cannot be reused by another tensor while the entry lives, but its autograd graph is not
  kept alive), at most ``LIMIT`` such tensors and ``MAX_BYTES`` of their storage, oldest
  dropped first (weak references lost a third of the hits, because autograd hands each
  node a fresh Python object); parameters (``nn.Parameter``) and their ``.grad`` (recorded
  as ``parameters_grad``), the same object on every record, by a weak reference until the
  next clear (a model dropped meanwhile is freed);
* both tensors' version counters equal the one recorded (every in-place PyTorch operation
  bumps it, with or without grad mode);
* no intercepted API call that may write memory of the tensor ran since the entry was
  made. The counter misses writes through an alias with its own counter (``x.data``), so
  an intercepted call that writes in place (:mod:`msprobe.pytorch.mutation`: ``add_``,
  ``__setitem__``, ``out=``, ``inplace=True``, batch norm's running statistics, and the
  in-place APIs outside the API list such as ``torch._foreach_add_`` and fused
  optimizers) forgets, before and after it runs (another thread may record meanwhile),
  the entries whose storage one of its tensor arguments shares
  (:meth:`StatsMemo.release`; by memory range where a storage wraps memory it does not
  own, such as ``torch.from_numpy(x.numpy()[2:])``; everything when an argument is not a
  tensor, number or plain container, and for ``torch.ops.aten`` calls); collectives forget
  everything, before and after they run, and so does the end of every backward pass under
  torch.distributed (DDP's reducer allreduces gradient buckets in C++ during it); so do unrecorded intercepted calls and the
  debugger at start()/stop()/step(). At L0 and debug no API is intercepted, so the memo
  is off there.

What remains uncovered is memory written by code msprobe does not intercept through an
alias with its own version counter (a custom C++ or Triton kernel writing through a raw
pointer, an operator called on ``x.data`` through ``torch._C``, a write through the numpy
array of ``x.numpy()`` or through ``x.untyped_storage()``) between two records of the same
tensor in one step; ``PrecisionDebugger`` users with such kernels can turn the memo
off with the environment variable ``MSPROBE_NO_STATS_MEMO=1``. With task ``tensor`` a memo
hit of a contiguous CPU float tensor is checked anyway: the payload capture compares its
memory with its snapshot of the same address, size and shape, and where they differ the
fresh copy brings fresh statistics (``msprobe.pytorch.leaves.LeafBuilder._plain_leaf``).
The check is per shape while a memo entry is not: a write no counter sees, recorded
through a view of another shape and then undone, still leaves the memo's statistics of
the written values (``tests/pytorch/test_snapshot_stats.py``, the xfail case).
"""
from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Optional

import torch

from msprobe.pytorch.stats import is_dense


#: non-parameter entries kept (the oldest is dropped first): an output is reused by the next
#: call or two, a residual branch's input a few calls later
LIMIT = 16
#: at most this many bytes of non-parameter tensors are kept alive by the memo (a tensor
#: larger than this is not remembered): holding a tensor delays freeing its memory, which
#: raises the training step's peak RSS. Encoder benchmark, 4 recorded steps, 4 processes
#: each: 16 MiB gave peak RSS L1 464-483 / mix 475-477 MiB with 904 / 1948 memo hits, 4 MiB
#: 464-470 / 461-466 MiB with 872 / 1932 hits (about 8 more tensors of 1M elements
#: reduced per step, ~2 ms)
MAX_BYTES = 4 << 20

_PARAMETER = torch.nn.Parameter
#: the C method (``torch.Tensor.detach`` may be an API wrapper while recording)
_detach = torch._C.TensorBase.detach
#: argument values that hold no tensor memory (anything else makes release() forget all)
_SCALARS = (bool, int, float, complex, str, bytes, type(None), type(Ellipsis), slice, torch.dtype,
            torch.device, torch.layout, torch.memory_format, torch.Size)


def dense_count(t: torch.Tensor, n: int) -> int:
    """The element-count field of the memo key of a dense tensor ``t`` of ``n`` elements:
    ``n``, but -1 for a 0-dim tensor. A 0-dim tensor reports its value as Mean (-0.0 stays
    -0.0, spec section 9) while a 1-element tensor over the same memory reports sum / 1
    (+0.0 for -0.0): the two must not share an entry."""
    return n if n != 1 or t.dim() else -1


class StatsMemo:
    """Statistics of recently recorded tensors, keyed by tensor identity.

    Args:
        enabled: False makes :meth:`get` always miss (``MSPROBE_NO_STATS_MEMO=1``).
        limit: at most this many entries for tensors that are not parameters (int >= 1;
            the oldest is dropped when full); parameters are kept until :meth:`clear`.

    Attributes:
        hits: number of :meth:`get` calls answered from the memo (for benchmarks).
        layout_free: match dense tensors over the same memory whatever their shape and
            strides (set by the leaf builder when no CRC-32 is recorded).
    Raises:
        ValueError: ``limit`` below 1.
    """

    __slots__ = ("_entries", "_order", "_held", "_by_storage", "_foreign", "_lock", "enabled", "limit",
                 "hits", "layout_free")

    @property
    def entries(self) -> dict:
        """The entries dict itself, never replaced (the API wrappers test it for emptiness
        on their fast path; only the memo's methods change it)."""
        return self._entries

    def __init__(self, enabled: Optional[bool] = None, limit: int = LIMIT) -> None:
        if enabled is None:
            enabled = os.environ.get("MSPROBE_NO_STATS_MEMO", "") in ("", "0")
        if limit < 1:
            raise ValueError(f"StatsMemo limit: got {limit}; allowed: an integer >= 1")
        self.enabled = enabled
        self.limit = limit
        # key -> (tensor (weak reference if kept like a parameter), version, value, storage
        #         address, kept like a parameter, storage end address, storage not owned)
        self._entries: dict[tuple, tuple] = {}
        self._order: dict[tuple, int] = {}  # non-parameter entries, oldest first: key -> bytes
        self._held = 0  # bytes of the non-parameter entries
        self._by_storage: dict[int, set] = {}  # storage address -> keys of its entries
        self._foreign: set = set()  # keys of entries whose storage wraps memory it does not own
        # put/release/clear change the entries and their order, size and index records
        # together: one thread at a time (get reads one dict lookup and needs no lock)
        self._lock = threading.RLock()  # reentrant: a finalizer run by the GC may record
        self.hits = 0
        #: a dense tensor (no gaps, no overlap) matches any dense tensor over the same block of
        #: memory (``x``, ``x.t()``, ``x.view(-1)``): same elements, so the same Max/Min/Mean/
        #: Norm up to the order of the float additions. Off when the value holds a CRC-32 (it
        #: depends on the C order of the elements).
        self.layout_free = False

    def _key(self, t: torch.Tensor) -> tuple:
        if self.layout_free and is_dense(t):
            # the same block of memory, whatever the shape and the order of the dimensions
            return (t.data_ptr(), t.dtype, dense_count(t, t.numel()), t.is_neg(), t.is_conj())
        return (t.data_ptr(), t.dtype, t.shape, t.stride(), t.is_neg(), t.is_conj())

    def get(self, t: torch.Tensor) -> Optional[Any]:
        """The value stored for ``t`` (a strided CPU tensor), or for a tensor viewing
        exactly the same elements, if it is still valid (see the module docstring); else None."""
        if not self._entries:
            return None
        try:
            key = self._key(t)
        except RuntimeError:
            return None
        return self.get_at(key, t)

    def get_at(self, key: tuple, t: torch.Tensor) -> Optional[Any]:
        """:meth:`get` with ``t``'s key already computed (``(data_ptr, dtype,
        dense_count(t, numel), is_neg, is_conj)`` for a dense tensor when ``layout_free``,
        else ``(data_ptr, dtype, shape, stride, is_neg, is_conj)``)."""
        try:
            e = self._entries.get(key)
            if e is None:
                return None
            held, version, value = e[:3]
            if e[4]:  # a parameter or .grad, held by a weak reference
                held = held()
                if held is None:
                    return None
            valid = t._version == version and held._version == version and held.data_ptr() == t.data_ptr()
        except RuntimeError:  # inference tensors have no version counter
            return None
        if not valid:
            return None
        self.hits += 1
        return value

    def put(self, t: torch.Tensor, value: Any, keep: bool = False) -> None:
        """Remember ``value`` (the statistics of the CPU tensor ``t`` as it is now).
        ``keep``: hold ``t`` until the next clear like a parameter (for tensors that live
        on anyway, such as a parameter's ``.grad``)."""
        if not self.enabled:
            return
        try:
            key = self._key(t)
        except (RuntimeError, NotImplementedError, TypeError):
            return
        self.put_at(key, t, value, keep)

    def put_at(self, key: tuple, t: torch.Tensor, value: Any, keep: bool = False,
               storage: Optional[Any] = None) -> None:
        """:meth:`put` with ``t``'s key already computed (see :meth:`get_at`); ``storage``:
        ``t.untyped_storage()`` when the caller has it."""
        if not self.enabled:
            return
        try:
            param = keep or issubclass(type(t), _PARAMETER)  # not isinstance: a Python-level check
            if storage is None:
                storage = t.untyped_storage()
            start, size = storage.data_ptr(), storage.nbytes()
            held = weakref.ref(t) if param else _detach(t)
            # not resizable: memory from numpy, DLPack, a buffer, maybe inside another storage
            entry = (held, t._version, value, start, param, start + size, not storage.resizable())
        except (RuntimeError, NotImplementedError, TypeError):  # no version counter or no storage
            return
        with self._lock:
            entries, order = self._entries, self._order
            self._held -= order.pop(key, 0)
            if not param and size > MAX_BYTES:
                self._drop(key)
                return
            old = entries.get(key)
            if old is not None and old[3] != entry[3]:
                self._unindex(key, old[3])
            entries[key] = entry
            keys = self._by_storage.get(start)
            if keys is None:
                self._by_storage[start] = {key}
            else:
                keys.add(key)
            if entry[6]:
                self._foreign.add(key)
            else:
                self._foreign.discard(key)
            if param:
                return
            order[key] = size
            self._held += size
            while len(order) > self.limit or self._held > MAX_BYTES:
                try:
                    oldest = next(iter(order))
                    self._held -= order.pop(oldest)
                    gone = entries.get(oldest)
                    if gone is not None and not gone[4]:
                        self._drop(oldest)
                except (StopIteration, KeyError, RuntimeError):
                    break

    def _drop(self, key: tuple) -> None:
        """Remove the entry ``key`` (and its index and order records); under ``_lock``."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._unindex(key, entry[3])
        self._foreign.discard(key)
        self._held -= self._order.pop(key, 0)

    def _unindex(self, key: tuple, storage: int) -> None:
        keys = self._by_storage.get(storage)
        if keys is not None:
            keys.discard(key)
            if not keys:
                self._by_storage.pop(storage, None)

    def release(self, args: tuple, kwargs: dict) -> None:
        """Forget the entries an intercepted call that writes in place may change: those
        whose storage a tensor in ``args``/``kwargs`` (nested in lists, tuples, dicts)
        shares, or whose memory overlaps it where either storage does not own its memory
        (``torch.from_numpy``, DLPack); everything when an argument is anything else but a
        plain value."""
        entries = self._entries
        if not entries:
            return
        spans: dict = {}  # storage address -> (end address, does not own its memory)
        if not (_storages(args, spans) and _storages(kwargs, spans)):
            self.clear()
            return
        foreign = [(a, b) for a, (b, f) in spans.items() if f]
        with self._lock:
            by_storage = self._by_storage
            for storage in spans:
                keys = by_storage.get(storage)
                if keys:
                    for key in list(keys):
                        self._drop(key)
            if foreign:  # it may alias any entry's memory: compare address ranges
                for key, e in list(entries.items()):
                    if any(a < e[5] and e[3] < b for a, b in foreign):
                        self._drop(key)
            for key in list(self._foreign):  # entries that may alias an argument's memory
                e = entries.get(key)
                if e is not None and any(a < e[5] and e[3] < b for a, (b, _) in spans.items()):
                    self._drop(key)

    def clear(self) -> None:
        """Forget everything (before each intercepted call runs; at start()/step())."""
        with self._lock:
            self._entries.clear()
            self._order.clear()
            self._by_storage.clear()
            self._foreign.clear()
            self._held = 0

    def __len__(self) -> int:
        return len(self._entries)


def _storages(value: Any, out: dict) -> bool:
    """Map the storage address of every tensor in ``value`` to ``(end address, the storage
    does not own its memory)`` in ``out``; False if ``value``
    holds something that may reference tensor memory unseen (an object, an array)."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, torch.Tensor):
            try:
                storage = v.untyped_storage()
                start = storage.data_ptr()
                end, foreign = start + storage.nbytes(), not storage.resizable()
                prev = out.get(start)
                out[start] = (end, foreign) if prev is None else (max(end, prev[0]), foreign or prev[1])
            except (RuntimeError, NotImplementedError):
                return False
        elif type(v) in (list, tuple):
            todo.extend(v)
        elif type(v) is dict:
            todo.extend(v.values())
        elif not isinstance(v, _SCALARS):
            return False
    return True

