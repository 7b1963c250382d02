"""store.export: hand-written expected dump.json / stack.json / construct.json."""
from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store.errors import ExportError, LogNotFoundError
from store.export import dumps_indent1, export_debug, export_log, export_step
from store.log_writer import LogWriter
from store.records import Call, Leaf, Marker


def load(path: Path):
    """Parse JSON keeping NaN/Infinity as the strings 'NaN', 'Infinity', '-Infinity'."""
    return json.loads(path.read_text(), parse_constant=lambda token: token)


def assert_same(found, expected):
    """Equal, and equal in key order too."""
    assert found == expected
    assert json.dumps(found) == json.dumps(expected)


def files_of(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".msprobe" not in p.parts
    }


EXPECTED_STEP0 = {
    "Functional.linear.0.forward": {
        "input_args": [
            {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 4], "Max": 1.5,
             "Min": -2.0, "Mean": 0.25, "Norm": 3.0, "requires_grad": True},
            {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4, 4], "Max": 0.5,
             "Min": -0.5, "Mean": 0.0, "Norm": 2.0, "requires_grad": True},
            None,
        ],
        "input_kwargs": {"scale": {"type": "float", "value": 0.5}},
        "is_recompute": False,
        "output": [
            {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 4], "Max": "NaN",
             "Min": "-Infinity", "Mean": "NaN", "Norm": "NaN", "requires_grad": True,
             "Max_except_inf_nan": 1.0, "Min_except_inf_nan": -2.0, "md5": "8e0be875"},
        ],
    },
    "Torch.cat.0.forward": {
        "input_args": [
            [
                {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [1], "Max": 1.0,
                 "Min": 1.0, "Mean": 1.0, "Norm": 1.0, "requires_grad": False},
                {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [1], "Max": 2.0,
                 "Min": 2.0, "Mean": 2.0, "Norm": 2.0, "requires_grad": False},
            ],
            [],
        ],
        "input_kwargs": {
            "dim": {"type": "int", "value": 0},
            "opts": {"k": {"type": "str", "value": "v"},
                     "lst": [{"type": "slice", "value": [None, 5, None]}]},
            "extra": {},
        },
        "is_recompute": True,
        "output": [
            {"type": "torch.Tensor", "dtype": "torch.bool", "shape": [2], "Max": True,
             "Min": False, "Mean": None, "Norm": None},
        ],
    },
    "Module.fc.Linear.forward.0": {
        "input_args": [
            {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 4], "Max": 1.5,
             "Min": -2.0, "Mean": 0.25, "Norm": 3.0, "requires_grad": True},
        ],
        "input_kwargs": {},
        "output": [
            {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 4], "Max": 3.0,
             "Min": -1.0, "Mean": 1.0, "Norm": 4.0, "requires_grad": False},
        ],
        "parameters": {
            "weight": {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4, 4],
                       "Max": 0.5, "Min": -0.5, "Mean": 0.0, "Norm": 2.0, "requires_grad": True},
            "bias": {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4],
                     "Max": 0.25, "Min": -0.25, "Mean": 0.0, "Norm": 0.5, "requires_grad": True},
        },
        "is_recompute": False,
    },
    "Module.fc.Linear.parameters_grad": {
        "weight": [
            {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4, 4], "Max": 0.3,
             "Min": -0.3, "Mean": 0.0, "Norm": 0.6, "requires_grad": False},
        ],
        "bias": [
            {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4], "Max": 0.2,
             "Min": -0.2, "Mean": 0.0, "Norm": 0.4, "requires_grad": False, "md5": "0000abcd"},
        ],
    },
    "Module.head.ReLU.forward.0": {
        "input_args": [
            {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0,
             "Min": 0.0, "Mean": 0.5, "Norm": 1.0, "requires_grad": False},
        ],
        "input_kwargs": {},
        "output": [
            {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0,
             "Min": 0.0, "Mean": 0.5, "Norm": 1.0, "requires_grad": False},
        ],
        "parameters": {},
        "is_recompute": False,
    },
    "Functional.linear.0.backward": {
        "input": [
            {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 4], "Max": 0.1,
             "Min": -0.1, "Mean": 0.0, "Norm": 0.2, "requires_grad": False},
        ],
        "output": [
            None,
            {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4, 4], "Max": 0.3,
             "Min": -0.3, "Mean": 0.0, "Norm": 0.6, "requires_grad": False},
        ],
    },
    "Module.fc.Linear.backward.0": {
        "input": [
            {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 4], "Max": 0.1,
             "Min": -0.1, "Mean": 0.0, "Norm": 0.2, "requires_grad": False},
        ],
        "output": [],
    },
    "Module.other.Lin.parameters_grad": {"w": [None]},
}

EXPECTED_STEP1 = {
    "Torch.add.0.forward": {
        "input_args": [
            {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [], "Max": -8.5,
             "Min": -8.5, "Mean": -8.5, "Norm": 8.5, "requires_grad": False},
            {"type": "int", "value": 2},
        ],
        "input_kwargs": {},
        "is_recompute": False,
        "output": [
            {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [], "Max": -6.5,
             "Min": -6.5, "Mean": -6.5, "Norm": 6.5, "requires_grad": False,
             "data_name": "Torch.add.0.forward.output.0.pt"},
        ],
    },
}


def test_export_log_writes_the_documented_layout(tmp_path, sample):
    dump = tmp_path / "dump"
    sample.write_scenario(dump)

    report = export_log(dump)

    rank0 = dump / "step0" / "rank0"
    assert report.groups == ((0, 0), (0, 1))
    assert report.skipped == ()
    assert list(report.written) == [
        rank0 / "dump.json", rank0 / "stack.json", rank0 / "construct.json",
        dump / "step1/rank0/dump.json", dump / "step1/rank0/stack.json",
        dump / "step1/rank0/construct.json",
    ]
    dump0 = load(rank0 / "dump.json")
    assert_same(dump0, {"task": "statistics", "level": "mix", "framework": "pytorch",
                        "dump_data_dir": None, "data": EXPECTED_STEP0})
    assert_same(load(rank0 / "stack.json"), {
        "Functional.linear.0.forward": list(sample.FRAMES_LINEAR),
        "Module.fc.Linear.forward.0": list(sample.FRAMES_MODULE),
        "Functional.linear.0.backward": list(sample.FRAMES_LINEAR),
    })
    assert_same(load(rank0 / "construct.json"), {
        "Functional.linear.0.forward": "Module.fc.Linear.forward.0",
        "Torch.cat.0.forward": "Module.fc.Linear.forward.0",
        "Module.fc.Linear.forward.0": None,
        "Module.head.ReLU.forward.0": None,
        "Functional.linear.0.backward": "Module.fc.Linear.backward.0",
        "Module.fc.Linear.backward.0": None,
    })
    assert_same(load(dump / "step1/rank0/dump.json")["data"], EXPECTED_STEP1)
    assert load(dump / "step1/rank0/stack.json") == {}
    assert load(dump / "step1/rank0/construct.json") == {"Torch.add.0.forward": ""}


def test_dump_json_text_is_indent_1_with_nan_tokens(tmp_path, sample):
    dump = tmp_path / "dump"
    sample.write_scenario(dump)
    export_log(dump)
    text = (dump / "step0/rank0/dump.json").read_text()
    assert text.startswith('{\n "task": "statistics",\n "level": "mix",\n')
    assert '"Max": NaN,\n' in text
    assert '"Min": -Infinity,\n' in text
    assert '"md5": "8e0be875"\n' in text


@pytest.mark.parametrize(
    "level, expected",
    [
        ("L1", {}),
        ("L0", {"Module.fc.Linear.forward.0": None, "Module.head.ReLU.forward.0": None,
                "Module.fc.Linear.backward.0": None}),
        ("debugx", {}),
    ],
)
def test_construct_by_level(tmp_path, sample, level, expected):
    meta = dict(sample.META_MIX, level=level)
    rows, stacks = _rows_of_step0(tmp_path, sample, meta)
    export_step(rows, stacks, meta, tmp_path / "out")
    assert_same(load(tmp_path / "out/construct.json"), expected)
    assert load(tmp_path / "out/dump.json")["level"] == level


def test_task_structure_keeps_data_empty(tmp_path, sample):
    meta = dict(sample.META_MIX, task="structure")
    rows, stacks = _rows_of_step0(tmp_path, sample, meta)
    export_step(rows, stacks, meta, tmp_path / "out")
    assert load(tmp_path / "out/dump.json") == {
        "task": "structure", "level": "mix", "framework": "pytorch", "dump_data_dir": None,
        "data": {},
    }
    assert len(load(tmp_path / "out/stack.json")) == 3
    assert len(load(tmp_path / "out/construct.json")) == 6


def _rows_of_step0(tmp_path, sample, meta):
    with LogWriter(tmp_path / "d", 0) as writer:
        sample.write_events(writer, sample.scenario(meta)[0])
        return writer.take_step(0), writer.stacks()


def test_only_leaf_order_within_a_seq_matters(tmp_path, sample):
    rows, stacks = _rows_of_step0(tmp_path, sample, sample.META_MIX)
    export_step(rows, stacks, sample.META_MIX, tmp_path / "a")
    seqs = rows.column("seq").to_pylist()
    # reverse the order of the calls, keep each call's leaves in order
    order = sorted(range(len(seqs)), key=lambda i: (-seqs[i], i))
    export_step(rows.take(order), stacks, sample.META_MIX, tmp_path / "b")
    assert files_of(tmp_path / "a") == files_of(tmp_path / "b")


def test_parameters_grad_follows_first_forward_of_its_module(tmp_path):
    calls = [
        Call(step=0, kind="module_forward", name="Module.a.L.forward.0", api_type="Module",
             keys=("output",)),
        Call(step=0, kind="module_forward", name="Module.b.L.forward.0", api_type="Module",
             keys=("output",)),
        Call(step=0, kind="module_forward", name="Module.a.L.forward.1", api_type="Module",
             keys=("output",)),
        Call(step=0, kind="parameters_grad", name="Module.b.L.parameters_grad", api_type="Module",
             keys=("w",), leaves=(Leaf(io="w", path=(0,), leaf_kind="none"),)),
        Call(step=0, kind="parameters_grad", name="Module.a.L.parameters_grad", api_type="Module",
             keys=("w",)),
        Call(step=0, kind="parameters_grad", name="Module.a.L.parameters_grad", api_type="Module",
             keys=("b",)),
    ]
    meta = {"task": "statistics", "level": "L0", "framework": "pytorch", "dump_data_dir": None,
            "rank_dir": "rank"}
    with LogWriter(tmp_path / "d", 0, flush_rows=2) as writer:
        for call in calls:
            writer.append(call)
        rows = writer.take_step(0)
    export_step(rows, {}, meta, tmp_path / "out")
    data = load(tmp_path / "out/dump.json")["data"]
    assert list(data) == [
        "Module.a.L.forward.0", "Module.a.L.parameters_grad", "Module.b.L.forward.0",
        "Module.b.L.parameters_grad", "Module.a.L.forward.1",
    ]
    assert data["Module.a.L.parameters_grad"] == {"w": [None], "b": [None]}
    assert data["Module.b.L.parameters_grad"] == {"w": [None]}
    assert data["Module.a.L.forward.0"] == {"output": []}


def test_debug_level_writes_rank_debug_json(tmp_path, sample):
    meta = {"task": "statistics", "level": "debug", "framework": "pytorch",
            "dump_data_dir": None, "rank_dir": "rank"}
    t = sample.tensor
    dump = tmp_path / "dump"
    with LogWriter(dump, 0) as writer:
        writer.append_marker(Marker(step=0, kind="start", meta=meta))
        writer.append(Call(step=0, kind="debug_save", name="y.0", api_type="debug", keys=("",),
                           leaves=(t("", (), shape=(2,), max=2.0, min=1.0, mean=1.5, norm=2.5),)))
        writer.append(Call(step=0, kind="debug_save", name="nested.0", api_type="debug", keys=("",),
                           leaves=(t("", ("k1",)), t("", ("k2", 0), max=4.0),
                                   Leaf(io="", path=("k3",), leaf_kind="none"))))
        writer.append(Call(step=1, kind="debug_save", name="y.1", api_type="debug", keys=("",),
                           leaves=(sample.value("", (), '{"type":"int","value":3}'),)))
        writer.append(Call(step=0, kind="debug_save", name="y_grad.0", api_type="debug", keys=("",),
                           leaves=(t("", (), max=9.0),)))
        writer.append(Call(step=1, kind="debug_save", name="empty.1", api_type="debug", keys=("",)))
        live = writer.take_step(None)
    report = export_log(dump)
    assert report.groups == ((0, -1),)
    assert not list(dump.glob("step*"))
    base = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0,
            "Min": 0.0, "Mean": 0.5, "Norm": 1.0, "requires_grad": False}
    assert_same(load(dump / "rank/debug.json"), {
        "task": "statistics", "level": "debug", "framework": "pytorch", "dump_data_dir": None,
        "data": {
            "y.0": dict(base, Max=2.0, Min=1.0, Mean=1.5, Norm=2.5),
            "nested.0": {"k1": base, "k2": [dict(base, Max=4.0)], "k3": None},
            "y.1": {"type": "int", "value": 3},
            "y_grad.0": dict(base, Max=9.0),
            "empty.1": None,
        },
    })
    export_debug(live, meta, tmp_path / "live" / "rank")
    assert (tmp_path / "live/rank/debug.json").read_bytes() == (dump / "rank/debug.json").read_bytes()


@pytest.mark.parametrize("flush_rows", [1, 3, 512])
def test_live_export_and_offline_export_are_byte_identical(tmp_path, sample, flush_rows):
    dump = tmp_path / "dump"
    live = tmp_path / "live"
    sample.write_scenario(dump, live_out=live, flush_rows=flush_rows)
    sample.write_scenario(dump, rank=1, meta=dict(sample.META_MIX, rank_dir="rank1"),
                          live_out=live, flush_rows=flush_rows)
    copy = tmp_path / "copy"
    shutil.copytree(dump / ".msprobe", copy / ".msprobe")

    report = export_log(copy, tmp_path / "offline")

    assert report.groups == ((0, 0), (0, 1), (1, 0), (1, 1))
    live_files = files_of(live)
    assert sorted(live_files) == [
        f"step{s}/rank{r}/{f}" for s in (0, 1) for r in ("0", "1")
        for f in ("construct.json", "dump.json", "stack.json")
    ]
    assert files_of(tmp_path / "offline") == live_files


def test_export_log_is_idempotent_atomic_and_private(tmp_path, sample):
    dump = tmp_path / "dump"
    sample.write_scenario(dump)
    old = os.umask(0)
    try:
        export_log(dump)
        first = files_of(dump)
        export_log(dump)
    finally:
        os.umask(old)
    assert files_of(dump) == first
    leftovers = [p for p in dump.rglob("*.tmp")]
    assert leftovers == []
    for path in (dump / "step0/rank0/dump.json", dump / "step1/rank0/stack.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o640
    for path in (dump / "step0", dump / "step0/rank0"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o750


def test_meta_comes_from_latest_marker_at_or_before_step(tmp_path, sample):
    meta0 = dict(sample.META_MIX)
    meta2 = dict(sample.META_MIX, task="tensor", dump_data_dir="./dump/step2/rank0/dump_tensor_data")
    call = Call(step=0, kind="api_forward", name="Torch.add.0.forward", api_type="Torch",
                keys=("output",))
    dump = tmp_path / "dump"
    with LogWriter(dump, 0) as writer:
        writer.append(call)  # step 0 has no marker at or before it: the earliest is used
        writer.append_marker(Marker(step=1, kind="start", meta=meta0))
        writer.append(Call(step=1, kind="api_forward", name="Torch.add.0.forward", api_type="Torch",
                           keys=("output",)))
        writer.append_marker(Marker(step=2, kind="step_end", meta=meta2))
        writer.append(Call(step=2, kind="api_forward", name="Torch.add.0.forward", api_type="Torch",
                           keys=("output",)))
        writer.append(Call(step=3, kind="api_forward", name="Torch.add.0.forward", api_type="Torch",
                           keys=("output",)))
    export_log(dump)
    tasks = {s: load(dump / f"step{s}/rank0/dump.json")["task"] for s in range(4)}
    assert tasks == {0: "statistics", 1: "statistics", 2: "tensor", 3: "tensor"}
    assert load(dump / "step3/rank0/dump.json")["dump_data_dir"] == meta2["dump_data_dir"]


def test_several_log_files_of_one_rank_keep_their_order(tmp_path):
    meta = {"task": "statistics", "level": "L1", "framework": "mindspore", "dump_data_dir": None,
            "rank_dir": "rank"}
    dump = tmp_path / "dump"

    def call(name):
        return Call(step=0, kind="api_forward", name=name, api_type="Mint", keys=("output",))

    with LogWriter(dump, 0) as first:
        first.append_marker(Marker(step=0, kind="start", meta=meta))
        first.append(call("Mint.a.0.forward"))
        first.append(call("Mint.b.0.forward"))
    with LogWriter(dump, 0) as second:
        second.append(call("Mint.c.0.forward"))
    export_log(dump)
    data = load(dump / "step0/rank/dump.json")["data"]
    assert list(data) == ["Mint.a.0.forward", "Mint.b.0.forward", "Mint.c.0.forward"]


def test_export_log_reports_torn_tail_and_keeps_the_rest(tmp_path, sample):
    dump = tmp_path / "dump"
    path = sample.write_scenario(dump, flush_rows=1)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 50])
    report = export_log(dump)
    assert len(report.skipped) == 1
    assert report.skipped[0].path == str(path)
    assert report.skipped[0].reason.startswith("truncated")
    assert report.groups == ((0, 0), (0, 1))
    assert_same(load(dump / "step0/rank0/dump.json")["data"], EXPECTED_STEP0)


def test_rank_without_marker_is_skipped(tmp_path):
    dump = tmp_path / "dump"
    with LogWriter(dump, 5) as writer:
        writer.append(Call(step=0, kind="api_forward", name="Torch.a.0.forward", api_type="Torch"))
    report = export_log(dump)
    assert report.written == ()
    assert len(report.skipped) == 1 and "rank 5: no marker" in report.skipped[0].reason


def test_export_log_without_log_raises(tmp_path):
    with pytest.raises(LogNotFoundError, match="no msprobe log found"):
        export_log(tmp_path)
    with pytest.raises(LogNotFoundError, match="does not exist"):
        export_log(tmp_path / "missing")


@pytest.mark.parametrize(
    "meta, message",
    [
        ({"task": "statistics"}, "meta: missing 'level', 'framework', 'dump_data_dir', 'rank_dir'"),
        ({"task": "s", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
          "rank_dir": "../x"}, "rank_dir: got '../x'"),
        ({"task": "s", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
          "rank_dir": ".."}, "rank_dir: got '..'"),
    ],
)
def test_export_step_rejects_bad_meta(tmp_path, meta, message):
    from store.schema import LOG_SCHEMA

    with pytest.raises(ExportError, match=message.replace("(", r"\(").replace(".", r"\.")):
        export_step(LOG_SCHEMA.empty_table(), {}, meta, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_empty_step_exports_skeleton(tmp_path, sample):
    from store.schema import LOG_SCHEMA

    files = export_step(LOG_SCHEMA.empty_table(), {}, sample.META_MIX, tmp_path / "out")
    assert [f.name for f in files] == ["dump.json", "stack.json", "construct.json"]
    assert load(tmp_path / "out/dump.json")["data"] == {}
    assert load(tmp_path / "out/stack.json") == {}
    assert load(tmp_path / "out/construct.json") == {}


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=150, deadline=None)
@given(value=_json_values)
def test_dumps_indent1_equals_json_dumps_indent_1(value):
    assert dumps_indent1(value) == json.dumps(value, indent=1)


def test_dumps_indent1_falls_back_for_other_types():
    value = {"t": (1, 2), 3: "int key", "n": [True, 2.5]}
    assert dumps_indent1(value) == json.dumps(value, indent=1)


def _step0_rows(tmp_path, sample):
    """The sample scenario's rank-0 step-0 rows in seq order, its stacks and meta; also
    writes the reference export_step output to ``tmp_path/whole``."""
    rows, stacks, meta = sample.step0_rows(tmp_path / "dump")
    export_step(rows, stacks, meta, tmp_path / "whole")
    return rows, stacks, meta


@pytest.mark.parametrize("parts", [1, 2, 5, 17])
def test_step_exporter_in_parts_equals_export_step(tmp_path, sample, parts):
    """Rows fed in seq-ordered parts, with a write after each (as stop() then step() do),
    give the bytes of one export_step over all rows; entries touched again by a later part
    (keys merged, leaves replaced) are re-encoded."""
    from store.export import StepExporter

    rows, stacks, meta = _step0_rows(tmp_path, sample)
    live = StepExporter()
    bounds = [round(i * rows.num_rows / parts) for i in range(parts + 1)]
    for lo, hi in zip(bounds, bounds[1:]):
        live.add(rows.slice(lo, hi - lo))
        live.write(stacks, meta, tmp_path / "parts")
    assert files_of(tmp_path / "parts") == files_of(tmp_path / "whole")
    assert json.loads((tmp_path / "parts/dump.json").read_text(), parse_constant=str)["data"]


def test_step_exporter_out_of_order_rebuilds(tmp_path, sample):
    from store.export import StepExporter

    rows, stacks, meta = _step0_rows(tmp_path, sample)
    half = rows.num_rows // 2
    live = StepExporter()
    live.add(rows.slice(half))
    live.write(stacks, meta, tmp_path / "parts")
    live.add(rows.slice(0, half))  # older seqs after newer ones
    live.write(stacks, meta, tmp_path / "parts")
    assert files_of(tmp_path / "parts") == files_of(tmp_path / "whole")
