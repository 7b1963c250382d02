"""dump.json text of entry values whose tensor leaves are record tuples (the export hot path).

:class:`store.entries.EntryBuilder` keeps each tensor leaf as a tuple of its column values
(:data:`store.entries.RECORD_FIELDS`) instead of a dict; the encoders made by
:func:`records_encoder` write a value holding such tuples exactly as
``json.dumps(_plain(value), indent=1)`` would (at its depth), where ``_plain`` turns every
tuple into its :func:`store.entries._tensor_record` dict. Each record is written by one
specialised function (fixed key order, no recursion, no dict) instead of the generic
encoder, and an equal record met again in the same dump is not formatted again.
"""
from __future__ import annotations

import json
from typing import Any, Callable

from store import schema as S
from store.entries import _tensor_record
from store.json_text import _ENCODE_STR, _encode as _encode_plain, _float_text, _make_encoder, _NotPlainJson

__all__ = ["encode_records", "records_encoder"]

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


def _record_fast(record: tuple, indent: str) -> str:
    """The text of one record tuple at ``indent``; TypeError/ValueError when a field has
    a type the fast path does not handle (the caller then encodes the dict)."""
    (type_, dtype, shape, max_, min_, mean, norm, requires_grad, max_finite, min_finite, crc32,
     data_name) = record
    inner = indent + " "
    sep = ",\n" + inner
    if type(shape) is tuple:
        if shape:
            deeper = inner + " "
            shape_text = "[\n" + deeper + (",\n" + deeper).join(map(int.__repr__, shape)) + "\n" + inner + "]"
        else:
            shape_text = "[]"
    elif shape is None:
        shape_text = "null"
    else:
        raise TypeError("shape")
    if dtype in _BOOL_DTYPES:
        stats = (("null" if max_ is None else "true" if max_ else "false") + sep + '"Min": '
                 + ("null" if min_ is None else "true" if min_ else "false") + sep + '"Mean": null'
                 + sep + '"Norm": null')
    else:
        stats = (_number(max_) + sep + '"Min": ' + _number(min_) + sep + '"Mean": ' + _number(mean)
                 + sep + '"Norm": ' + _number(norm))
    text = (f'{{\n{inner}"type": {_ENCODE_STR(type_)}{sep}"dtype": {_ENCODE_STR(dtype)}{sep}"shape": '
            f'{shape_text}{sep}"Max": {stats}')
    if requires_grad is not None:
        text += sep + '"requires_grad": ' + _flag(requires_grad)
    if max_finite is not None:
        text += sep + '"Max_except_inf_nan": ' + _number(max_finite)
    if min_finite is not None:
        text += sep + '"Min_except_inf_nan": ' + _number(min_finite)
    if crc32 is not None:
        text += sep + '"md5": ' + _ENCODE_STR(crc32)
    if data_name is not None:
        text += sep + '"data_name": ' + _ENCODE_STR(data_name)
    return text + "\n" + indent + "}"


def _record_text(record: tuple, indent: str) -> str:
    """The ``indent=1`` text of a record tuple nested at ``indent``."""
    try:
        return _record_fast(record, indent)
    except (TypeError, ValueError):
        try:
            plain = _tensor_record(*record)
        except TypeError:
            raise _NotPlainJson from None  # not a record: the caller falls back to json.dumps
        out: list = []
        _encode_plain(plain, indent, out)
        return "".join(out)


def _value_text(value_json: str, indent: str) -> str:
    """The ``indent=1`` text of the JSON value ``value_json`` nested at ``indent``."""
    out: list = []
    _encode_plain(json.loads(value_json), indent, out)
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
    texts: dict = {}

    def on_tuple(leaf: tuple, indent: str, out: list) -> None:
        key = (leaf, indent)
        try:
            text = texts.get(key)
        except TypeError:  # an unhashable field: not a leaf EntryBuilder makes
            out.append(_record_text(leaf, indent))
            return
        if text is None:
            if len(leaf) == 1:
                text = texts[key] = _value_text(leaf[0], indent)
            else:
                text = _record_text(leaf, indent)
                if not _has_zero(leaf):  # a key equal to a record without zeros has none either
                    texts[key] = text
        out.append(text)

    return _make_encoder(on_tuple)


def encode_records(value: Any, indent: str, out: list) -> None:
    """One value through a new :func:`records_encoder` (arguments and errors as its encoder)."""
    records_encoder()(value, indent, out)
