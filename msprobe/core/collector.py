"""Freezing the objects a recorded run has built up, so that full garbage collections skip them.

A recorder allocates per recorded call (pending backward entries, their gradient records and
hooks, leaves, calls) and so makes Python's cyclic garbage collector run where an
uninstrumented step allocates nothing it tracks. A full (generation 2) collection then walks
every tracked object of the process, most of them the framework's and the model's, which
live for the whole run. :func:`gc.freeze` moves the objects alive now to a permanent
generation that no collection walks; collections after it walk only what was created since.

The process-wide effect is limited in time: :meth:`CollectorFreeze.release` (the debugger's
``close()``) calls :func:`gc.unfreeze` when the freeze was the first in the process, so that
objects frozen here that became cyclic garbage meanwhile are collected again. Reference
counting frees objects as before throughout; only the cycle search skips the frozen ones.
"""
from __future__ import annotations

import gc


class CollectorFreeze:
    """Freezes the process's tracked objects once (:meth:`freeze`) and undoes it at
    :meth:`release` if nothing else had frozen objects before (``gc.get_freeze_count()``
    was 0), so that a script's own ``gc.freeze()`` stays in force."""

    __slots__ = ("done", "owner")

    def __init__(self) -> None:
        self.done = False   # freeze() ran
        self.owner = False  # the freeze was the process's first: release() unfreezes

    def freeze(self) -> None:
        """Move every tracked object alive now to the permanent generation (once)."""
        if self.done:
            return
        self.done = True
        self.owner = gc.get_freeze_count() == 0
        gc.freeze()

    def release(self) -> None:
        """Undo :meth:`freeze` if it was the process's first (idempotent)."""
        if self.owner:
            self.owner = False
            gc.unfreeze()
