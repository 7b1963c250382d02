"""One helper thread that fsyncs file descriptors in the background, one at a time.

The log writer fsyncs its file at every step end without waiting for the disk
(:meth:`store.log_writer.LogWriter.flush` with ``background=True``). Starting a new thread
for each fsync made ``step()`` wait until the system had scheduled it (``Thread.start``
waits for the thread to run: 0.1 ms on a quiet machine, several ms when the training's
threads hold the cores); :class:`BackgroundFsync` starts its thread once, at the first
:meth:`~BackgroundFsync.submit`, and hands it each later descriptor with a notify.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Optional

__all__ = ["BackgroundFsync"]


class BackgroundFsync:
    """fsync, then close, each descriptor :meth:`submit` hands over, on one daemon thread.

    Args:
        name: the thread's name.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        # reentrant: a garbage collection inside a locked block may run the finalizer of a
        # dropped writer (store.log_writer), which calls stop() on this thread
        self._cond = threading.Condition(threading.RLock())
        self._fd: Optional[int] = None  # handed over, not yet taken by the thread
        self._busy = False  # a descriptor was handed over and is not done yet
        self._error: Optional[OSError] = None
        self._stop = False
        self._thread: Optional[threading.Thread] = None

    @property
    def started(self) -> bool:
        """True once the thread was started (and until :meth:`stop`)."""
        return self._thread is not None

    def submit(self, fd: int) -> None:
        """fsync and close ``fd`` in the background (it now belongs to this object). Call
        :meth:`wait` first when an earlier one may still be running.

        Raises:
            RuntimeError: an earlier descriptor is not done yet (wait first), or stopped,
                or the thread could not be started (``Thread.start``'s error). ``fd`` then
                still belongs to the caller, and nothing changed: a later call tries again.
        """
        with self._cond:
            if self._busy or self._stop:
                raise RuntimeError("BackgroundFsync.submit: busy or stopped")
            if self._thread is None:
                thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                thread.start()  # may raise (no thread left): then no thread is recorded
                self._thread = thread
            self._fd = fd
            self._busy = True
            self._cond.notify_all()

    def wait(self) -> Optional[OSError]:
        """Wait until the last descriptor handed over is synced and closed; returns the
        error its fsync raised (once), None when it succeeded or nothing was handed over."""
        with self._cond:
            while self._busy:
                self._cond.wait()
            error, self._error = self._error, None
            return error

    def stop(self, join: bool = True) -> None:
        """Let the thread end (after the descriptor it holds, if any); with ``join``, wait
        for it."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            thread, self._thread = self._thread, None
        if join and thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._fd is None and not self._stop:
                    self._cond.wait()
                if self._fd is None:
                    return
                fd, self._fd = self._fd, None
            error = None
            try:
                os.fsync(fd)
            except OSError as exc:
                error = exc
            finally:
                with contextlib.suppress(OSError):
                    os.close(fd)
            with self._cond:
                self._error = error
                self._busy = False
                self._cond.notify_all()
