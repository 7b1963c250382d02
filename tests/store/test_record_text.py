"""Tensor leaves as record tuples: the live dump.json text equals json.dumps of entry_values.

EntryBuilder keeps a tensor leaf as a tuple of its columns and store.json_text.records_encoder writes it
without building the dict; these tests hold that text to
``json.dumps(top-level object with entry_values(...), indent=1)`` (the reference, Python's
own encoder over plain dicts), byte for byte, and entry_values to hand-written dicts.
"""
from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import schema as S
from store.entries import _plain, _put, _tensor_record, build_entries, entry_values
from store.export import StepExporter, _dump_text, export_debug, export_step
from store.json_text import _NotPlainJson, dumps_indent1, records_encoder

META = {"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None, "rank_dir": "rank0"}
_KEYS = {
    S.API_FORWARD: ["input_args", "input_kwargs", "is_recompute", "output"],
    S.MODULE_FORWARD: ["input_args", "input_kwargs", "output", "parameters", "is_recompute"],
    S.API_BACKWARD: ["input", "output"],
    S.MODULE_BACKWARD: ["input", "output"],
    S.PARAMETERS_GRAD: ["weight", "bias"],
    S.DEBUG_SAVE: [],
}


def _call(seq: int, kind: str, name: str, keys=None, **extra) -> dict:
    return dict(rank=0, step=0, seq=seq, row=S.ROW_CALL, kind=kind, name=name,
                keys=json.dumps(_KEYS[kind] if keys is None else keys), **extra)


def _leaf(seq: int, io: str, path: list, leaf_kind: str = S.LEAF_TENSOR, **fields) -> dict:
    return dict(rank=0, step=0, seq=seq, row=S.ROW_LEAF, io=io, path=json.dumps(path),
                leaf_kind=leaf_kind, **fields)


def _tensor(seq: int, io: str, path: list, **fields) -> dict:
    stats = dict(type="torch.Tensor", dtype="torch.float32", shape=[2, 3], max=1.5, min=-0.5, mean=0.25,
                 norm=2.0, requires_grad=True)
    stats.update(fields)
    return _leaf(seq, io, path, **stats)


def _table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=S.LOG_SCHEMA)


def _reference(rows: pa.Table, level: str = META["level"]) -> str:
    """dump.json (debug.json with level "debug") as Python's json module writes the plain
    entry values."""
    order, entries = build_entries(rows)
    top = dict(task=META["task"], level=level, framework=META["framework"],
               dump_data_dir=META["dump_data_dir"], data=entry_values(order, entries))
    return json.dumps(top, indent=1)


def _has_tuple(value) -> bool:
    if isinstance(value, tuple):
        return True
    if isinstance(value, list):
        return any(_has_tuple(item) for item in value)
    if isinstance(value, dict):
        return any(_has_tuple(item) for item in value.values())
    return False


def _live_text(parts: list[pa.Table], tmp_path) -> str:
    live = StepExporter()
    for part in parts:
        live.add(part)
        live.write({}, META, tmp_path)
    return (tmp_path / "dump.json").read_text()


# --- hand-written records --------------------------------------------------------------------
SUBNORMAL = 5e-324
HUGE = 1.7976931348623157e308


def test_records_of_every_field_combination(tmp_path):
    rows = [
        _call(0, S.API_FORWARD, "Torch.add.0.forward", is_recompute=False),
        _tensor(0, "input_args", [0], dtype="torch.bool", max=1.0, min=0.0, mean=0.5, norm=1.0,
                requires_grad=None),
        _tensor(0, "input_args", [1], dtype="bool", max=None, min=0.0, mean=None, norm=None),
        _tensor(0, "input_args", [2], max=math.nan, min=-math.inf, mean=math.nan, norm=math.inf,
                max_finite=-0.0, min_finite=SUBNORMAL, crc32="0a1b2c3d"),
        _tensor(0, "input_args", [3], shape=[], max=HUGE, min=-HUGE, mean=-0.0, norm=0.0,
                requires_grad=False, data_name="Torch.add.0.forward.input.3.pt"),
        _tensor(0, "input_kwargs", ["alpha"], shape=None, max=None, min=None, mean=None, norm=None,
                requires_grad=None, type=None, dtype=None),
        _leaf(0, "input_kwargs", ["out"], S.LEAF_VALUE, value_json='{"type": "int", "value": 3}'),
        _tensor(0, "output", [0, 1], max=2.0, min=2.0, mean=2.0, norm=2.0, crc32="ffffffff",
                data_name="Torch.add.0.forward.output.0.1.pt"),
        _leaf(0, "output", [0, 0], S.LEAF_NONE),
        _leaf(0, "output", [1], S.LEAF_EMPTY_LIST),
        _leaf(0, "output", [2], S.LEAF_EMPTY_DICT),
    ]
    table = _table(rows)
    order, entries = build_entries(table)
    value = entry_values(order, entries)["Torch.add.0.forward"]
    assert not _has_tuple(value)
    assert value["input_args"][0] == {"type": "torch.Tensor", "dtype": "torch.bool", "shape": [2, 3],
                                      "Max": True, "Min": False, "Mean": None, "Norm": None}
    assert value["input_args"][1] == {"type": "torch.Tensor", "dtype": "bool", "shape": [2, 3], "Max": None,
                                      "Min": False, "Mean": None, "Norm": None, "requires_grad": True}
    record = value["input_args"][2]
    assert list(record) == ["type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad",
                            "Max_except_inf_nan", "Min_except_inf_nan", "md5"]
    assert math.isnan(record["Max"]) and record["Min"] == -math.inf and record["Norm"] == math.inf
    assert math.copysign(1.0, record["Max_except_inf_nan"]) == -1.0 and record["Min_except_inf_nan"] == SUBNORMAL
    assert value["input_args"][3]["shape"] == [] and value["input_args"][3]["data_name"].endswith(".3.pt")
    assert value["input_kwargs"] == {
        "alpha": {"type": None, "dtype": None, "shape": None, "Max": None, "Min": None, "Mean": None,
                  "Norm": None},
        "out": {"type": "int", "value": 3},
    }
    assert value["output"][0][0] is None and value["output"][1:] == [[], {}]
    assert value["output"][0][1]["md5"] == "ffffffff"
    assert value["is_recompute"] is False
    text = _live_text([table], tmp_path)
    assert text == _reference(table)
    assert '"Max_except_inf_nan": -0.0' in text and '"Min_except_inf_nan": 5e-324' in text
    assert '"Max": 1.7976931348623157e+308' in text and '"Mean": -0.0' in text and '"Norm": 0.0' in text
    assert '"Max": NaN' in text and '"Min": -Infinity' in text and '"Norm": Infinity' in text


def test_equal_records_with_zero_and_negative_zero_keep_their_sign(tmp_path):
    """0.0 == -0.0 (equal dict keys): records differing only there are both written as they are."""
    rows = [_call(0, S.API_FORWARD, "Torch.mul.0.forward")]
    for index, zero in enumerate([0.0, -0.0, 0.0, -0.0]):
        rows.append(_tensor(0, "output", [index], max=zero, min=zero, mean=zero, norm=zero))
    rows.append(_tensor(0, "input_args", [0], max=1.0, max_finite=-0.0, min_finite=0.0))
    rows.append(_tensor(0, "input_args", [1], max=1.0, max_finite=0.0, min_finite=-0.0))
    table = _table(rows)
    text = _live_text([table], tmp_path)
    assert text == _reference(table)
    assert text.count('"Max": -0.0') == 2 and text.count('"Max": 0.0') == 2


def test_debug_save_parameters_grad_and_deep_paths(tmp_path):
    rows = [
        _call(0, S.MODULE_FORWARD, "Module.fc.Linear.forward.0"),
        _tensor(0, "parameters", ["weight"]),
        _tensor(0, "input_args", [0, 1, "k", 2]),       # list in list, dict key, deeper than one
        _tensor(0, "input_kwargs", ["x", "y"]),
        _call(1, S.PARAMETERS_GRAD, "Module.fc.Linear.parameters_grad"),
        _tensor(1, "weight", [0], requires_grad=None),
        _call(2, S.DEBUG_SAVE, "x.0.debug"),
        _tensor(2, "", []),                              # the whole entry is one record
        _call(3, S.DEBUG_SAVE, "y.0.debug"),
        _tensor(3, "", [1], dtype="torch.bool", max=0.0, min=0.0),
        _call(4, S.DEBUG_SAVE, "z.0.debug"),
        _tensor(4, "", ["a", 0]),
    ]
    table = _table(rows)
    data = entry_values(*build_entries(table))
    assert data["Module.fc.Linear.parameters_grad"] == {
        "weight": [_plain(("torch.Tensor", "torch.float32", (2, 3), 1.5, -0.5, 0.25, 2.0, None, None, None,
                           None, None))],
        "bias": [None],
    }
    assert data["x.0.debug"]["shape"] == [2, 3] and data["y.0.debug"][0] is None
    assert data["y.0.debug"][1]["Max"] is False
    assert data["Module.fc.Linear.forward.0"]["input_args"][0][1]["k"][2]["Mean"] == 0.25
    text = _live_text([table.slice(0, 4), table.slice(4, 2), table.slice(6)], tmp_path)
    assert text == _reference(table)
    export_debug(table, META, tmp_path / "debug")
    assert (tmp_path / "debug/debug.json").read_text() == _reference(table, "debug")


def test_paths_through_a_record_turn_it_into_its_dict(tmp_path):
    """A later leaf whose path goes through a tensor record (or an empty path above one)
    extends the record's dict, as when records were built as dicts."""
    rows = [
        _call(0, S.API_FORWARD, "Torch.f.0.forward"),
        _tensor(0, "output", [0]),
        _leaf(0, "output", [0, "extra"], S.LEAF_VALUE, value_json="7"),
        _tensor(0, "input_args", []),
        _leaf(0, "input_args", [1], S.LEAF_NONE),
        _call(1, S.DEBUG_SAVE, "d.0.debug"),
        _tensor(1, "", []),
        _tensor(1, "", [0, "k"]),
    ]
    table = _table(rows)
    data = entry_values(*build_entries(table))
    assert data["Torch.f.0.forward"]["output"][0] == {
        "type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3], "Max": 1.5, "Min": -0.5,
        "Mean": 0.25, "Norm": 2.0, "requires_grad": True, "extra": 7,
    }
    assert data["Torch.f.0.forward"]["input_args"]["1"] is None
    assert data["d.0.debug"]["0"]["k"]["Max"] == 1.5
    assert _live_text([table], tmp_path) == _reference(table)


def test_entries_touched_again_by_a_later_part(tmp_path):
    """Late rows (a backward call of an existing name, its leaves replacing and extending
    values; a leaf row of an earlier call, which makes the exporter rebuild) re-encode the
    entries they touch."""
    first = [
        _call(0, S.API_BACKWARD, "Torch.add.0.backward", keys=["input"]),
        _tensor(0, "input", [0]),
        _call(1, S.API_FORWARD, "Torch.sub.0.forward"),
        _tensor(1, "output", [0], max=3.0),
    ]
    second = [
        _call(2, S.API_BACKWARD, "Torch.add.0.backward", keys=["input", "output"]),
        _tensor(2, "input", [0], max=9.0, requires_grad=None),
        _tensor(2, "output", [1], dtype="torch.bool", max=1.0, min=1.0),
    ]
    late = [_tensor(1, "output", [1], max=4.0)]  # seq 1 again: out of order
    all_rows = _table(first + second + late)
    parts = [_table(first), _table(second), _table(late)]
    assert _live_text(parts, tmp_path / "live") == _reference(all_rows)
    export_step(all_rows, {}, META, tmp_path / "offline")
    assert (tmp_path / "offline/dump.json").read_text() == _reference(all_rows)


def test_dump_text_without_chunks_and_top_level_structure():
    rows = [_call(0, S.API_FORWARD, "Torch.add.0.forward"), _tensor(0, "output", [0])]
    order, entries = build_entries(_table(rows))
    expected = _reference(_table(rows))
    assert _dump_text(META, "mix", order, entries, None) == expected
    chunks: dict = {}
    assert _dump_text(META, "mix", order, entries, chunks) == expected
    assert _dump_text(META, "mix", order, entries, chunks) == expected  # from the cached pieces
    assert set(chunks) == {"Torch.add.0.forward"}


def test_encoder_refuses_what_is_not_a_record_or_plain_json():
    encode = records_encoder()
    with pytest.raises(_NotPlainJson):
        encode([("too", "short")], "", [])
    with pytest.raises(_NotPlainJson):
        encode({1: "int key"}, "", [])
    out: list = []
    record = ("torch.Tensor", "torch.int64", (2,), 3, 1, 2, 4, None, None, None, None, None)  # ints
    encode([record], "", out)
    assert "".join(out) == json.dumps([_tensor_record(*record)], indent=1)
    # dumps_indent1 keeps json.dumps's meaning of a tuple (a list)
    assert dumps_indent1({"t": (1, 2.5)}) == json.dumps({"t": (1, 2.5)}, indent=1)


# --- any rows ---------------------------------------------------------------------------------
_FLOATS = (st.none() | st.floats(allow_nan=True, allow_infinity=True)
           | st.sampled_from([0.0, -0.0, SUBNORMAL, -SUBNORMAL, HUGE, -HUGE, 1e16, 1e-7, 0.1]))
_PATH_PART = st.integers(0, 2) | st.sampled_from(["a", "b", "é"])
_LEAF_KINDS = st.sampled_from([S.LEAF_TENSOR] * 4 + [S.LEAF_VALUE, S.LEAF_NONE, S.LEAF_EMPTY_LIST,
                                                     S.LEAF_EMPTY_DICT])
_VALUE_JSON = st.sampled_from(['{"type": "int", "value": 3}', "null", "[1, 2.5]", '"s"', "1e400", '{"x": []}'])


@st.composite
def _leaf_rows(draw, seq: int, kind: str) -> list[dict]:
    ios = [""] if kind == S.DEBUG_SAVE else _KEYS[kind] + ["extra"]
    rows = []
    for _ in range(draw(st.integers(0, 4))):
        io = draw(st.sampled_from(ios))
        path = draw(st.lists(_PATH_PART, min_size=0 if kind == S.DEBUG_SAVE else 1, max_size=3))
        leaf_kind = draw(_LEAF_KINDS)
        fields = {}
        if leaf_kind == S.LEAF_TENSOR:
            fields = dict(
                type=draw(st.sampled_from(["torch.Tensor", "torch.nn.parameter.Parameter", None])),
                dtype=draw(st.sampled_from(["torch.float32", "torch.bool", "bool", "Bool", "torch.int8", None])),
                shape=draw(st.none() | st.lists(st.integers(0, 2**40), max_size=4)),
                max=draw(_FLOATS), min=draw(_FLOATS), mean=draw(_FLOATS), norm=draw(_FLOATS),
                requires_grad=draw(st.none() | st.booleans()),
                max_finite=draw(_FLOATS), min_finite=draw(_FLOATS),
                crc32=draw(st.none() | st.sampled_from(["00000000", "8e0be875"])),
                data_name=draw(st.none() | st.sampled_from(["a.pt", "Torch.x.0.forward.output.0.pt", 'q"\\\n.pt'])),
            )
        elif leaf_kind == S.LEAF_VALUE:
            fields = dict(value_json=draw(_VALUE_JSON))
        rows.append(_leaf(seq, io, path, leaf_kind, **fields))
    return rows


@st.composite
def _steps(draw) -> tuple[list[list[dict]], list[dict]]:
    """Parts of one step's rows in seq order (sometimes with a late leaf row of an earlier
    call), and all rows."""
    parts: list[list[dict]] = []
    rows: list[dict] = []
    seq = 0
    for _ in range(draw(st.integers(1, 4))):
        part: list[dict] = []
        for _ in range(draw(st.integers(0, 4))):
            kind = draw(st.sampled_from(list(_KEYS)))
            name = draw(st.sampled_from(["Torch.a.0", "Module.m.M", "Torch.b.1"])) + "." + kind
            if kind == S.PARAMETERS_GRAD:
                name = "Module.m.M.parameters_grad"
            elif kind == S.MODULE_FORWARD:
                name = "Module.m.M.forward.0"
            part.append(_call(seq, kind, name, is_recompute=draw(st.none() | st.booleans())))
            part += draw(_leaf_rows(seq, kind))
            seq += 1
        if seq and draw(st.integers(0, 5)) == 0:
            part += draw(_leaf_rows(draw(st.integers(0, seq - 1)), S.API_FORWARD))
        parts.append(part)
        rows += part
    return parts, rows


def _plain_record(row: dict) -> dict:
    """A tensor leaf row's dump.json record by spec 3.3, written out (a dict from the start)."""
    record = {"type": row.get("type"), "dtype": row.get("dtype"), "shape": row.get("shape")}
    if row.get("dtype") in ("torch.bool", "Bool", "bool"):
        record["Max"] = None if row.get("max") is None else bool(row["max"])
        record["Min"] = None if row.get("min") is None else bool(row["min"])
        record["Mean"] = record["Norm"] = None
    else:
        record.update(Max=row.get("max"), Min=row.get("min"), Mean=row.get("mean"), Norm=row.get("norm"))
    for column, key in (("requires_grad", "requires_grad"), ("max_finite", "Max_except_inf_nan"),
                        ("min_finite", "Min_except_inf_nan"), ("crc32", "md5"), ("data_name", "data_name")):
        if row.get(column) is not None:
            record[key] = row[column]
    return record


def _expected_values(rows: list[dict]) -> dict:
    """entry_values as the dict-record builder gave them: rows stably sorted by seq, calls
    first; leaves placed by path (store.entries._put over plain dicts)."""
    entries: dict = {}
    of_seq: dict = {}
    for call in sorted((r for r in rows if r["row"] == S.ROW_CALL), key=lambda r: r["seq"]):
        entry = entries.setdefault(call["name"], {"kind": call["kind"], "keys": [], "is_recompute": None, "values": {}})
        entry["keys"] += [key for key in json.loads(call["keys"]) if key not in entry["keys"]]
        if entry["is_recompute"] is None:
            entry["is_recompute"] = call.get("is_recompute")
        of_seq[call["seq"]] = entry
    for leaf in sorted((r for r in rows if r["row"] == S.ROW_LEAF), key=lambda r: r["seq"]):
        entry = of_seq.get(leaf["seq"])
        if entry is None:
            continue
        kind = leaf["leaf_kind"]
        value = (_plain_record(leaf) if kind == S.LEAF_TENSOR else json.loads(leaf["value_json"])
                 if kind == S.LEAF_VALUE else [] if kind == S.LEAF_EMPTY_LIST else {}
                 if kind == S.LEAF_EMPTY_DICT else None)
        io = leaf["io"] or ""
        entry["values"][io] = _put(entry["values"].get(io), json.loads(leaf["path"]), value)
    values = {}
    for name, entry in entries.items():
        if entry["kind"] == S.DEBUG_SAVE:
            values[name] = entry["values"].get("")
            continue
        values[name] = {
            key: entry["is_recompute"] if key == "is_recompute" else entry["values"][key]
            if key in entry["values"] else {} if key in S.DICT_ROOTS else [None]
            if entry["kind"] == S.PARAMETERS_GRAD else []
            for key in entry["keys"]
        }
    return values


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(step=_steps())
def test_live_text_equals_json_dumps_of_entry_values(tmp_path_factory, step):
    parts, rows = step
    table = _table(rows)
    expected = _reference(table)
    out = tmp_path_factory.mktemp("live")
    assert _live_text([_table(part) for part in parts if part], out) == expected if rows else True
    order, entries = build_entries(table)
    assert _dump_text(META, "mix", order, entries, None) == expected
    values = entry_values(order, entries)
    assert not _has_tuple(values)
    plain = _expected_values(rows)  # what entry_values gave before records were tuples
    assert sorted(values) == sorted(plain)
    for name in values:  # json text: NaN equals NaN, -0.0 differs from 0.0, key order counts
        assert json.dumps(values[name]) == json.dumps(plain[name])
    export_debug(table, META, out / "debug")
    assert (out / "debug/debug.json").read_text() == _reference(table, "debug")
