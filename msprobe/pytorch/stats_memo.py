"""Reuse the statistics of a tensor recorded twice in a row (output of one call, input of the next).

About half the tensor bytes a training step records are recorded twice: a call's output is
the next call's input, a module's output is its last call's output, and in backward the
gradient a node produces is the gradient the next node receives. :class:`StatsMemo`
remembers the statistics (and CRC-32) of recently recorded tensors so the second record
costs a dictionary lookup instead of a pass over the data.

An entry is reused only while all of these hold:

* it is the same Python tensor object (held by a weak reference: the memo never keeps a
  tensor alive nor changes autograd's in-place accumulation decisions);
* its version counter is unchanged (every in-place PyTorch operation bumps it, with or
  without grad mode) and its data pointer is unchanged;
* no intercepted API call has started since the entry was made: the recorder calls
  :meth:`StatsMemo.clear` before every intercepted call runs, and at start()/step(). This
  covers writes that do not bump the version counter: through ``.data`` (a separate
  counter), collectives, ``torch.no_grad()`` copies — all of them are API calls.

What remains uncovered is memory written by code msprobe does not intercept (a custom C++
or Triton kernel writing through a raw pointer) between two consecutive records of the same
tensor object; ``PrecisionDebugger`` users with such kernels can turn the memo off with the
environment variable ``MSPROBE_NO_STATS_MEMO=1``.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import torch


#: entries kept (the oldest is dropped first); see the module docstring for why it is small
LIMIT = int(os.environ.get("MSPROBE_STATS_MEMO_SIZE", "4"))


class StatsMemo:
    """Statistics of recently recorded tensors, keyed by tensor identity.

    Args:
        enabled: False makes :meth:`get` always miss (``MSPROBE_NO_STATS_MEMO=1``).
        limit: at most this many entries (the memo is cleared when full).
    """

    __slots__ = ("_entries", "enabled", "limit", "hits")

    def __init__(self, enabled: Optional[bool] = None, limit: int = LIMIT) -> None:
        if enabled is None:
            enabled = os.environ.get("MSPROBE_NO_STATS_MEMO", "") in ("", "0")
        self.enabled = enabled
        self.limit = limit
        self._entries: dict[tuple, tuple] = {}
        self.hits = 0

    @staticmethod
    def _key(t: torch.Tensor) -> tuple:
        return (t.data_ptr(), t.dtype, t.shape, t.stride())

    def get(self, t: torch.Tensor) -> Optional[Any]:
        """The value stored for ``t`` (or for a tensor viewing exactly the same elements)
        if it is still valid, else None."""
        if not self._entries:
            return None
        try:
            e = self._entries.get(self._key(t))
            if e is None:
                return None
            held, version, value = e
            valid = t._version == version and held._version == version
        except RuntimeError:  # inference tensors have no version counter
            return None
        if not valid:
            return None
        self.hits += 1
        return value

    def put(self, t: torch.Tensor, value: Any) -> None:
        """Remember ``value`` (the statistics of ``t`` as it is now)."""
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
            del entries[next(iter(entries))]  # the oldest
        entries[key] = entry

    def clear(self) -> None:
        """Forget everything (before each intercepted call runs; at start()/step())."""
        if self._entries:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
