"""The per-thread "inside msprobe" flag shared by every session in the process.

While a thread runs msprobe's own code (statistics, views, hooks) or a recorded call, its
``busy`` flag is set, and no wrapper of *any* debugger records what that thread calls:
two debuggers recording at once never record each other's internal operations (and only
the outermost API call is recorded, spec section 2.1). This is the only process-wide
object msprobe has; it holds no configuration and no data, only this flag per thread.
"""
from __future__ import annotations

import threading



class _Inside(threading.local):
    """Per-thread flag holder; ``busy`` defaults to False in every thread (a class
    attribute), so reading it never raises: ``getattr(local, "busy", False)`` on a plain
    ``threading.local`` costs an AttributeError (~1 µs) in each thread that never set it,
    and the API wrappers read it on every call, recording or not."""

    busy = False


INSIDE = _Inside()


class Guarded:
    """Context manager for msprobe's own code: sets this thread's ``busy`` flag (the
    previous value comes back on exit), and hands an ``Exception`` raised inside to
    ``on_error`` instead of propagating it (``BaseException`` such as KeyboardInterrupt
    propagates). One instance per ``with``: it keeps the previous flag."""

    __slots__ = ("_on_error", "_prev")

    def __init__(self, on_error) -> None:
        self._on_error = on_error

    def __enter__(self) -> "Guarded":
        self._prev = INSIDE.busy
        INSIDE.busy = True
        return self

    def __exit__(self, tp, exc, tb) -> bool:
        try:
            if isinstance(exc, Exception):
                self._on_error(exc)  # still busy: what the handler calls is not recorded
                return True
            return False
        finally:
            INSIDE.busy = self._prev
