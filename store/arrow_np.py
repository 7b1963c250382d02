"""Row selection and Python conversion of Arrow columns with numpy, without ``pyarrow.compute``.

The recording process keeps its memory small (``import pyarrow.compute`` alone
costs about 8 MB of resident memory, measured with pyarrow 25). pyarrow's own
``Table.filter``, ``take``, ``sort_by``, ``Array.is_null`` and ``fill_null`` import
``pyarrow.compute`` on first use, so the live path (log writer, entry builder, live
exporter) uses these helpers instead. They read the Arrow buffers zero-copy with numpy:
the validity bitmap (least significant bit first, honouring the array's ``offset``), the
values buffer of fixed-width columns and the offsets and data buffers of strings.

Every function accepts an :class:`pyarrow.Array` or a :class:`pyarrow.ChunkedArray`
(chunks are handled one by one and the results concatenated). Offline tools may still
use ``pyarrow.compute``; ``tests/store/test_arrow_np.py`` checks these helpers against it.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np
import pyarrow as pa

__all__ = ["equals", "int_min", "pylist", "select", "valid_mask", "values"]

Column = Union[pa.Array, pa.ChunkedArray]


def _chunks(column: Column) -> list[pa.Array]:
    return list(column.chunks) if isinstance(column, pa.ChunkedArray) else [column]


def _concat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _bits(buffer: pa.Buffer, offset: int, length: int) -> np.ndarray:
    """``length`` bits of an Arrow bitmap (LSB first) from bit ``offset``, as a bool array."""
    if length == 0:
        return np.zeros(0, dtype=bool)
    first, stop = offset // 8, (offset + length + 7) // 8
    raw = np.frombuffer(buffer, dtype=np.uint8, count=stop - first, offset=first)
    shift = offset - 8 * first
    return np.unpackbits(raw, bitorder="little")[shift:shift + length].view(bool)


def _valid_chunk(array: pa.Array) -> np.ndarray:
    n = len(array)
    if array.null_count == 0:
        return np.ones(n, dtype=bool)
    if array.null_count == n:
        return np.zeros(n, dtype=bool)
    return _bits(array.buffers()[0], array.offset, n)


def valid_mask(column: Column) -> np.ndarray:
    """``True`` where ``column`` holds a value, ``False`` where it holds null.

    Equals ``pyarrow.compute.is_valid(column).to_numpy()``.

    Args:
        column: any Arrow array or chunked array (length ``n``).
    Returns:
        A new or read-only ``bool`` array of shape ``(n,)``.
    """
    return _concat([_valid_chunk(chunk) for chunk in _chunks(column)], bool)


def _numpy_type(kind: pa.DataType) -> np.dtype:
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        raise TypeError(f"values: got an Arrow column of type {kind}; allowed: integers, floats, booleans")
    # from the bit width (DataType.to_pandas_dtype tries to import pandas on every call)
    code = "f" if pa.types.is_floating(kind) else "i" if pa.types.is_signed_integer(kind) else "u"
    return np.dtype(f"<{code}{kind.bit_width // 8}")


def _values_chunk(array: pa.Array) -> np.ndarray:
    n = len(array)
    kind = array.type
    if pa.types.is_boolean(kind):
        if n == 0 or array.null_count == n:  # the values buffer may be empty or absent
            return np.zeros(n, dtype=bool)
        return _bits(array.buffers()[1], array.offset, n)
    dtype = _numpy_type(kind)
    if n == 0 or array.null_count == n:
        return np.zeros(n, dtype=dtype)
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=n, offset=array.offset * dtype.itemsize)


def values(column: Column) -> np.ndarray:
    """The values of a numeric or boolean column as numpy, zero-copy where possible.

    Slots that are null hold unspecified values: combine with :func:`valid_mask`.
    int64 values keep full precision (no float conversion).

    Args:
        column: an Arrow integer, floating-point or boolean column of length ``n``.
    Returns:
        An array of shape ``(n,)`` and the column's numpy dtype (``bool`` for booleans);
        read-only when it is a view of the Arrow buffer.
    Raises:
        TypeError: the column has another type.
    """
    chunks = _chunks(column)
    if pa.types.is_boolean(column.type):
        return _concat([_values_chunk(chunk) for chunk in chunks], bool)
    return _concat([_values_chunk(chunk) for chunk in chunks], _numpy_type(column.type))


#: rows compared at a time by :func:`equals`: its temporaries (~50 bytes per row: offsets,
#: byte positions, bytes) stay near 3 MB however long the column is
_BLOCK = 1 << 16


def _equals_chunk(array: pa.Array, encoded: bytes) -> np.ndarray:
    n = len(array)
    if n == 0:
        return np.zeros(0, dtype=bool)
    offset_type = np.int64 if pa.types.is_large_string(array.type) else np.int32
    offsets = np.frombuffer(array.buffers()[1], dtype=offset_type, count=n + 1,
                            offset=array.offset * np.dtype(offset_type).itemsize)
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    width = len(encoded)
    hit = lengths == width
    if width:
        candidates = np.flatnonzero(hit)
        if len(candidates):
            data = np.frombuffer(array.buffers()[2], dtype=np.uint8)
            window = starts[candidates][:, None] + np.arange(width)
            same = (data[window] == np.frombuffer(encoded, dtype=np.uint8)).all(axis=1)
            hit[candidates] = same
    if array.null_count:
        hit &= _valid_chunk(array)
    return hit


def equals(column: Column, value: str) -> np.ndarray:
    """``True`` where a string column equals ``value``; null slots give ``False``.

    Equals ``pyarrow.compute.equal(column, value).fill_null(False).to_numpy()``
    (byte-wise comparison of the UTF-8 text).

    Args:
        column: an Arrow ``string`` or ``large_string`` column of length ``n``.
        value: the text to compare with.
    Returns:
        A ``bool`` array of shape ``(n,)``.
    Raises:
        TypeError: the column is not a string column, or ``value`` is not a ``str``.
    """
    kind = column.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise TypeError(f"equals: got an Arrow column of type {kind}; allowed: string, large_string")
    if not isinstance(value, str):
        raise TypeError(f"equals: value must be a str, got {type(value).__name__}")
    encoded = value.encode("utf-8")
    blocks = [chunk.slice(start, _BLOCK) for chunk in _chunks(column) for start in range(0, len(chunk), _BLOCK)]
    return _concat([_equals_chunk(block, encoded) for block in blocks], bool)


def int_min(column: Column) -> Optional[int]:
    """The smallest non-null value of an integer column, or None if it has none
    (``pyarrow.compute.min(column).as_py()``).

    Raises:
        TypeError: the column is not an integer column.
    """
    if not pa.types.is_integer(column.type):
        raise TypeError(f"int_min: got an Arrow column of type {column.type}; allowed: integers")
    numbers = values(column)
    if column.null_count:
        numbers = numbers[valid_mask(column)]
    return int(numbers.min()) if len(numbers) else None


def _pylist_chunk(array: pa.Array, tuples: bool = False) -> list:
    kind = array.type
    n = len(array)
    if n and array.null_count == n and not pa.types.is_null(kind):
        return [None] * n  # all null (buffers may be absent): no conversion at all
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return array.to_numpy(zero_copy_only=False).tolist()
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        if array.null_count == 0:
            return _values_chunk(array).tolist()
        numbers = _values_chunk(array).astype(object)  # Python ints/floats/bools, made in C
        numbers[~_valid_chunk(array)] = None
        return numbers.tolist()
    if pa.types.is_list(kind) and pa.types.is_integer(kind.value_type):
        # .values is the child array of the whole (unsliced) list array; .offsets are the
        # slice's own: convert only the part the slice covers
        offsets = array.offsets.to_numpy()
        first = int(offsets[0])
        flat = _pylist_chunk(array.values.slice(first, int(offsets[-1]) - first))
        offsets = (offsets - first).tolist()
        box = tuple if tuples else list
        if array.null_count == 0:
            return [box(flat[start:stop]) for start, stop in zip(offsets, offsets[1:])]
        valid = _valid_chunk(array).tolist()
        return [box(flat[start:stop]) if ok else None for start, stop, ok in zip(offsets, offsets[1:], valid)]
    values = array.to_pylist()
    if tuples and pa.types.is_list(kind):
        values = [tuple(item) if item is not None else None for item in values]
    return values


def pylist(column: Column, *, tuples: bool = False) -> list:
    """``column.to_pylist()``, several times faster for the column types of the log.

    Numbers and booleans go through numpy (nulls restored as None; NaN stays a float
    NaN; int64 values stay exact), strings through an object array, ``list<int>``
    through its flat values and offsets; an all-null column is ``[None] * n`` at once;
    other types use ``to_pylist``.

    Args:
        column: any Arrow array or chunked array.
        tuples: give the items of a list column as tuples instead of lists (the outer
            level only).
    Returns:
        A list of ``len(column)`` Python values.
    """
    chunks = _chunks(column)
    if len(chunks) == 1:
        return _pylist_chunk(chunks[0], tuples)
    out: list = []
    for chunk in chunks:
        out += _pylist_chunk(chunk, tuples)
    return out


def select(table: pa.Table, mask: np.ndarray) -> pa.Table:
    """The rows of ``table`` where ``mask`` is True, in order (``table.filter(mask)``).

    Each run of consecutive selected rows is a zero-copy slice; the slices are
    concatenated without copying (the result may hold several chunks per column; call
    ``combine_chunks`` for one). The schema, metadata included, is kept.

    Args:
        table: any table with ``n`` rows.
        mask: ``bool`` array of shape ``(n,)``.
    Returns:
        A table with ``mask.sum()`` rows.
    Raises:
        ValueError: ``mask`` is not a 1-d array of length ``n``.
    """
    mask = np.asarray(mask, dtype=bool)
    if mask.shape != (table.num_rows,):
        raise ValueError(f"select: mask of shape {mask.shape} for a table of {table.num_rows} rows")
    # +1 where a run of selected rows starts, -1 after it ends (int8: 2 bytes per row)
    edges = np.diff(np.concatenate(([False], mask, [False])).view(np.int8))
    starts = np.flatnonzero(edges == 1).tolist()
    stops = np.flatnonzero(edges == -1).tolist()
    if not starts:
        return table.schema.empty_table()
    if len(starts) == 1 and starts[0] == 0 and stops[0] == table.num_rows:
        return table
    return pa.concat_tables([table.slice(start, stop - start) for start, stop in zip(starts, stops)])
