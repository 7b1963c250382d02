"""Tensor files whose names collide after sanitising, or whose leaf is recorded again in
the same step: every record's ``data_name`` names a file that holds that record's own
tensor, in every recorded place (debug save gradients, parameter gradients, entries of
different modules), live and after ``msprobe export``. Values are checked against
tensors computed here, independently of msprobe."""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os

import torch

from pt_helpers import assert_record
from msprobe.cli import main as cli_main
from msprobe.pytorch import PrecisionDebugger


def _file(dir_, name):
    return torch.load(os.path.join(dir_, "dump_tensor_data", name), weights_only=True)


def _tree(root):
    out = {}
    for d, _, fs in os.walk(root):
        if ".msprobe" in d:
            continue
        for f in fs:
            p = os.path.join(d, f)
            out[os.path.relpath(p, root)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def _assert_export_same(dump, tmp_path):
    out = tmp_path / "re"
    assert cli_main(["export", str(dump), "-o", str(out)]) == 0
    assert _tree(dump) == _tree(out)


def test_save_grad_files_of_sanitised_keys_are_distinct(tmp_path):
    """``d_grad.0``'s leaves arrive one by one (one hook per tensor): "a/b" and "a_b" both
    sanitise to ``a_b``; before, both records named ``d_grad.0.tensor.a_b.pt``, which held
    whichever gradient came last."""
    x = torch.full((2,), 1.0, requires_grad=True)
    y = torch.full((2,), 2.0, requires_grad=True)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="debug", task="tensor")
    PrecisionDebugger.save({"a/b": x, "a_b": y}, "d")
    (3 * x.sum() + 4 * y.sum()).backward()  # y's gradient arrives first
    dbg.close()
    rank = tmp_path / "d" / "rank"
    data = json.loads((rank / "debug.json").read_text())["data"]
    fwd, grad = data["d.0"], data["d_grad.0"]
    assert fwd["a/b"]["data_name"] == "d.0.tensor.a_b.pt" and fwd["a_b"]["data_name"] == "d.0.tensor.a_b-2.pt"
    # named like the saved tensors' files, whichever gradient arrives first
    assert grad["a/b"]["data_name"] == "d_grad.0.tensor.a_b.pt"
    assert grad["a_b"]["data_name"] == "d_grad.0.tensor.a_b-2.pt"
    for key, t, g in (("a/b", x, 3.0), ("a_b", y, 4.0)):
        assert torch.equal(_file(rank, fwd[key]["data_name"]), t.detach())
        assert_record(grad[key], torch.full((2,), g))
        assert torch.equal(_file(rank, grad[key]["data_name"]), torch.full((2,), g))
    _assert_export_same(tmp_path / "d", tmp_path)


class TwoParams(torch.nn.Module):
    """Parameter names "a/b" and "a_b" (``register_parameter`` forbids only ``.``)."""

    def __init__(self):
        super().__init__()
        self.register_parameter("a/b", torch.nn.Parameter(torch.full((2,), 1.0)))
        self.register_parameter("a_b", torch.nn.Parameter(torch.full((2,), 2.0)))
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, x):
        return self.lin(x * getattr(self, "a/b") + 3 * x * self.a_b)


def test_parameters_grad_files_of_sanitised_names_are_distinct(tmp_path):
    m = TwoParams()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0", task="tensor")
    dbg.start(model=torch.nn.Sequential(m))  # the root module is not recorded
    x = torch.tensor([1.0, 2.0])
    m(x).sum().backward()
    dbg.stop()
    dbg.close()
    step = tmp_path / "d" / "step0" / "rank"
    rec = json.loads((step / "dump.json").read_text())["data"]["Module.0.TwoParams.parameters_grad"]
    names = [rec["a/b"][0]["data_name"], rec["a_b"][0]["data_name"]]
    assert len(set(names)) == 2
    gsum = m.lin.weight.detach().sum(0)  # d(sum(lin(h)))/dh
    for key, g in (("a/b", gsum * x), ("a_b", 3 * gsum * x)):
        assert_record(rec[key][0], g)
        assert torch.equal(_file(step, rec[key][0]["data_name"]), getattr(m, key).grad)
    _assert_export_same(tmp_path / "d", tmp_path)


class Heads(torch.nn.Module):
    """Two submodules whose entry names differ only in "/" vs "_" (ModuleDict keys)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.heads = torch.nn.ModuleDict({"x/y": torch.nn.Linear(2, 2), "x_y": torch.nn.Linear(2, 2)})

    def forward(self, x):
        return self.heads["x/y"](x) + 2 * self.heads["x_y"](x + 1)


def test_entries_of_sanitised_module_names_have_their_own_files(tmp_path):
    """Entries ``Module.heads.x/y.Linear.*`` and ``Module.heads.x_y.Linear.*`` sanitise to
    the same file names; before, each file held one module's tensor for both records."""
    m = Heads()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0", task="tensor")
    dbg.start(model=m)
    x = torch.tensor([1.0, -2.0])
    m(x).sum().backward()
    dbg.stop()
    dbg.close()
    step = tmp_path / "d" / "step0" / "rank"
    data = json.loads((step / "dump.json").read_text())["data"]
    names = []
    for key, inp, scale in (("x/y", x, 1.0), ("x_y", x + 1, 2.0)):
        lin = m.heads[key]
        fwd = data[f"Module.heads.{key}.Linear.forward.0"]
        expected = {
            fwd["input_args"][0]["data_name"]: inp,
            fwd["output"][0]["data_name"]: (lin.weight @ inp + lin.bias).detach(),
            fwd["parameters"]["weight"]["data_name"]: lin.weight.detach(),
            fwd["parameters"]["bias"]["data_name"]: lin.bias.detach(),
        }
        pg = data[f"Module.heads.{key}.Linear.parameters_grad"]
        expected[pg["weight"][0]["data_name"]] = scale * torch.ones(2, 1) * inp
        expected[pg["bias"][0]["data_name"]] = torch.full((2,), scale)
        bwd = data[f"Module.heads.{key}.Linear.backward.0"]
        expected[bwd["input"][0]["data_name"]] = torch.full((2,), scale)
        for name, t in expected.items():
            assert torch.equal(_file(step, name), t), (key, name)
        names += list(expected)
    assert len(set(names)) == len(names) == 14
    _assert_export_same(tmp_path / "d", tmp_path)


def test_accumulated_parameter_gradient_file_holds_the_recorded_value(tmp_path):
    """Two backward passes in one step: the ``parameters_grad`` record holds the
    accumulated gradient (the second pass replaces the first record); its file must too.
    Before, the file kept the first pass's gradient."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(2, 1)
    m = torch.nn.Sequential(lin)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0", task="tensor")
    dbg.start(model=m)
    x = torch.tensor([1.0, -2.0])
    m(x).sum().backward()
    dbg.stop()  # a live export in between: the first gradient's file is written here
    dbg.start(model=m)
    (3 * m(x)).sum().backward()
    dbg.stop()
    dbg.close()
    step = tmp_path / "d" / "step0" / "rank"
    rec = json.loads((step / "dump.json").read_text())["data"]["Module.0.Linear.parameters_grad"]
    assert_record(rec["weight"][0], 4 * x.reshape(1, 2))
    assert_record(rec["bias"][0], torch.tensor([4.0]))
    assert torch.equal(_file(step, rec["weight"][0]["data_name"]), 4 * x.reshape(1, 2))
    assert torch.equal(_file(step, rec["bias"][0]["data_name"]), torch.tensor([4.0]))
    _assert_export_same(tmp_path / "d", tmp_path)


class DictIn(torch.nn.Module):
    def forward(self, opts):
        return sum(v.sum() for v in opts.values())


def test_key_ending_in_a_dot_keeps_the_pt_extension(tmp_path):
    """A dict key ending in ``.`` (and any long non-str key, cut to ``...``) gave names such
    as ``...input.0.v__pt``: ``..pt`` was sanitised to ``__pt``, losing the extension."""

    class LongKey:
        def __str__(self):
            return "k" * 400

    key = LongKey()
    ts = {"v.": torch.full((2,), 1.0), key: torch.full((2,), 2.0)}
    m = torch.nn.Sequential(DictIn())
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0", task="tensor")
    dbg.start(model=m)
    m(ts)
    dbg.stop()
    dbg.close()
    step = tmp_path / "d" / "step0" / "rank"
    rec = json.loads((step / "dump.json").read_text())["data"]["Module.0.DictIn.forward.0"]["input_args"][0]
    assert list(rec) == ["v.", "k" * 253 + "..."]
    from store.tensor_names import tensor_file_path
    for k, t in zip(rec, ts.values()):
        name = rec[k]["data_name"]
        assert name.endswith(".pt") and ".." not in name, name
        assert torch.equal(torch.load(tensor_file_path(step / "dump_tensor_data", name), weights_only=True), t)


NT = collections.namedtuple("NT", "p q")


@dataclasses.dataclass
class DC:
    u: torch.Tensor


def test_save_grad_of_namedtuple_and_dataclass_fields(tmp_path):
    """save() records the fields of a namedtuple or dataclass like a dict's values; their
    gradients belong in ``{name}_grad`` too (before, they stayed null)."""
    p, q, u = (torch.full((2,), float(v), requires_grad=True) for v in (1, 2, 3))
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="debug")
    PrecisionDebugger.save({"nt": NT(p, q), "dc": DC(u)}, "s")
    (2 * p.sum() + 5 * q.sum() + 7 * u.sum()).backward()
    dbg.close()
    data = json.loads((tmp_path / "rank" / "debug.json").read_text())["data"]
    assert_record(data["s.0"]["nt"]["p"], p.detach())
    assert_record(data["s.0"]["dc"]["u"], u.detach())
    assert_record(data["s_grad.0"]["nt"]["p"], torch.full((2,), 2.0))
    assert_record(data["s_grad.0"]["nt"]["q"], torch.full((2,), 5.0))
    assert_record(data["s_grad.0"]["dc"]["u"], torch.full((2,), 7.0))
