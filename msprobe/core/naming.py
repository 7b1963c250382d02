"""dump.json entry names and their per-step call counters (spec section 2.1).

Names (separator always ``.``):

* API forward / backward: ``{Family}.{api}.{n}.forward`` / ``.backward`` (same ``n``);
* module forward / backward: ``{Module|Cell}.{path}.{Class}.forward.{n}`` / ``.backward.{n}``
  (backward ``n`` pairs with forward ``n``: spec section 9, fix 5);
* parameter gradients: ``{Module|Cell}.{path}.{Class}.parameters_grad``;
* debug save: ``{name}.{k}`` and ``{name}_grad.{k}``.
"""
from __future__ import annotations

import re


class CallCounter:
    """Counts calls per key within one step; :meth:`reset` starts the next step.

    >>> c = CallCounter(); c.next("Functional.linear"), c.next("Functional.linear")
    (0, 1)
    """

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def next(self, key: str) -> int:
        """Return the 0-based number of this call of ``key`` in the step and count it."""
        n = self._counts.get(key, 0)
        self._counts[key] = n + 1
        return n

    def reset(self) -> None:
        self._counts.clear()


def api_name(family: str, api: str, n: int, direction: str) -> str:
    """``api_name("Functional", "linear", 0, "forward")`` → ``"Functional.linear.0.forward"``."""
    return f"{family}.{api}.{n}.{direction}"


def module_prefix(kind: str, path: str, class_name: str) -> str:
    """``module_prefix("Module", "inner.fc", "Linear")`` → ``"Module.inner.fc.Linear"``."""
    return f"{kind}.{path}.{class_name}"


def module_name(prefix: str, direction: str, n: int) -> str:
    """``module_name("Module.fc.Linear", "forward", 1)`` → ``"Module.fc.Linear.forward.1"``."""
    return f"{prefix}.{direction}.{n}"


def to_backward(name: str | None) -> str | None:
    """The backward twin of a forward entry name, or None.

    ``"Module.a.A.forward.2"`` → ``"Module.a.A.backward.2"``;
    ``"Functional.relu.0.forward"`` → ``"Functional.relu.0.backward"``.
    """
    if name is None:
        return None
    if name.endswith(".forward"):
        return name[: -len("forward")] + "backward"
    head, sep, tail = name.rpartition(".forward.")
    if sep and tail.isdigit():
        return f"{head}.backward.{tail}"
    return None


_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def safe_component(text: str, limit: int = 200) -> str:
    """Sanitise a user-supplied name for use inside a file name: characters outside
    ``[A-Za-z0-9_.-]`` become ``_`` and ``..`` becomes ``__``; truncated to ``limit``."""
    cleaned = _UNSAFE.sub("_", text).replace("..", "__")
    return cleaned[:limit] or "_"
