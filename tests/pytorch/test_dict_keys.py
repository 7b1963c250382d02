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


class DictArg(torch.nn.Module):
    """Takes {"a": x, 1: y}; writes a new key into the caller's dict, as modules caching
    intermediate results do."""

    def forward(self, d):
        d["cache"] = d["a"] * 3
        return d["a"] * 2 + d[1] ** 2


def test_dict_argument_backward_gradients_and_callers_dict(tmp_path):
    """A dict argument's tensors get their backward gradients under the forward record's
    keys (before: backward output [null]); the module gets the caller's own dict (its new
    key reaches the caller) and the caller's tensors are back in it after the call."""
    torch.manual_seed(0)
    x = torch.randn(3, requires_grad=True)
    y = torch.randn(3, requires_grad=True)
    m = DictArg()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    dbg.start(model=m)
    d = {"a": x, 1: y}
    out = m(d)
    assert d["a"] is x and d[1] is y  # the caller's tensors back
    assert torch.equal(d["cache"], x.detach() * 3)  # the module's write reached the caller
    out.sum().backward()
    dbg.stop()
    dbg.close()
    assert torch.equal(x.grad, torch.full((3,), 2.0)) and torch.allclose(y.grad, 2 * y.detach())
    data = load_dump(tmp_path / "d")[0]["data"]
    fwd = data["Module.model.DictArg.forward.0"]
    assert list(fwd["input_args"][0]) == ["a", "1"]
    bwd = data["Module.model.DictArg.backward.0"]
    assert list(bwd["output"][0]) == ["a", "1"]
    assert_record(bwd["output"][0]["a"], torch.full((3,), 2.0))
    assert_record(bwd["output"][0]["1"], 2 * y.detach())


class _ReadOnlyDict(dict):
    def __setitem__(self, key, value):
        raise TypeError("read-only")


class SumValues(torch.nn.Module):
    def forward(self, d):
        return sum(v.sum() for v in d.values())


def test_container_refusing_writes_keeps_recording(tmp_path):
    """A dict (or list) type whose __setitem__ raises keeps the caller's tensors; recording
    goes on and the result is unchanged."""
    x = torch.ones(2, requires_grad=True)
    m = SumValues()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    dbg.start(model=m)
    out = m(_ReadOnlyDict({"a": x}))
    out.backward()
    after = torch.ones(1) * 5
    dbg.stop()
    dbg.close()
    assert not dbg.session.failed
    assert float(out.detach()) == 2.0 and torch.equal(x.grad, torch.ones(2))
    data = load_dump(tmp_path / "d")[0]["data"]
    assert_record(data["Module.model.SumValues.forward.0"]["input_args"][0]["a"], x.detach())
    assert data["Tensor.__mul__.0.forward"]["output"][0]["Max"] == float(after.max())
