"""Level debug and PrecisionDebugger.save: debug.json names and records, call counting,
gradients checked against torch.autograd.grad, tensor files per spec 2.2 with fix 15."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from msprobe.core.errors import ConfigError
from msprobe.pytorch import PrecisionDebugger


def np_rec(t):
    a = t.detach().to(torch.float64).numpy()
    return {"Max": float(a.max()), "Min": float(a.min()), "Mean": float(a.mean()),
            "Norm": float(np.sqrt((a * a).sum()))}


def check(rec, t):
    assert rec["type"] == "torch.Tensor" and rec["dtype"] == str(t.dtype) and rec["shape"] == list(t.shape)
    exp = np_rec(t)
    assert rec["Max"] == exp["Max"] and rec["Min"] == exp["Min"]
    assert rec["Mean"] == pytest.approx(exp["Mean"], rel=1e-6) and rec["Norm"] == pytest.approx(exp["Norm"], rel=1e-6)


def run(tmp_path, task):
    torch.manual_seed(0)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="debug", task=task)
    assert (tmp_path / "rank" / "debug.json").exists()  # created at construction
    w = torch.randn(3, 3, requires_grad=True)
    x = torch.randn(2, 3)
    y = x @ w
    z = y.relu()
    const = torch.ones(2)
    dbg.start()                      # no-op at level debug
    PrecisionDebugger.save(y, "y")
    PrecisionDebugger.save({"k1": z, "k2": [y * 2, 3], "s": "text"}, "nested")
    PrecisionDebugger.save(y, "y", save_backward=False)      # second call: y.1
    PrecisionDebugger.save((1.5, None, True), "tup")
    PrecisionDebugger.save(const, "const")
    loss = (z.sum() + y.sum() * 0.5)
    gy, gz = torch.autograd.grad(loss, [y, z], retain_graph=True)
    loss.backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    return json.loads((tmp_path / "rank" / "debug.json").read_text()), (y, z, gy, gz, const)


def test_debug_json_statistics(tmp_path):
    doc, (y, z, gy, gz, const) = run(tmp_path, "statistics")
    assert {k: doc[k] for k in ("task", "level", "framework", "dump_data_dir")} == {
        "task": "statistics", "level": "debug", "framework": "pytorch", "dump_data_dir": None}
    data = doc["data"]
    assert list(data) == ["y.0", "y_grad.0", "nested.0", "nested_grad.0", "y.1", "tup.0", "tup_grad.0",
                          "const.0", "const_grad.0"]
    check(data["y.0"], y)
    check(data["y.1"], y)
    check(data["y_grad.0"], gy)           # d loss / d y = 0.5 + relu'(y)
    check(data["nested.0"]["k1"], z)
    check(data["nested.0"]["k2"][0], y * 2)
    assert data["nested.0"]["k2"][1] == {"type": "int", "value": 3}
    assert data["nested.0"]["s"] == {"type": "str", "value": "text"}
    check(data["nested_grad.0"]["k1"], gz)
    # y*2 is not on the loss path: its gradient slot stays null; non-tensors are null
    assert data["nested_grad.0"]["k2"] == [None, None] and data["nested_grad.0"]["s"] is None
    assert data["tup.0"] == [{"type": "float", "value": 1.5}, None, {"type": "bool", "value": True}]
    assert data["tup_grad.0"] == [None, None, None]
    assert data["const_grad.0"] is None   # const needs no grad
    assert not (tmp_path / "step0").exists()


def test_debug_tensor_files(tmp_path):
    doc, (y, z, gy, gz, const) = run(tmp_path, "tensor")
    tdir = tmp_path / "rank" / "dump_tensor_data"
    assert doc["dump_data_dir"] == str(tdir)
    data = doc["data"]
    expected = {"y.0.tensor.pt": y, "y_grad.0.tensor.pt": gy, "y.1.tensor.pt": y,
                "nested.0.tensor.k1.pt": z, "nested.0.tensor.k2.0.pt": y * 2, "nested_grad.0.tensor.k1.pt": gz,
                "const.0.tensor.pt": const}
    assert sorted(p.name for p in tdir.iterdir()) == sorted(expected)
    for name, t in expected.items():
        assert torch.equal(torch.load(tdir / name, weights_only=True), t.detach()), name
    assert data["y.0"]["data_name"] == "y.0.tensor.pt"
    assert data["nested_grad.0"]["k1"]["data_name"] == "nested_grad.0.tensor.k1.pt"


def test_save_outside_debug_level_is_noop_and_bad_args(tmp_path, caplog):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "a"), level="L1")
    PrecisionDebugger.save(torch.ones(1), "x")   # level L1: nothing
    dbg.close()
    assert not (tmp_path / "a" / "rank").exists()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "b"), level="debug")
    with pytest.raises(ConfigError, match="`name`"):
        PrecisionDebugger.save(torch.ones(1), 3)
    with pytest.raises(ConfigError, match="`save_backward`"):
        PrecisionDebugger.save(torch.ones(1), "x", save_backward="yes")
    PrecisionDebugger.save({1, 2}, "aset")      # unsupported type: warning, skipped
    dbg.close()
    assert "aset" in caplog.text
    assert json.loads((tmp_path / "b" / "rank" / "debug.json").read_text())["data"] == {}


def test_export_rebuilds_debug_layout(tmp_path):
    import shutil

    from msprobe.cli import main as cli_main

    doc, _ = run(tmp_path, "tensor")
    tdir = tmp_path / "rank" / "dump_tensor_data"
    before = {p.name: torch.load(p, weights_only=True) for p in tdir.iterdir()}
    shutil.rmtree(tmp_path / "rank")
    assert cli_main(["export", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "rank" / "debug.json").read_text()) == doc
    after = {p.name: torch.load(p, weights_only=True) for p in tdir.iterdir()}
    assert set(after) == set(before) and all(torch.equal(after[k], before[k]) for k in before)
