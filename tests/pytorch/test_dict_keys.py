"""Dict keys with the same text (1 and "1") keep one leaf each in every recorded place:
module forward inputs/outputs, backward gradients, tensor files and save() at level debug
(msprobe.core.values.object_keys). Before, the second key's value replaced the first's."""
from __future__ import annotations

import json

import torch

from pt_helpers import assert_record, load_dump
from msprobe.pytorch import PrecisionDebugger


class DictIn(torch.nn.Module):
    """Takes {1: a, "1": b}, returns {1: 2a, "1": 3b}."""

    def forward(self, opts):
        return {1: opts[1] * 2, "1": opts["1"] * 3}


def test_module_forward_and_backward_keep_both_keys(tmp_path):
    torch.manual_seed(0)
    a = torch.randn(4, requires_grad=True)
    b = (torch.randn(4) + 5).requires_grad_()
    m = DictIn()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    dbg.start(model=m)
    out = m({1: a, "1": b})
    (out[1].sum() * 0.5 + (out["1"] ** 2).sum()).backward()
    dbg.stop()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    fwd = data["Module.model.DictIn.forward.0"]
    assert list(fwd["input_args"][0]) == ["1", "1~2"]
    assert_record(fwd["input_args"][0]["1"], a.detach())
    assert_record(fwd["input_args"][0]["1~2"], b.detach())
    assert list(fwd["output"][0]) == ["1", "1~2"]
    assert_record(fwd["output"][0]["1"], a.detach() * 2)
    assert_record(fwd["output"][0]["1~2"], b.detach() * 3)
    # backward "input": gradients w.r.t. the forward outputs, keyed like them
    bwd = data["Module.model.DictIn.backward.0"]
    assert list(bwd["input"][0]) == ["1", "1~2"]
    assert_record(bwd["input"][0]["1"], torch.full((4,), 0.5))
    assert_record(bwd["input"][0]["1~2"], 2 * (b.detach() * 3))


def test_tensor_files_of_both_keys(tmp_path):
    a, b = torch.arange(4.0), torch.arange(4.0) + 10
    m = DictIn()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix", task="tensor")
    dbg.start(model=m)
    with torch.no_grad():
        m({1: a, "1": b})
    dbg.stop()
    dbg.close()
    step = tmp_path / "d" / "step0" / "rank"
    rec = json.loads((step / "dump.json").read_text())["data"]["Module.model.DictIn.forward.0"]
    names = {k: v["data_name"] for k, v in rec["input_args"][0].items()}
    assert names == {"1": "Module.model.DictIn.forward.0.input.0.1.pt",
                     "1~2": "Module.model.DictIn.forward.0.input.0.1_2.pt"}  # file names: ~ -> _
    assert torch.equal(torch.load(step / "dump_tensor_data" / names["1"], weights_only=True), a)
    assert torch.equal(torch.load(step / "dump_tensor_data" / names["1~2"], weights_only=True), b)


def test_save_keeps_both_keys(tmp_path):
    x = torch.randn(3, requires_grad=True)
    y = (torch.randn(3) - 4).requires_grad_()
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="debug")
    PrecisionDebugger.save({"1": x, 1: y}, "d")
    (x.sum() + (y * 3).sum()).backward()
    dbg.close()
    data = json.loads((tmp_path / "rank" / "debug.json").read_text())["data"]
    assert list(data["d.0"]) == ["1", "1~2"]
    assert_record(data["d.0"]["1"], x.detach())
    assert_record(data["d.0"]["1~2"], y.detach())
    assert_record(data["d_grad.0"]["1"], torch.ones(3))
    assert_record(data["d_grad.0"]["1~2"], torch.full((3,), 3.0))


class Sanitised(torch.nn.Module):
    """Keys whose file-name forms collide: "a/b" and "a_b" both sanitise to a_b."""

    def forward(self, opts):
        return opts["a/b"] + opts["a_b"] + opts["a_b-2"]


def test_sanitised_file_names_stay_distinct(tmp_path):
    """Each leaf gets its own file (msprobe.core.naming.unique_file_names); before, the
    record of "a_b" named the file holding the tensor of "a/b"."""
    ts = {"a/b": torch.full((2,), 1.0), "a_b": torch.full((2,), 3.0), "a_b-2": torch.full((2,), 5.0)}
    m = Sanitised()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix", task="tensor")
    dbg.start(model=m)
    with torch.no_grad():
        m(ts)
    dbg.stop()
    dbg.close()
    step = tmp_path / "d" / "step0" / "rank"
    rec = json.loads((step / "dump.json").read_text())["data"]["Module.model.Sanitised.forward.0"]["input_args"][0]
    prefix = "Module.model.Sanitised.forward.0.input.0."
    # "a_b" takes the first free suffix: -2 is "a_b-2"'s own name
    assert {k: v["data_name"] for k, v in rec.items()} == {
        "a/b": prefix + "a_b.pt", "a_b": prefix + "a_b-3.pt", "a_b-2": prefix + "a_b-2.pt"}
    for key, t in ts.items():
        assert rec[key]["Max"] == float(t.max())
        assert torch.equal(torch.load(step / "dump_tensor_data" / rec[key]["data_name"], weights_only=True), t)
