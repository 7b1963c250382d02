"""store.arrow_np against pyarrow.compute itself (random tables with nulls, chunks, offsets)."""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import arrow_np

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
_FLOAT = st.floats(allow_nan=True, allow_infinity=True)
_TEXT = st.sampled_from(["", "call", "leaf", "stack", "marker", "cal", "calls", "é", "ü-leaf", "leaf\0"]) | st.text(max_size=6)
_ELEMENTS = {
    "i64": (pa.int64(), _INT64),
    "i32": (pa.int32(), _INT32),
    "f64": (pa.float64(), _FLOAT),
    "bool": (pa.bool_(), st.booleans()),
    "str": (pa.string(), _TEXT),
    "lstr": (pa.large_string(), _TEXT),
    "list": (pa.list_(pa.int64()), st.lists(st.one_of(st.none(), _INT64), max_size=4)),
}


@st.composite
def columns(draw, kinds=tuple(_ELEMENTS)):
    """A random Array or ChunkedArray with nulls, some chunks and sliced (offset) chunks."""
    kind = draw(st.sampled_from(kinds))
    arrow_type, element = _ELEMENTS[kind]
    chunks = []
    for _ in range(draw(st.integers(1, 4))):
        items = draw(st.lists(st.one_of(st.none(), element), max_size=20))
        array = pa.array(items, type=arrow_type)
        start = draw(st.integers(0, len(items)))
        stop = draw(st.integers(start, len(items)))
        chunks.append(array.slice(start, stop - start))
    if len(chunks) == 1 and draw(st.booleans()):
        return chunks[0]
    return pa.chunked_array(chunks, type=arrow_type)


def _same(a: list, b: list) -> bool:
    """Lists equal with NaN == NaN and exact types (True is not 1)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, list) or isinstance(y, list):
            if not (isinstance(x, list) and isinstance(y, list) and _same(x, y)):
                return False
        elif isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            continue
        elif type(x) is not type(y) or x != y:
            return False
    return True


@SETTINGS
@given(columns())
def test_valid_mask_and_pylist_match_pyarrow(column):
    assert arrow_np.valid_mask(column).tolist() == pc.is_valid(column).to_pylist()
    assert _same(arrow_np.pylist(column), column.to_pylist())
    as_tuples = [tuple(item) if isinstance(item, list) else item for item in column.to_pylist()]
    got = arrow_np.pylist(column, tuples=True)
    assert _same(got, as_tuples)
    assert all(type(item) is tuple for item, item_list in zip(got, column.to_pylist()) if isinstance(item_list, list))


@SETTINGS
@given(columns(kinds=("i64", "i32", "f64", "bool")))
def test_values_match_pyarrow_where_valid(column):
    got = arrow_np.values(column)
    valid = arrow_np.valid_mask(column)
    expected = pc.fill_null(column, False if pa.types.is_boolean(column.type) else 0).to_pylist()
    assert len(got) == len(column)
    assert _same([v for v, ok in zip(got.tolist(), valid) if ok], [v for v, ok in zip(expected, valid) if ok])


@SETTINGS
@given(columns(kinds=("str", "lstr")), _TEXT)
def test_equals_matches_pyarrow(column, value):
    expected = pc.fill_null(pc.equal(column, pa.scalar(value, column.type)), False).to_pylist()
    assert arrow_np.equals(column, value).tolist() == expected


@SETTINGS
@given(columns(kinds=("i64", "i32")))
def test_int_min_matches_pyarrow(column):
    assert arrow_np.int_min(column) == pc.min(column).as_py()


@SETTINGS
@given(st.data())
def test_select_matches_filter(data):
    n = data.draw(st.integers(0, 30))
    ints = data.draw(st.lists(st.one_of(st.none(), _INT64), min_size=n, max_size=n))
    texts = data.draw(st.lists(st.one_of(st.none(), _TEXT), min_size=n, max_size=n))
    cut = data.draw(st.integers(0, n))
    table = pa.concat_tables([
        pa.table({"i": pa.array(ints[:cut], pa.int64()), "s": pa.array(texts[:cut], pa.string())}),
        pa.table({"i": pa.array(ints[cut:], pa.int64()), "s": pa.array(texts[cut:], pa.string())}),
    ]).replace_schema_metadata({b"k": b"v"})
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    got = arrow_np.select(table, mask)
    expected = table.filter(pa.array(mask, pa.bool_()))
    assert got.schema == table.schema and got.schema.metadata == {b"k": b"v"}
    assert got.to_pydict() == expected.to_pydict()


def test_int64_above_2_53_and_nan_versus_null():
    big = 2**53 + 1
    ints = pa.array([big, None, -big, 2**63 - 1], pa.int64())
    assert arrow_np.pylist(ints) == [big, None, -big, 2**63 - 1]
    assert arrow_np.values(ints)[[0, 2, 3]].tolist() == [big, -big, 2**63 - 1]
    floats = pa.array([float("nan"), None, 1.5], pa.float64())
    got = arrow_np.pylist(floats)
    assert math.isnan(got[0]) and got[1] is None and got[2] == 1.5
    assert arrow_np.valid_mask(floats).tolist() == [True, False, True]


def test_sliced_bitmaps_across_byte_boundaries():
    items = [None if i % 3 == 0 else bool(i % 2) for i in range(40)]
    array = pa.array(items, pa.bool_())
    for start in range(0, 20):
        part = array.slice(start, 17)
        assert arrow_np.pylist(part) == items[start:start + 17]
        assert arrow_np.valid_mask(part).tolist() == [v is not None for v in items[start:start + 17]]


def test_empty_inputs():
    empty = pa.chunked_array([], pa.int64())
    assert arrow_np.valid_mask(empty).shape == (0,)
    assert arrow_np.values(empty).dtype == np.int64
    assert arrow_np.pylist(empty) == []
    assert arrow_np.int_min(empty) is None
    assert arrow_np.equals(pa.chunked_array([], pa.string()), "x").shape == (0,)
    table = pa.table({"a": pa.array([], pa.int64())})
    assert arrow_np.select(table, np.zeros(0, dtype=bool)).num_rows == 0


def test_all_null_columns():
    for kind in (pa.int64(), pa.float64(), pa.bool_(), pa.string(), pa.list_(pa.int64()), pa.null()):
        column = pa.nulls(5, kind)
        assert arrow_np.pylist(column) == [None] * 5
        assert arrow_np.pylist(column, tuples=True) == [None] * 5
        assert arrow_np.pylist(pa.chunked_array([column, pa.nulls(2, kind)])) == [None] * 7
        assert arrow_np.valid_mask(column).tolist() == [False] * 5
    assert arrow_np.equals(pa.nulls(3, pa.string()), "").tolist() == [False] * 3


def test_bad_input_is_refused():
    with pytest.raises(TypeError, match="allowed: string"):
        arrow_np.equals(pa.array([1, 2]), "1")
    with pytest.raises(TypeError, match="must be a str"):
        arrow_np.equals(pa.array(["a"]), 1)
    with pytest.raises(TypeError, match="allowed: integers, floats, booleans"):
        arrow_np.values(pa.array(["a"]))
    with pytest.raises(TypeError, match="allowed: integers"):
        arrow_np.int_min(pa.array([1.5]))
    with pytest.raises(ValueError, match="mask of shape"):
        arrow_np.select(pa.table({"a": [1, 2]}), np.ones(3, dtype=bool))


def test_equals_temporaries_stay_small_on_a_large_column():
    # a step of a large model holds ~1M rows of "call"/"leaf" (both 4 bytes): the byte
    # comparison of every candidate at once held ~50 bytes per row (53 MB for 1M rows), more
    # than the 8 MB the recording process saves by not importing pyarrow.compute
    import tracemalloc

    n = 300_000
    rows = pa.array((["call"] + ["leaf"] * 4) * (n // 5))
    tracemalloc.start()
    try:
        got = arrow_np.equals(rows, "leaf")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert int(got.sum()) == n * 4 // 5 and not got[0] and got[1]
    assert peak < n + 4_000_000, peak  # the result (1 byte per row) and bounded temporaries


@SETTINGS
@given(columns(kinds=("str", "lstr")), _TEXT)
def test_equals_in_small_blocks_matches_pyarrow(column, value):
    expected = pc.fill_null(pc.equal(column, pa.scalar(value, column.type)), False).to_pylist()
    blocks = arrow_np._BLOCK
    arrow_np._BLOCK = 3  # rows of a block: chunks split across block boundaries
    try:
        assert arrow_np.equals(column, value).tolist() == expected
    finally:
        arrow_np._BLOCK = blocks


def test_select_temporaries_stay_small_on_a_large_table():
    # the run edges of the mask were found in int64 (16 bytes per row for 1M rows: 16 MB)
    import tracemalloc

    n = 300_000
    table = pa.table({"a": pa.array(np.arange(n))})
    mask = np.ones(n, dtype=bool)
    mask[[5, 7, n - 1]] = False
    tracemalloc.start()
    try:
        got = arrow_np.select(table, mask)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got.column("a").to_pylist() == [i for i in range(n) if i not in (5, 7, n - 1)]
    assert peak < 3 * n, peak  # a few bytes per row
