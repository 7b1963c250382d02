"""``json.dumps(obj, indent=1)``'s exact text, several times faster (the export hot path).

Python's C JSON encoder is not used when ``indent`` is set, so dump.json's upstream
``indent=1`` layout would go through the pure-Python encoder; :func:`dumps_indent1`
writes the same bytes with one call per container instead of one per value.
"""
from __future__ import annotations

import json
from typing import Any, Callable

__all__ = ["dumps_indent1"]


class _NotPlainJson(Exception):
    """Internal: a value :func:`dumps_indent1` leaves to :func:`json.dumps`."""


_ENCODE_STR = json.encoder.encode_basestring_ascii
_INF = float("inf")


def _float_text(value: float) -> str:
    if value != value:
        return "NaN"
    if value == _INF:
        return "Infinity"
    if value == -_INF:
        return "-Infinity"
    return float.__repr__(value)


def _make_encoder(on_tuple: Callable[[tuple, str, list], None]) -> Callable[[Any, str, list], None]:
    """An ``indent=1`` encoder ``encode(value, indent, out)`` that hands every ``tuple`` it
    meets (as a value or an item, at any depth) to ``on_tuple(value, indent, out)``."""

    def encode(value: Any, indent: str, out: list) -> None:
        """Append the ``indent=1`` JSON text of ``value`` (nested at ``indent``) to ``out``.
        Scalars inside containers are encoded inline (no call per scalar)."""
        kind = type(value)
        if kind is dict:
            if not value:
                out.append("{}")
                return
            inner = indent + " "
            separator = "{\n" + inner
            for key, item in value.items():
                if type(key) is not str:
                    raise _NotPlainJson
                out.append(separator)
                out.append(_ENCODE_STR(key))
                out.append(": ")
                kind = type(item)
                if kind is str:
                    out.append(_ENCODE_STR(item))
                elif kind is float:
                    out.append(float.__repr__(item) if item - item == 0.0 else _float_text(item))
                elif item is None:
                    out.append("null")
                elif kind is bool:
                    out.append("true" if item else "false")
                elif kind is int:
                    out.append(int.__repr__(item))
                elif kind is tuple:
                    on_tuple(item, inner, out)
                else:
                    encode(item, inner, out)
                separator = ",\n" + inner
            out.append("\n" + indent + "}")
        elif kind is list:
            if not value:
                out.append("[]")
                return
            inner = indent + " "
            separator = "[\n" + inner
            for item in value:
                out.append(separator)
                kind = type(item)
                if kind is tuple:
                    on_tuple(item, inner, out)
                elif kind is str:
                    out.append(_ENCODE_STR(item))
                elif kind is float:
                    out.append(float.__repr__(item) if item - item == 0.0 else _float_text(item))
                elif item is None:
                    out.append("null")
                elif kind is bool:
                    out.append("true" if item else "false")
                elif kind is int:
                    out.append(int.__repr__(item))
                else:
                    encode(item, inner, out)
                separator = ",\n" + inner
            out.append("\n" + indent + "]")
        elif kind is str:
            out.append(_ENCODE_STR(value))
        elif kind is float:
            out.append(_float_text(value))
        elif value is None:
            out.append("null")
        elif kind is bool:
            out.append("true" if value else "false")
        elif kind is int:
            out.append(int.__repr__(value))
        elif kind is tuple:
            on_tuple(value, indent, out)
        else:
            raise _NotPlainJson

    return encode


def _not_plain(value: tuple, indent: str, out: list) -> None:
    raise _NotPlainJson


#: ``_encode(value, indent, out)``: the plain-JSON encoder of :func:`dumps_indent1` (a tuple
#: is not plain: ``json.dumps`` writes it as a list, the fallback does that)
_encode = _make_encoder(_not_plain)


def dumps_indent1(obj: Any) -> str:
    r"""Exactly ``json.dumps(obj, indent=1)`` (ASCII, NaN/Infinity tokens), several times
    faster for plain values: Python's C encoder is not used when ``indent`` is set.

    Plain values are ``dict`` with ``str`` keys, ``list``, ``str``, ``int``, ``float``,
    ``bool`` and ``None`` (exact types); anything else falls back to :func:`json.dumps`.

    >>> dumps_indent1({"a": [1, 2.5], "b": {}})
    '{\n "a": [\n  1,\n  2.5\n ],\n "b": {}\n}'
    """
    out: list[str] = []
    try:
        _encode(obj, "", out)
    except (_NotPlainJson, RecursionError):
        return json.dumps(obj, indent=1)
    return "".join(out)
