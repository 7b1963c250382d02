"""config.json ``dump_enable``: re-reading the config file while a job runs.

When the config a debugger was built from has a ``dump_enable`` key, the debugger asks a
:class:`ConfigWatcher` at every ``start()``/``stop()``/``step()`` whether the file changed.
The watcher looks at the file's modification time and size (``os.stat``, nothing is read)
at most every :data:`CHECK_RECORDING_S` seconds while recording and every
:data:`CHECK_IDLE_S` seconds while not, and re-validates the file only when one of them
changed. A file that no longer validates (or cannot be read) keeps the last good config:
one error is logged per such version of the file. When the new file has no
``dump_enable``, the previous value is kept.

Nothing here imports a deep-learning framework.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Callable, Final, Optional

from msprobe.core.config import Config
from msprobe.core.errors import ConfigError

__all__ = ["CHECK_IDLE_S", "CHECK_RECORDING_S", "ConfigWatcher"]

logger = logging.getLogger("msprobe")

#: seconds between two looks at the file while recording (unit: s)
CHECK_RECORDING_S: Final = 0.5
#: seconds between two looks at the file while not recording (unit: s)
CHECK_IDLE_S: Final = 3.0


def _signature(path: str) -> Optional[tuple[int, int]]:
    """``(st_mtime_ns, st_size)`` of ``path``; None when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


class ConfigWatcher:
    """Watches one config file and re-validates it when it changes.

    Args:
        path: the config.json the debugger was built from.
        load: ``() -> Config``: reads and validates ``path`` with the debugger's own
            arguments (raises :class:`ConfigError` for a bad file).
        config: the config in use now (the last good one).
        clock: seconds, monotonic (tests pass their own).

    Example: a watcher over a file with ``"dump_enable": false`` returns None from
    :meth:`poll` until the file is rewritten with ``true``; the first :meth:`poll` at
    least 0.5 s (recording) or 3 s (not recording) later returns the new config.
    """

    def __init__(self, path: str, load: Callable[[], Config], config: Config, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = os.fspath(path)
        self._load = load
        self.config = config
        self._clock = clock
        self._signature = _signature(self.path)
        self._checked = clock()
        self._bad: Optional[tuple[int, int]] = None  # the signature of the version last refused

    def poll(self, recording: bool) -> Optional[Config]:
        """The new config when the file changed since the last look and validates, else
        None. Looks at the file only when :data:`CHECK_RECORDING_S` (``recording``) or
        :data:`CHECK_IDLE_S` seconds have passed since the last look. Never raises."""
        now = self._clock()
        if now - self._checked < (CHECK_RECORDING_S if recording else CHECK_IDLE_S):
            return None
        self._checked = now
        signature = _signature(self.path)
        if signature is None or signature == self._signature:
            return None
        try:
            new = self._load()
        except ConfigError as exc:
            if signature != self._bad:
                self._bad = signature
                logger.error("msprobe: %s changed but does not validate (%s); the previous config stays in use",
                             self.path, exc)
            return None
        except Exception as exc:  # a check must never stop training  # noqa: BLE001
            if signature != self._bad:
                self._bad = signature
                logger.error("msprobe: re-reading %s failed (%s: %s); the previous config stays in use",
                             self.path, type(exc).__name__, exc)
            return None
        self._signature = signature
        self._bad = None
        if new.dump_enable is None:  # the key was removed: its previous value stays
            new = dataclasses.replace(new, dump_enable=self.config.dump_enable)
        if new == self.config:
            return None
        self.config = new
        logger.info("msprobe: %s changed; the new config applies from the next step boundary", self.path)
        return new
