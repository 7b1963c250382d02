"""The one field table (store.schema.LEAF_FIELDS, TENSOR_RECORD_KEYS, CALL_FIELDS): the log
schema, the Leaf tuple, the exporter's record tuples and their JSON text, the native
small_leaf and the writer process's CALL message all take their field order from it."""
from __future__ import annotations

import json
import pickle
import threading

import pytest

from store import log_writer
from store import schema as S
from store.entries import LEAF_COLUMNS, RECORD_FIELDS, _tensor_record
from store.json_text import records_encoder
from store.records import Call, Leaf, make_leaf, null_leaf
from store.writer_client import WriterClient
from store.writer_process import CALL, CALL_FIELDS, message_record


def test_log_schema_columns_follow_the_table():
    names = S.LOG_SCHEMA.names
    assert tuple(names) == S.COLUMNS
    leaf_columns = names[names.index(S.IO):names.index(S.VALUE_JSON) + 1]
    assert [c for c in leaf_columns if c != S.ARG] == list(S.LEAF_FIELDS)
    assert leaf_columns[leaf_columns.index(S.PATH) + 1] == S.ARG
    assert names[4:4 + len(S.CALL_FIELDS)] == list(S.CALL_FIELDS)
    assert [f.name for f in S.LOG_SCHEMA if not f.nullable] == [S.RANK, S.STEP, S.SEQ, S.ROW]


def test_leaf_tuple_order_is_the_table():
    values = {name: f"v{i}" for i, name in enumerate(S.LEAF_FIELDS)}
    leaf = Leaf(**values)
    assert tuple(leaf) == tuple(values[name] for name in S.LEAF_FIELDS)
    assert all(getattr(leaf, name) == value for name, value in values.items())
    assert make_leaf(tuple(leaf)) == leaf
    with pytest.raises(TypeError, match="leaf_kind"):
        Leaf(io="output", path=())
    with pytest.raises(TypeError, match="bogus"):
        Leaf(io="output", path=(), leaf_kind="none", bogus=1)


def test_writer_leaf_columns_are_the_fields_but_path():
    leaf = Leaf(**{name: f"v{i}" for i, name in enumerate(S.LEAF_FIELDS)})
    paths, columns = log_writer._leaf_values([leaf])
    assert paths == [leaf.path]
    assert dict(zip(log_writer._LEAF_COLUMN_NAMES, (c[0] for c in columns))) == {
        name: getattr(leaf, name) for name in S.LEAF_FIELDS if name != S.PATH}


def _distinct_record() -> tuple:
    """A record tuple in RECORD_FIELDS order whose every field is set and tells its column
    apart (a CRC-32, not an XOR checksum; a float dtype)."""
    values = {S.TYPE: "torch.Tensor", S.DTYPE: "torch.float32", S.SHAPE: (2, 3), S.MAX: 4.5, S.MIN: -1.25,
              S.MEAN: 0.5, S.NORM: 7.0, S.REQUIRES_GRAD: True, S.MAX_FINITE: 3.5, S.MIN_FINITE: -0.75,
              S.CRC32: "0a1b2c3d", S.DATA_NAME: "x.pt"}
    return tuple(values[column] for column in RECORD_FIELDS), values


def test_tensor_record_keys_follow_the_table():
    record, values = _distinct_record()
    assert RECORD_FIELDS == tuple(column for column, _ in S.TENSOR_RECORD_KEYS)
    assert LEAF_COLUMNS[4:4 + len(RECORD_FIELDS)] == RECORD_FIELDS
    expected = {key: (list(values[column]) if column == S.SHAPE else values[column])
                for column, key in S.TENSOR_RECORD_KEYS}
    as_dict = _tensor_record(*record)
    assert as_dict == expected and list(as_dict) == list(expected)  # keys in table order
    out: list = []
    records_encoder()({"x": [record]}, "", out)
    text = "".join(out)
    assert text == json.dumps({"x": [expected]}, indent=1)


def test_small_leaf_takes_its_field_places_from_the_table():
    torch = pytest.importorskip("torch")
    import msprobe.pytorch.leaves as leaves_mod

    if leaves_mod._small_leaf is None:
        pytest.skip("native extension not built")
    t = torch.tensor([[1.0, -2.0], [3.0, 0.5]])
    plain, strided, dtypes, max_bytes, leaf_type, template, slots, crc = leaves_mod._small_table(4096)
    assert crc == 0
    assert tuple(leaf_type(**dict(zip(S.LEAF_FIELDS, template)))) == template
    leaf = leaves_mod._small_leaf(t, "output", (1,), (plain, strided, dtypes, max_bytes, leaf_type, template, slots,
                                                      crc))
    assert (leaf.io, leaf.path, leaf.dtype, leaf.shape, leaf.numel) == ("output", (1,), "torch.float32", (2, 2), 4)
    assert (leaf.max, leaf.min, leaf.mean, leaf.norm) == (3.0, -2.0, 0.625, (1 + 4 + 9 + 0.25) ** 0.5)
    assert (leaf.leaf_kind, leaf.type, leaf.has_nan, leaf.has_inf, leaf.crc32) == ("tensor", "torch.Tensor",
                                                                                  False, False, None)
    # another order of the same places: the native code follows the slots it is given
    reversed_template = tuple(reversed(template)) + ("extra",)
    n = len(template)
    reversed_slots = tuple(n - 1 - s for s in slots)
    got = leaves_mod._small_leaf(t, "output", (1,), (plain, strided, dtypes, max_bytes, tuple, reversed_template,
                                                      reversed_slots, crc))
    assert got[-1] == "extra" and tuple(reversed(got[:-1])) == tuple(leaf)
    with pytest.raises(ValueError, match="slot"):
        leaves_mod._small_leaf(t, "output", (1,), (plain, strided, dtypes, max_bytes, tuple, template,
                                                   (0,) * len(slots), crc))


class _Capture:
    """Stands in for a WriterClient's frame buffer: keeps the message ``append`` builds."""

    _lock = threading.Lock()
    _rows = 0
    _flush_rows = 1 << 30

    def _add(self, message: tuple, rows: int) -> None:
        self.message = message


def test_call_message_round_trips_through_the_call_fields():
    leaf = Leaf(io="output", path=(0,), leaf_kind="tensor", type="torch.Tensor", dtype="torch.float32", max=2.5)
    call = Call(step=7, kind=S.API_FORWARD, name="Functional.relu.3.forward", api_type="Functional",
                parent="Module.fc.Linear.forward.0", stack_id=11, is_recompute=False,
                keys=("input_args", "output"), leaves=(leaf, null_leaf("input_args", (0,))))
    capture = _Capture()
    WriterClient.append(capture, call)
    message = capture.message
    assert message[0] == CALL and len(message) == 1 + len(CALL_FIELDS)
    assert dict(zip(CALL_FIELDS, message[1:-1])) == {f: getattr(call, f) for f in CALL_FIELDS[:-1]}
    assert all(type(x) is tuple for x in message[-1])  # plain tuples on the pipe
    assert message_record(pickle.loads(pickle.dumps(message))) == call
