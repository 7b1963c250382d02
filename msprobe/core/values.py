"""Framework-neutral records of non-tensor values (spec section 3.3 with fixes 4/13 of 9).

Adapters handle their framework's own types (dtypes, devices, sizes) first and hand
everything else to :func:`value_record`::

    {"type": "int", "value": 2}, {"type": "slice", "value": [0, 2, null]},
    {"type": "ellipsis", "value": "..."}, {"type": "float64", "value": 3.0} (numpy scalar),
    {"type": "<module>.<qualname>", "value": "<short safe repr>"} (anything else).

A ``repr`` that raises gives ``"<type object>"``; long text is cut to :data:`MAX_TEXT`
characters (strings to :data:`MAX_STR`).
"""
from __future__ import annotations

import json
from typing import Any, Callable

import numpy as np

MAX_TEXT = 256
MAX_STR = 4096


def qualname(obj: Any) -> str:
    """``type(obj)``'s qualified name without ``builtins.`` (``"int"``, ``"numpy.ndarray"``)."""
    t = type(obj)
    mod = t.__module__
    return t.__qualname__ if mod in ("builtins", None) else f"{mod}.{t.__qualname__}"


def safe_repr(obj: Any) -> str:
    """``repr(obj)`` cut to :data:`MAX_TEXT` characters; never raises."""
    try:
        text = repr(obj)
    except Exception:
        text = f"<{qualname(obj)} object>"
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."


def slice_part(v: Any) -> Any:
    """A slice bound as JSON: int or None as is, anything else as its short repr."""
    if v is None or (isinstance(v, int) and not isinstance(v, bool)):
        return v
    return safe_repr(v)


def value_record(obj: Any, part: Callable[[Any], Any] = slice_part) -> dict:
    """The JSON record of a non-tensor, non-container value.

    Args:
        obj: the value.
        part: turns a slice bound into JSON (adapters read one-element tensors there).
    """
    if isinstance(obj, bool):
        return {"type": "bool", "value": obj}
    if isinstance(obj, int):
        return {"type": "int", "value": obj}
    if isinstance(obj, float):
        return {"type": "float", "value": obj}
    if isinstance(obj, str):
        return {"type": "str", "value": obj if len(obj) <= MAX_STR else obj[: MAX_STR - 3] + "..."}
    if isinstance(obj, slice):
        return {"type": "slice", "value": [part(obj.start), part(obj.stop), part(obj.step)]}
    if obj is Ellipsis:
        return {"type": "ellipsis", "value": "..."}
    if isinstance(obj, np.generic):
        try:
            v = obj.item()
            json.dumps(v)
        except Exception:
            v = safe_repr(obj)
        return {"type": type(obj).__name__, "value": v}
    if isinstance(obj, complex):
        return {"type": "complex", "value": safe_repr(obj)}
    return {"type": qualname(obj), "value": safe_repr(obj)}
