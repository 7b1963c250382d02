"""Framework-neutral records of non-tensor values (spec section 3.3 with fixes 4/13 of 9).

Adapters handle their framework's own types (dtypes, devices, sizes) first and hand
everything else to :func:`value_record`::

    {"type": "int", "value": 2}, {"type": "slice", "value": [0, 2, null]},
    {"type": "ellipsis", "value": "..."}, {"type": "float64", "value": 3.0} (numpy scalar),
    {"type": "<module>.<qualname>", "value": "<short safe repr>"} (anything else).

A ``repr`` that raises gives ``"<type object>"``; memory addresses (`` at 0x7f...``) are
dropped from a repr, so a value records the same in every run; long text is cut to
:data:`MAX_TEXT` characters (strings to :data:`MAX_STR`).
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np

from msprobe.core.naming import distinct
from store import schema

MAX_TEXT = 256
MAX_STR = 4096


def qualname(obj: Any) -> str:
    """``type(obj)``'s qualified name without ``builtins.`` (``"int"``, ``"numpy.ndarray"``)."""
    t = type(obj)
    mod = t.__module__
    return t.__qualname__ if mod in ("builtins", None) else f"{mod}.{t.__qualname__}"


#: the memory address in a default ``repr`` (``<generator object f at 0x7f3a...>``)
_ADDRESS = re.compile(r"\s+at\s+0x[0-9A-Fa-f]+")


def safe_repr(obj: Any) -> str:
    """``repr(obj)`` without memory addresses, cut to :data:`MAX_TEXT` characters; never
    raises. An address (`` at 0x...`` of Python's default ``repr``, as in
    ``<generator object batches at 0x7f3a...>``) differs between runs and would make two
    runs' records of the same argument differ, so it is dropped:
    ``<generator object batches>``, ``<function f>``, ``<__main__.Foo object>``."""
    try:
        text = repr(obj)
    except Exception:
        text = f"<{qualname(obj)} object>"
    if "0x" in text:
        text = _ADDRESS.sub("", text)
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


MAX_DEPTH = 10


def key_text(key: Any) -> str:
    """The text of one dict key in a leaf path: the key itself for a ``str``, else
    ``str(key)`` cut to :data:`MAX_TEXT` characters (``"<{type} object>"`` when ``str``
    raises); never raises."""
    if type(key) is str:
        return key
    try:
        text = str(key)
    except Exception:
        return f"<{qualname(key)} object>"
    if type(text) is not str:  # a str subclass from a user __str__
        text = "".join(text)
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."


def object_keys(keys: Iterable[Any]) -> list[str]:
    """The path components of a dict's keys, in the dict's order: :func:`key_text` of each,
    made distinct within the dict. Keys of different types can have the same text (``1``
    and ``"1"``, ``None`` and ``"None"``); a JSON object holds each text once, so a key
    whose text an earlier key already took is written ``"{text}~{n}"`` with the smallest
    ``n >= 2`` still free (``{1: a, "1": b}`` → ``["1", "1~2"]``): every value keeps its own
    leaf and its own tensor file. Every recorder path (forward leaves, backward slots,
    ``save``) uses this, so the same dict always gives the same keys."""
    return distinct([key_text(k) for k in keys], _numbered_key)


def _numbered_key(text: str, n: int) -> str:
    return f"{text}~{n}"


def object_items(value: dict) -> list[tuple[str, Any, Any]]:
    """``(path component, key, value)`` of each item of the dict ``value``, in its order:
    the components of :func:`object_keys`, with keys and values as the dict pairs them (a
    subclass may iterate its keys in another order than ``values()``)."""
    pairs = list(value.items())
    return [(text, k, v) for text, (k, v) in zip(object_keys(k for k, _ in pairs), pairs)]


def walk(value: Any, *, leaf_kind: Callable[[Any], Optional[str]], record: Callable[[Any], dict],
         as_list: Callable[[Any], bool] = lambda v: False, path: tuple = (),
         depth: int = 0) -> Iterator[tuple[tuple, Any, str]]:
    """The leaves of a nested argument structure: ``(path, value, kind)`` triples.

    Lists/tuples become list paths (int components), dicts/namedtuples/dataclasses object
    paths (str components); empty containers are leaves of their own
    (``empty_list``/``empty_dict``), ``None`` is ``none``, and other values are recorded
    whole by ``record`` (kind ``value``; a failing ``record`` gives ``"<unrecordable>"``).
    Nesting deeper than :data:`MAX_DEPTH` is recorded as a value, never raised.

    Args:
        value: the structure.
        leaf_kind: the adapter's own leaves: a kind (``tensor``, or ``value`` for a
            tuple-like value recorded whole such as ``torch.Size``) or None.
        record: the JSON record of a non-tensor value.
        as_list: tuples with ``_fields`` that are still lists (PyTorch structseqs).
    """
    kind = leaf_kind(value)
    if kind is not None:
        yield path, (record(value) if kind == schema.LEAF_VALUE else value), kind
        return
    if value is None:
        yield path, None, schema.LEAF_NONE
        return
    if depth >= MAX_DEPTH:
        yield path, {"type": qualname(value), "value": "<nesting deeper than 10 levels>"}, schema.LEAF_VALUE
        return
    items: Optional[list] = None
    empty = schema.LEAF_EMPTY_DICT
    if isinstance(value, (list, tuple)):
        fields = getattr(value, "_fields", None)
        if fields is not None and isinstance(value, tuple) and not as_list(value):
            items = list(zip((str(f) for f in fields), value))
        else:
            items, empty = list(enumerate(value)), schema.LEAF_EMPTY_LIST
    elif isinstance(value, dict):
        items = [(text, v) for text, _, v in object_items(value)]
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [(f.name, getattr(value, f.name, None)) for f in dataclasses.fields(value)]
    if items is not None:
        if not items:
            yield path, None, empty
        for k, v in items:
            yield from walk(v, leaf_kind=leaf_kind, record=record, as_list=as_list, path=path + (k,), depth=depth + 1)
        return
    try:
        yield path, record(value), schema.LEAF_VALUE
    except Exception:
        yield path, {"type": qualname(value), "value": "<unrecordable>"}, schema.LEAF_VALUE
