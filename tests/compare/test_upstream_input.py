"""Upstream-layout input: the streaming dump.json importer and comparisons of hand-written
dump.json files whose answers are computed here with numpy."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import msprobe.compare as C
from msprobe.compare import dumpjson
from msprobe.compare.errors import CompareInputError


def rec(values, dtype="torch.float32") -> dict:
    a = np.asarray(values, dtype=np.float64)
    return {"type": "torch.Tensor", "dtype": dtype, "shape": list(a.shape), "Max": float(a.max()),
            "Min": float(a.min()), "Mean": float(a.mean()), "Norm": float(np.sqrt((a * a).sum())),
            "requires_grad": False}


def write_dump(root: Path, data: dict, step: int = 0, rank: str = "rank") -> Path:
    d = root / f"step{step}" / rank
    d.mkdir(parents=True, exist_ok=True)
    (d / "dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch",
                                             "dump_data_dir": None, "data": data}, indent=1))
    (d / "stack.json").write_text(json.dumps({name: [f"File user.py, line {i + 1}, in f, \n y = op{i}(x)"]
                                              for i, name in enumerate(data) if name.endswith("forward")}))
    (d / "construct.json").write_text("{}")
    return root


def relu_entry(x, y, **kwargs):
    return {"input_args": [rec(x)], "input_kwargs": kwargs, "output": [rec(y)]}


X = [1.0, -1.0, 2.0, -2.0]


def test_statistics_error_worked_example(tmp_path):
    n = np.array([1.0, -1.0, 2.002, -2.0])
    b = np.array(X)
    base = write_dump(tmp_path / "b", {"Functional.neg.0.forward": relu_entry(X, b),
                                       "Functional.abs.0.forward": relu_entry(b, np.abs(b))})
    target = write_dump(tmp_path / "t", {"Functional.neg.0.forward": relu_entry(X, n),
                                         "Functional.abs.0.forward": relu_entry(n, np.abs(n))})
    r = C.compare(target, base)
    s, rms, norm_b = 2.0, math.sqrt(10) / 2, math.sqrt(10)
    expected = max(abs(n.max() - b.max()) / s, abs(n.min() - b.min()) / s,
                   abs(n.mean() - b.mean()) / rms, abs(np.linalg.norm(n) - norm_b) / norm_b)
    assert expected == pytest.approx(0.001)
    (e,), = r.con.sql("SELECT e FROM tensors WHERE t_call = 'Functional.neg.0.forward' AND io = 'output'").fetchall()
    assert e == pytest.approx(expected, rel=1e-9)
    (diff, rel_pct), = r.con.sql("SELECT max_diff, max_rel_pct FROM tensors WHERE t_call = 'Functional.neg.0.forward' "
                                 "AND io = 'output'").fetchall()
    assert diff == pytest.approx(0.002) and rel_pct == pytest.approx(0.1)
    first = r.first[0]
    assert first["name"] == "Functional.neg.0.forward"
    assert first["stack"] == ["File user.py, line 1, in f, \n y = op0(x)"]
    assert r.summary["verdict"] == "diverged" and r.exit_code == 1
    verdicts = dict(r.con.sql("SELECT t_name, verdict FROM calls").fetchall())
    assert verdicts == {"Functional.neg.0.forward": "origin", "Functional.abs.0.forward": "propagated"}


def test_argument_value_and_nonfinite_origins(tmp_path):
    base = write_dump(tmp_path / "b", {"Torch.sum.0.forward": relu_entry(X, [0.0], dim={"type": "int", "value": 1}),
                                       "Torch.log.0.forward": relu_entry(X, [1.0, 2.0])})
    target = write_dump(tmp_path / "t", {"Torch.sum.0.forward": relu_entry(X, [0.0], dim={"type": "int", "value": 0}),
                                         "Torch.log.0.forward": relu_entry(X, [1.0, float("nan")])})
    r = C.compare(target, base)
    rows = dict((n, (v, reason)) for n, v, reason in r.con.sql("SELECT t_name, verdict, reason FROM calls").fetchall())
    assert rows["Torch.sum.0.forward"] == ("origin", "argument value differs")
    assert rows["Torch.log.0.forward"][0] == "origin" and rows["Torch.log.0.forward"][1].startswith("nonfinite output")


def test_ours_against_its_own_export_is_identical(runs):
    r = C.compare(runs["same"], Path(runs["base"]) / "step0" / "rank" / "dump.json")
    assert r.summary["verdict"] == "identical"
    assert r.summary["ranks"][0]["counts"]["unpaired"] == 0
    r = C.compare(runs["gelu"], runs["base"] / "step0")
    assert r.first[0]["name"] == "Functional.gelu.0.forward"


def test_streaming_across_chunk_boundaries(tmp_path, monkeypatch):
    base = write_dump(tmp_path / "b", {f"Functional.relu.{i}.forward": relu_entry(X, [1.5, float("inf")])
                                       for i in range(5)})
    file = base / "step0" / "rank" / "dump.json"
    whole = list(dumpjson.iter_entries(file))
    monkeypatch.setattr(dumpjson, "_CHUNK", 7)
    assert list(dumpjson.iter_entries(file)) == whole
    assert whole[0] == ("header", {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None})
    assert [name for name, _ in whole[1:]] == [f"Functional.relu.{i}.forward" for i in range(5)]
    assert whole[1][1]["output"][0]["Max"] == math.inf


def test_bad_dump_json(tmp_path):
    good = write_dump(tmp_path / "g", {"Functional.relu.0.forward": relu_entry(X, X)})
    text = (good / "step0" / "rank" / "dump.json").read_text()
    cut = tmp_path / "cut.json"
    cut.write_text(text[:150])
    with pytest.raises(CompareInputError, match=r"cut.json: truncated dump.json at byte 1[0-9][0-9]"):
        C.compare(cut, good)
    bad = tmp_path / "bad.json"
    bad.write_text(text.replace('"input_args": [', '"input_args": [}', 1))
    with pytest.raises(CompareInputError, match=r"bad.json: malformed dump.json at byte \d+"):
        C.compare(bad, good)
    empty = tmp_path / "empty.json"
    empty.write_text("")
    with pytest.raises(CompareInputError, match="empty dump.json"):
        C.compare(empty, good)
    nodata = tmp_path / "nodata.json"
    nodata.write_text('{"task": "statistics"}')
    with pytest.raises(CompareInputError, match="field 'data' missing"):
        C.compare(nodata, good)
    zero = tmp_path / "zero.json"
    zero.write_text('{"task": "statistics", "data": {}}')
    with pytest.raises(CompareInputError, match=r"empty dump \(0 entries\)"):
        C.compare(zero, good)


def test_entry_kinds():
    assert dumpjson.entry_kind("Functional.linear.0.forward") == "api_forward"
    assert dumpjson.entry_kind("Tensor.__add__.1.backward") == "api_backward"
    assert dumpjson.entry_kind("Module.fc.Linear.forward.0") == "module_forward"
    assert dumpjson.entry_kind("Cell.head.Dense.backward.2") == "module_backward"
    assert dumpjson.entry_kind("Module.fc.Linear.parameters_grad") == "parameters_grad"
    assert dumpjson.entry_kind("y.0") == "debug_save"


def test_leaves_pair_by_unique_shape_when_paths_differ(tmp_path):
    # upstream linear backward output order: [grad_bias [4], grad_input [2, 8], grad_weight [4, 8]];
    # ours: [grad_input [2, 8], grad_weight [4, 8], grad_bias [4]] (spec section 9, fix 3)
    gi, gw, gb = np.full((2, 8), 0.5), np.full((4, 8), 0.25), np.array([1.0, 2.0, 3.0, 4.0])
    fwd = {"input_args": [rec(np.ones((2, 8)))], "input_kwargs": {}, "output": [rec(np.ones((2, 4)))]}
    up = {"Functional.linear.0.forward": fwd,
          "Functional.linear.0.backward": {"input": [rec(np.ones((2, 4)))], "output": [rec(gb), rec(gi), rec(gw)]}}
    ours = {"Functional.linear.0.forward": fwd,
            "Functional.linear.0.backward": {"input": [rec(np.ones((2, 4)))], "output": [rec(gi), rec(gw), rec(gb)]}}
    r = C.compare(write_dump(tmp_path / "t", ours), write_dump(tmp_path / "b", up))
    rows = r.con.sql("SELECT arg, b_arg, verdict FROM tensors WHERE t_call = 'Functional.linear.0.backward' "
                     "AND io = 'output' ORDER BY arg").fetchall()
    assert rows == [("0", "1", "identical"), ("1", "2", "identical"), ("2", "0", "identical")]
    assert r.summary["verdict"] == "identical"
