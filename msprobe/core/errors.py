"""Named exceptions of msprobe.

Every error caused by bad user input is a :class:`ConfigError` that names the field, the
value found and what is allowed (design.md, "Bad input gets a clear error, before
training starts"; spec section 9, fix 18)::

    >>> str(ConfigError("task", "tensors", ("statistics", "tensor", "structure")))
    "config field `task`: got 'tensors'; allowed: statistics, tensor, structure"
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

__all__ = ["MISSING", "ConfigError", "MsprobeError"]

_MAX_VALUE_REPR: Final = 120


class _Missing:
    """Marks a field that was not given at all (its repr reads ``<missing>``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<missing>"

    def __reduce__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()


def _short_repr(value: Any) -> str:
    """``repr(value)`` cut to at most 120 characters; never raises."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - e.g. an int too long to print, a broken __repr__
        text = f"<unprintable {type(value).__name__}>"
    if len(text) > _MAX_VALUE_REPR:
        text = text[: _MAX_VALUE_REPR - 3] + "..."
    return text


class MsprobeError(Exception):
    """Base class of all errors msprobe raises on purpose."""


class ConfigError(MsprobeError, ValueError):
    """A configuration value (file field or ``PrecisionDebugger`` argument) is invalid.

    Args:
        field: the field's name as the user writes it, e.g. ``"task"``, ``"step"``,
            ``"tensor.list"`` (a key of the task sub-object) or ``"config_path"``.
        value: the offending value (``MISSING`` when the field was absent).
        allowed: what would have been accepted: a sentence, or the closed set of values
            (joined with ``", "`` in the message).
        detail: optional extra explanation appended after ``"; "``.

    Attributes ``field``, ``value``, ``allowed`` (a ``str`` or a ``tuple[str, ...]``) and
    ``detail`` keep the arguments. ``ConfigError`` is also a ``ValueError``.
    """

    field: str
    value: Any
    allowed: str | tuple[str, ...]
    detail: str | None

    def __init__(
        self,
        field: str,
        value: Any,
        allowed: str | Iterable[str],
        detail: str | None = None,
    ) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed if isinstance(allowed, str) else tuple(str(a) for a in allowed)
        self.detail = detail
        allowed_text = self.allowed if isinstance(self.allowed, str) else ", ".join(self.allowed)
        message = f"config field `{field}`: got {_short_repr(value)}; allowed: {allowed_text}"
        if detail:
            message += f"; {detail}"
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.field, self.value, self.allowed, self.detail))
