"""Reuse the statistics of a tensor recorded twice in a row (output of one call, input of the next).

About half the tensor bytes a training step records are recorded twice: a call's output is
the next call's input, a module's output is its last call's output, and in backward the
gradient a node produces is the gradient the next node receives. :class:`StatsMemo`
remembers the statistics (and CRC-32) of recently recorded tensors so the second record
costs a dictionary lookup instead of a pass over the data.

An entry is reused only while all of these hold:

* the tensor views exactly the same elements (same data pointer, dtype, shape, strides,
  neg/conj bits) as the tensor the entry was made for: the same object, or an alias such
  as the view autograd passes to the next node. The memo holds that tensor's memory (a
  detached alias sharing its version counter, so its memory cannot be reused by another
  tensor while the entry lives, but its autograd graph is not kept alive), at most
  ``LIMIT`` such tensors and ``MAX_BYTES`` of their storage, oldest dropped first (weak
  references lost a third of the hits, because autograd hands each node a fresh Python
  object); parameters (``nn.Parameter``, the same object on every record) by a weak
  reference, until the next clear or until they are freed;
* both tensors' version counters equal the one recorded (every in-place PyTorch operation
  bumps it, with or without grad mode);
* no intercepted API call that may write memory of the tensor ran since the entry was
  made. The counter misses writes through an alias with its own counter (``x.data``), so
  an intercepted call that writes in place (:mod:`msprobe.pytorch.mutation`: ``add_``,
  ``__setitem__``, ``out=``, ``inplace=True``, batch norm's running statistics, and the
  in-place APIs outside the API list such as ``torch._foreach_add_`` and fused optimizers)
  forgets the entries whose storage memory overlaps one of its tensor arguments'
  (:meth:`StatsMemo.release`; everything when an argument is not a tensor, number or plain
  container, and for ``torch.ops.aten`` calls); collectives forget
  everything, before and after they run; so do unrecorded intercepted calls and the
  debugger at start()/stop()/step(). At L0 and debug no API is intercepted, so the memo
  is off there.

What remains uncovered is memory written by code msprobe does not intercept through an
alias with its own version counter (a custom C++ or Triton kernel writing through a raw
pointer, an operator called on ``x.data`` through ``torch._C``, a write through a numpy
array from ``x.numpy()`` or through ``x.untyped_storage()``) between two records of the
same tensor in one step; ``PrecisionDebugger`` users with such kernels can turn the memo
off with the environment variable ``MSPROBE_NO_STATS_MEMO=1``.
"""
from __future__ import annotations

import functools
import os
import weakref
from typing import Any, Optional

import torch


#: non-parameter entries kept (the oldest is dropped first): an output is reused by the next
#: call or two, a residual branch's input a few calls later
LIMIT = 16
#: at most this many bytes of non-parameter tensors are kept alive by the memo (a tensor
#: larger than this is not remembered): holding a tensor delays freeing its memory
MAX_BYTES = 64 << 20

_PARAMETER = torch.nn.Parameter
#: the C method (torch.Tensor.detach may be an API wrapper while recording)
_detach = torch._C.TensorBase.detach
#: argument values that hold no tensor memory (anything else makes release() forget all)
_SCALARS = (bool, int, float, complex, str, bytes, type(None), type(Ellipsis), slice, torch.dtype,
            torch.device, torch.layout, torch.memory_format, torch.Size)


class StatsMemo:
    """Statistics of recently recorded tensors, keyed by tensor identity.

    Args:
        enabled: False makes :meth:`get` always miss (``MSPROBE_NO_STATS_MEMO=1``).
        limit: at most this many entries for tensors that are not parameters (int >= 1;
            the oldest is dropped when full); parameters are kept until :meth:`clear`.

    Attributes:
        hits: number of :meth:`get` calls answered from the memo (for benchmarks).
    Raises:
        ValueError: ``limit`` below 1.
    """

    __slots__ = ("_entries", "_order", "_held", "enabled", "limit", "hits")

    @property
    def entries(self) -> dict:
        """The entries dict itself (the API wrappers empty it in place on their fast path)."""
        return self._entries

    def __init__(self, enabled: Optional[bool] = None, limit: int = LIMIT) -> None:
        if enabled is None:
            enabled = os.environ.get("MSPROBE_NO_STATS_MEMO", "") in ("", "0")
        if limit < 1:
            raise ValueError(f"StatsMemo limit: got {limit}; allowed: an integer >= 1")
        self.enabled = enabled
        self.limit = limit
        # key -> (tensor (a weak reference for a parameter), version, value,
        #         storage start and end address, is a parameter)
        self._entries: dict[tuple, tuple] = {}
        self._order: dict[tuple, int] = {}  # non-parameter entries, oldest first: key -> bytes
        self._held = 0  # bytes of the non-parameter entries
        self.hits = 0

    @staticmethod
    def _key(t: torch.Tensor) -> tuple:
        return (t.data_ptr(), t.dtype, t.shape, t.stride(), t.is_neg(), t.is_conj())

    def get(self, t: torch.Tensor) -> Optional[Any]:
        """The value stored for ``t`` (a strided CPU tensor), or for a tensor viewing
        exactly the same elements, if it is still valid (see the module docstring); else None."""
        if not self._entries:
            return None
        try:
            e = self._entries.get(self._key(t))
            if e is None:
                return None
            held, version, value = e[:3]
            if e[5]:  # a parameter, held by a weak reference
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

    def put(self, t: torch.Tensor, value: Any) -> None:
        """Remember ``value`` (the statistics of the CPU tensor ``t`` as it is now)."""
        if not self.enabled:
            return
        entries, order = self._entries, self._order
        try:
            key = self._key(t)
            param = isinstance(t, _PARAMETER)
            storage = t.untyped_storage()
            start = storage.data_ptr()
            size = storage.nbytes()
            version = t._version
            if param:  # alive anyway while its module is: not kept alive by the memo
                held = weakref.ref(t, functools.partial(_forget, entries, key))
            else:  # the same memory and version counter without the autograd graph
                held = _detach(t)
        except (RuntimeError, NotImplementedError, TypeError):  # no version counter or no storage
            return
        entry = (held, version, value, start, start + size, param)
        self._held -= order.pop(key, 0)
        if param:
            entries[key] = entry
            return
        if size > MAX_BYTES:
            entries.pop(key, None)
            return
        entries[key] = entry
        order[key] = size
        self._held += size
        while len(order) > self.limit or self._held > MAX_BYTES:
            try:  # another thread may clear or evict at the same time
                oldest = next(iter(order))
                self._held -= order.pop(oldest)
                old = entries.get(oldest)
                if old is not None and not old[5]:
                    del entries[oldest]
            except (StopIteration, KeyError, RuntimeError):
                break

    def release(self, args: tuple, kwargs: dict) -> None:
        """Forget the entries an intercepted call that writes in place may change: those
        whose storage a tensor in ``args``/``kwargs`` (nested in lists, tuples, dicts)
        shares; everything when an argument is anything else but a plain value."""
        entries = self._entries
        if not entries:
            return
        spans: list = []
        if not (_storages(args, spans) and _storages(kwargs, spans)):
            self.clear()
            return
        for key, entry in list(entries.items()):
            start, end = entry[3], entry[4]
            for a, b in spans:  # the memory ranges overlap (a storage wrapping part of another's memory)
                if a < end and start < b or a == start:
                    entries.pop(key, None)
                    self._held -= self._order.pop(key, 0)
                    break

    def clear(self) -> None:
        """Forget everything (before each intercepted call runs; at start()/step())."""
        if self._entries:
            self._entries.clear()
        self._order.clear()
        self._held = 0

    def __len__(self) -> int:
        return len(self._entries)


def _forget(entries: dict, key: tuple, ref: Any) -> None:
    """Weak-reference callback: drop the entry of a parameter that was freed."""
    e = entries.get(key)
    if e is not None and e[0] is ref:
        entries.pop(key, None)


def _storages(value: Any, out: list) -> bool:
    """Append the memory range ``(start, end)`` (bytes) of the storage of every tensor in
    ``value`` to ``out``; False if ``value``
    holds something that may reference tensor memory unseen (an object, an array)."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, torch.Tensor):
            try:
                storage = v.untyped_storage()
                start = storage.data_ptr()
                out.append((start, start + storage.nbytes()))
            except (RuntimeError, NotImplementedError):
                return False
        elif type(v) in (list, tuple):
            todo.extend(v)
        elif type(v) is dict:
            todo.extend(v.values())
        elif not isinstance(v, _SCALARS):
            return False
    return True
