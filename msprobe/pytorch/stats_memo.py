"""Reuse the statistics of a tensor recorded twice in a row (output of one call, input of the next).

About half the tensor bytes a training step records are recorded twice: a call's output is
the next call's input, a module's output is its last call's output, and in backward the
gradient a node produces is the gradient the next node receives. :class:`StatsMemo`
remembers the statistics (and CRC-32) of recently recorded tensors so the second record
costs a dictionary lookup instead of a pass over the data.

An entry is reused only while all of these hold:

* the tensor views exactly the same elements (same data pointer, dtype, shape, strides,
  neg/conj bits) as the tensor the entry was made for: the same object, or an alias such
  as the view autograd passes to the next node. The memo holds that tensor (a strong
  reference, so its memory cannot be reused by another tensor while the entry lives; at
  most ``LIMIT`` CPU tensors, oldest dropped first; weak references lost a third of the
  hits, because autograd hands each node a fresh Python object);
* both tensors' version counters equal the one recorded (every in-place PyTorch operation
  bumps it, with or without grad mode);
* no intercepted API call has started since the entry was made: the wrappers call
  :meth:`StatsMemo.clear` before every intercepted call runs (recording or not: backward
  entries are still recorded after stop()), collectives again after they ran, and the
  debugger at start()/stop()/step(). This covers writes that do not bump the version
  counter: through ``.data`` (a separate counter), collectives, ``torch.no_grad()``
  copies — at levels L1 and mix all of them are API calls. At L0 and debug no API is
  intercepted, so the memo is off there.

What remains uncovered is memory written by code msprobe does not intercept (a custom C++
or Triton kernel writing through a raw pointer) between two consecutive records of the same
tensor object; ``PrecisionDebugger`` users with such kernels can turn the memo off with the
environment variable ``MSPROBE_NO_STATS_MEMO=1``.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import torch


#: entries kept (the oldest is dropped first): a gradient is reused by the next backward
#: node or two, an output by the next call, so a handful is enough
LIMIT = 4


class StatsMemo:
    """Statistics of recently recorded tensors, keyed by tensor identity.

    Args:
        enabled: False makes :meth:`get` always miss (``MSPROBE_NO_STATS_MEMO=1``).
        limit: at most this many entries (int >= 1; the oldest is dropped when full).

    Attributes:
        hits: number of :meth:`get` calls answered from the memo (for benchmarks).
    Raises:
        ValueError: ``limit`` below 1.
    """

    __slots__ = ("_entries", "enabled", "limit", "hits")

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
        self._entries: dict[tuple, tuple] = {}
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
            held, version, value = e
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
        try:
            key = self._key(t)
            entry = (t, t._version, value)
        except RuntimeError:
            return
        entries = self._entries
        entries.pop(key, None)
        if len(entries) >= self.limit:
            try:  # another thread may clear or evict at the same time
                del entries[next(iter(entries))]  # the oldest
            except (StopIteration, KeyError, RuntimeError):
                pass
        entries[key] = entry

    def clear(self) -> None:
        """Forget everything (before each intercepted call runs; at start()/step())."""
        if self._entries:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
