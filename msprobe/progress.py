"""Progress bars for long command-line work: tqdm on stderr, shown only when stderr is a
terminal and the work has run for :data:`DELAY_S` seconds; silent otherwise (pipes, CI
logs, tests)."""
from __future__ import annotations

import sys
from typing import Optional

__all__ = ["DELAY_S", "Progress"]

#: seconds of work before a bar appears
DELAY_S = 2.0


class Progress:
    """A progress bar as a context manager: ``advance(label)`` counts one unit done and
    shows ``label`` (the part now running).

    Args:
        desc: text before the bar, e.g. ``"msprobe export"``.
        total: the number of units, or None when unknown (the bar then counts).
        unit: the unit's name (``"step"``, ``"part"``).
        stream: where the bar goes (default: ``sys.stderr``); a stream that is not a
            terminal gets nothing.
    """

    def __init__(self, desc: str, total: Optional[int] = None, unit: str = "it", stream=None) -> None:
        self._stream = sys.stderr if stream is None else stream
        self._bar = None
        try:
            tty = self._stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        if tty:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self._stream, delay=DELAY_S,
                             leave=False, dynamic_ncols=True)

    @property
    def shown(self) -> bool:
        """Whether a bar is drawn (stderr is a terminal)."""
        return self._bar is not None

    def advance(self, label: str = "", n: int = 1) -> None:
        """Count ``n`` units done; ``label`` names the part that starts now."""
        if self._bar is not None:
            if label:
                self._bar.set_postfix_str(label, refresh=False)
            self._bar.update(n)

    def close(self) -> None:
        """Remove the bar (idempotent)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
