"""``json.dumps(obj, indent=1)``'s exact text, several times faster (the export hot path).

Python's C JSON encoder is not used when ``indent`` is set, so dump.json's upstream
``indent=1`` layout would go through the pure-Python encoder; :func:`dumps_indent1`
writes the same bytes with one call per container instead of one per value.

dump.json's entries hold their leaves as tuples: :class:`store.entries.EntryBuilder` keeps
each tensor leaf as a tuple of its column values (:data:`store.entries.RECORD_FIELDS`)
instead of a dict, and each value leaf as ``(value_json,)``; the encoders made by
:func:`records_encoder` write a value holding such tuples exactly as
``json.dumps(store.entries._plain(value), indent=1)`` would (at its depth; ``_plain`` turns
every tuple into its dict or parsed value). Each record is written by one specialised
function (fixed key order, no recursion, no dict) instead of the generic encoder, and an
equal leaf met again in the same dump is not formatted again.

The encoders run where the step files are written: in the rank's writer process
(:mod:`store.writer_process`), off the training thread, or by ``msprobe export``.
"""
from __future__ import annotations

import json
from typing import Any, Callable

from store import schema as S
from store.entries import _tensor_record

__all__ = ["dumps_indent1", "records_encoder"]


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


# --- dump.json records (tuples of column values) ----------------------------------------

_BOOL_DTYPES = S.BOOL_DTYPES


def _number(value: Any) -> str:
    """JSON text of a float column value (float or None); TypeError for any other type."""
    if value is None:
        return "null"
    if value - value == 0.0:  # finite (TypeError for str; an int or bool gets past here...)
        return float.__repr__(value)  # ...and raises TypeError here: only floats are handled
    return _float_text(value)  # NaN, Infinity, -Infinity (float subtraction gave NaN)


def _flag(value: Any) -> str:
    """JSON text of a bool; TypeError for any other type."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    raise TypeError(f"not a bool: {type(value).__name__}")


class _Frame:
    """The fixed text around the fields of a record nested at one indent, and the texts
    an encoder already wrote at that indent (per :func:`records_encoder`, never shared)."""

    __slots__ = ("indent", "labels", "close", "deeper", "shapes", "leaves")

    def __init__(self, indent: str) -> None:
        inner = indent + " "
        sep = ",\n" + inner
        self.indent = indent
        #: what precedes each field of RECORD_FIELDS (in that order) and its JSON key
        self.labels = tuple(("{\n" + inner if i == 0 else sep) + '"' + key + '": '
                            for i, (_, key) in enumerate(S.TENSOR_RECORD_KEYS))
        self.close = "\n" + indent + "}"
        self.deeper = (inner + " ", "\n" + inner + "]")
        self.shapes: dict = {None: "null", (): "[]"}  # shape tuple -> text (ints only)
        self.leaves: dict = {}  # leaf tuple -> text


def _shape_text(shape: tuple, frame: _Frame) -> str:
    """The text of a non-empty shape tuple of ints in ``frame`` (kept there)."""
    if type(shape) is not tuple:
        raise TypeError("shape")
    deeper, close = frame.deeper
    text = frame.shapes[shape] = "[\n" + deeper + (",\n" + deeper).join(map(int.__repr__, shape)) + close
    return text


def _record_fast(record: tuple, frame: _Frame) -> str:
    """The text of one record tuple in ``frame``; TypeError/ValueError when a field has a
    type this path does not handle (the caller then encodes the record's dict)."""
    (type_, dtype, shape, max_, min_, mean, norm, requires_grad, max_finite, min_finite, crc32,
     data_name) = record
    (l_type, l_dtype, l_shape, l_max, l_min, l_mean, l_norm, l_grad, l_max_finite, l_min_finite, l_md5,
     l_name) = frame.labels
    shape_text = frame.shapes.get(shape) or _shape_text(shape, frame)
    if S.is_xor_checksum(crc32):  # summary_mode xor: no statistics keys (store.entries._tensor_record)
        tail = frame.close
        if data_name is not None:
            tail = l_name + _ENCODE_STR(data_name) + tail
        if requires_grad is not None:
            tail = l_grad + _flag(requires_grad) + tail
        return f"{l_type}{_ENCODE_STR(type_)}{l_dtype}{_ENCODE_STR(dtype)}{l_shape}{shape_text}{l_md5}{_ENCODE_STR(crc32)}{tail}"
    if dtype in _BOOL_DTYPES:
        max_text = "null" if max_ is None else "true" if max_ else "false"
        min_text = "null" if min_ is None else "true" if min_ else "false"
        mean_text = norm_text = "null"
    else:  # float.__repr__ of a finite float inline; None, NaN, ±Infinity (or a TypeError) by _number
        max_text = _repr(max_) if max_ is not None and max_ - max_ == 0.0 else _number(max_)
        min_text = _repr(min_) if min_ is not None and min_ - min_ == 0.0 else _number(min_)
        mean_text = _repr(mean) if mean is not None and mean - mean == 0.0 else _number(mean)
        norm_text = _repr(norm) if norm is not None and norm - norm == 0.0 else _number(norm)
    tail = frame.close
    if data_name is not None:
        tail = l_name + _ENCODE_STR(data_name) + tail
    if crc32 is not None:
        tail = l_md5 + _ENCODE_STR(crc32) + tail
    if min_finite is not None:
        tail = l_min_finite + _number(min_finite) + tail
    if max_finite is not None:
        tail = l_max_finite + _number(max_finite) + tail
    if requires_grad is not None:
        tail = l_grad + _flag(requires_grad) + tail
    return (f"{l_type}{_ENCODE_STR(type_)}{l_dtype}{_ENCODE_STR(dtype)}{l_shape}{shape_text}{l_max}{max_text}"
            f"{l_min}{min_text}{l_mean}{mean_text}{l_norm}{norm_text}{tail}")


_repr = float.__repr__


def _record_text(record: tuple, frame: _Frame) -> str:
    """The ``indent=1`` text of a record tuple in ``frame``."""
    try:
        return _record_fast(record, frame)
    except (TypeError, ValueError):
        return _record_dict_text(record, frame.indent)


def _record_dict_text(record: tuple, indent: str) -> str:
    """The text of ``record`` nested at ``indent``, written from its
    :func:`store.entries._tensor_record` dict by the plain-JSON encoder (any field types).

    Raises:
        store.json_text._NotPlainJson: not a record, or not plain JSON (the caller falls
            back to ``json.dumps``).
    """
    try:
        plain = _tensor_record(*record)
    except TypeError:
        raise _NotPlainJson from None  # not a record: the caller falls back to json.dumps
    out: list = []
    _encode(plain, indent, out)
    return "".join(out)


def _value_text(value_json: str, indent: str) -> str:
    """The ``indent=1`` text of the JSON value ``value_json`` nested at ``indent``."""
    out: list = []
    _encode(json.loads(value_json), indent, out)
    return "".join(out)


def _has_zero(record: tuple) -> bool:
    """True when a float statistic of ``record`` is 0.0 or -0.0 (equal as keys, not as text)."""
    return 0.0 in (record[3], record[4], record[5], record[6], record[8], record[9])


def records_encoder() -> Callable[[Any, str, list], None]:
    """A new ``encode(value, indent, out)``: appends the ``indent=1`` text of ``value``
    nested at ``indent`` (a str of spaces) to ``out`` (a list of str), each tuple in it
    written as the leaf it stands for (a tensor record, :data:`store.entries.RECORD_FIELDS`,
    or a value leaf ``(value_json,)``), exactly ``json.dumps(_plain(value), indent=1)``'s
    text at that depth.

    The encoder keeps the text of the leaves it wrote (an equal leaf at the same depth is
    not formatted again: the output of one call is the input of the next, same
    statistics; value leaves repeat a few texts); make one per dump, the texts are freed
    with it. A record with a zero statistic is always formatted and never kept (0.0 and
    -0.0 are equal keys but different texts; a record equal to a kept one has no zero
    either). Records hold column values (floats or None in the float fields, ints in the
    shape): equal records then have equal texts.

    Raises (from ``encode``):
        store.json_text._NotPlainJson: a value that is not plain JSON (dict keys not str,
            other types); RecursionError: nested too deep.
    """
    frames: dict[str, _Frame] = {}

    def on_tuple(leaf: tuple, indent: str, out: list) -> None:
        frame = frames.get(indent)
        if frame is None:
            frame = frames[indent] = _Frame(indent)
        leaves = frame.leaves
        try:
            text = leaves.get(leaf)
        except TypeError:  # an unhashable field: not a leaf EntryBuilder makes
            out.append(_record_text(leaf, frame))
            return
        if text is None:
            if len(leaf) == 1:
                text = leaves[leaf] = _value_text(leaf[0], indent)
            else:
                text = _record_text(leaf, frame)
                if not _has_zero(leaf):  # a key equal to a record without zeros has none either
                    leaves[leaf] = text
        out.append(text)

    return _make_encoder(on_tuple)
