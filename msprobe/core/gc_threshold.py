"""Python's garbage collector while msprobe records: a higher generation-0 threshold.

CPython collects generation 0 when the tracked objects (tuples, lists, dicts, instances)
allocated since the last collection outnumber those freed by more than the threshold
(700 by default). An uninstrumented PyTorch step allocates almost none; a recorded step
holds its entries, leaves and pending frames until they are handed to the writer process,
so the count grows by ~1,000-3,000 per step and the collector runs mid-step, traverses
what is alive, promotes it, and every few hundred steps runs a full collection over every
object of the process (~300,000 in a PyTorch process, 70-160 ms each). Measured on the
``dispatch`` workload (benchmarks/workloads.py, L1 statistics, one torch thread;
``benchmarks/gc_cost.py l1_stats 300 1 dispatch``): 0.45-0.5 ms of collections per recorded
step on a quiet 2-core VM and 2.06 ms with other processes on it at the default threshold;
0.14 ms with a threshold of 10,000 (most of a step's objects are freed before the count
reaches it: one young collection per ~50 steps, no full one in 300).

While a session records (from its first ``start()`` to ``close()``), the generation-0
threshold is raised to :data:`DEFAULT_GEN0` (``MSPROBE_GC_THRESHOLD``: another value; ``0``
leaves Python's thresholds alone); a higher threshold already set is kept, generations 1
and 2 keep theirs. ``close()`` puts the previous threshold back unless someone set another
meanwhile. Cyclic garbage of the training script is collected as before, later by up to
that many net allocations.
"""
from __future__ import annotations

import gc
import os
import threading
from typing import Mapping, Optional

#: environment variable: the generation-0 threshold while recording (``0``: unchanged)
GC_ENV = "MSPROBE_GC_THRESHOLD"
#: the threshold when :data:`GC_ENV` is unset or empty
DEFAULT_GEN0 = 10_000
#: what :data:`GC_ENV` accepts, for error messages
GC_ALLOWED = "an integer >= 0 (0: leave Python's garbage collector thresholds as they are)"


def gc_threshold(environ: Optional[Mapping[str, str]] = None) -> int:
    """The generation-0 threshold from :data:`GC_ENV` in ``environ`` (default
    ``os.environ``): :data:`DEFAULT_GEN0` when unset or empty, 0 for "leave it".

    >>> gc_threshold({"MSPROBE_GC_THRESHOLD": " 5000 "})
    5000

    Raises:
        ValueError: a value that is not an integer >= 0.
    """
    text = (os.environ if environ is None else environ).get(GC_ENV, "")
    if not text.strip():
        return DEFAULT_GEN0
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{GC_ENV}={text!r}: expected {GC_ALLOWED}")
    return value


class RaisedThreshold:
    """The generation-0 threshold raised to ``gen0`` (0: nothing done) between
    :meth:`raise_` and :meth:`restore`. Sessions in one process share the raise: the first
    to raise remembers the previous threshold, the last to restore puts it back (unless
    someone set another meanwhile).

    Args:
        gen0: the threshold while recording (:func:`gc_threshold`).
    """

    _lock = threading.Lock()
    #: the threshold before the first raise, and how many instances hold the raise
    _previous: Optional[int] = None
    _holders = 0
    _raised_to = 0

    def __init__(self, gen0: int) -> None:
        self._gen0 = gen0
        self._held = False

    def raise_(self) -> None:
        """Raise the threshold (idempotent; a higher one set already is kept)."""
        cls = RaisedThreshold
        with cls._lock:
            if self._held or not self._gen0:
                return
            self._held = True
            cls._holders += 1
            current, g1, g2 = gc.get_threshold()
            if current and current < self._gen0:  # 0: automatic collection is switched off
                if cls._previous is None:
                    cls._previous = current
                cls._raised_to = self._gen0
                gc.set_threshold(self._gen0, g1, g2)

    def restore(self) -> None:
        """Drop this instance's raise; the last one puts the previous threshold back, unless
        another was set since (idempotent)."""
        cls = RaisedThreshold
        with cls._lock:
            if not self._held:
                return
            self._held = False
            cls._holders -= 1
            if cls._holders or cls._previous is None:
                return
            previous, cls._previous = cls._previous, None
            current, g1, g2 = gc.get_threshold()
            if current == cls._raised_to:
                gc.set_threshold(previous, g1, g2)
