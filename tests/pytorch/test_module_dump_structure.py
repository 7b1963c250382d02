"""module_dump / module_dump_end (seeds 1.6-1.7, section 9 fix 23), task structure (spec
3.1) and lists of models (spec 2.1), on networks with hand-written expected names."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

from pt_helpers import ModuleOP, load_dump
from msprobe.core.errors import ConfigError
from msprobe.pytorch import PrecisionDebugger, module_dump, module_dump_end
from test_dump_filters import Net, both, mod, pg


def test_module_dump_l1_seed_example(tmp_path):
    torch.manual_seed(0)
    debugger = PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    module = ModuleOP()
    debugger.start()
    x = torch.randn(10, 8)
    module_dump(module, "MyModuleOP")
    out = module(x)
    module_dump_end()
    loss = out.sum()
    loss.backward()
    debugger.stop()
    debugger.close()
    dump, _, _ = load_dump(tmp_path)
    data = dump["data"]
    assert set(data) == {"Module.MyModuleOP.ModuleOP.forward.0", "Module.MyModuleOP.ModuleOP.backward.0",
                         "Tensor.sum.0.forward", "Tensor.sum.0.backward"}
    fwd = data["Module.MyModuleOP.ModuleOP.forward.0"]
    assert fwd["input_args"][0]["shape"] == [10, 8] and fwd["output"][0]["shape"] == [10, 2]
    assert fwd["output"][0]["Max"] == float(out.detach().max())
    assert fwd["parameters"] == {}
    bwd = data["Module.MyModuleOP.ModuleOP.backward.0"]
    assert bwd["input"][0]["Max"] == 1.0 and bwd["output"] == [None]


def test_module_dump_mix_only_the_module_in_the_window(tmp_path):
    torch.manual_seed(0)
    net = Net()
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="mix")
    dbg.start(model=net)
    a = net.head(torch.randn(3, 4))
    module_dump(net.body, "MyBody")
    b = net.body(a)
    c = torch.add(b, 1)          # inside the window: not recorded, not counted
    module_dump_end()
    out = net.tail(c)
    out.sum().backward()
    dbg.stop()
    dbg.close()
    dump, _, construct = load_dump(tmp_path)
    assert set(dump["data"]) == (both("Functional.linear.0", "Functional.linear.1", "Tensor.sum.0")
                                 | mod("head.Linear", "MyBody.Block", "tail.Linear") | pg("head.Linear", "tail.Linear"))
    assert construct["Functional.linear.1.forward"] == "Module.tail.Linear.forward.0"
    assert dump["data"]["Module.MyBody.Block.forward.0"]["output"][0]["shape"] == [3, 4]


def test_module_dump_bad_arguments(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    with pytest.raises(ConfigError, match="`module`"):
        module_dump("not a module", "x")
    with pytest.raises(ConfigError, match="`name`"):
        module_dump(nn.Linear(2, 2), "")
    module_dump_end()  # idempotent without a window
    dbg.close()


def test_module_dump_name_is_sanitised(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1", task="tensor")
    lin = nn.Linear(2, 2)
    dbg.start()
    module_dump(lin, "../evil/name")
    lin(torch.ones(1, 2))
    module_dump_end()
    dbg.stop()
    dbg.close()
    dump, _, _ = load_dump(tmp_path)
    assert set(dump["data"]) == {"Module.___evil_name.Linear.forward.0"}
    files = sorted(f.name for f in (tmp_path / "step0" / "rank" / "dump_tensor_data").iterdir())
    assert files == ["Module.___evil_name.Linear.forward.0.input.0.pt",
                     "Module.___evil_name.Linear.forward.0.output.0.pt",
                     "Module.___evil_name.Linear.forward.0.parameters.bias.pt",
                     "Module.___evil_name.Linear.forward.0.parameters.weight.pt"]


def test_structure_task(tmp_path):
    torch.manual_seed(0)
    net = Net()
    ref = PrecisionDebugger(dump_path=str(tmp_path / "stats"), level="mix")
    ref.start(model=net)
    net(torch.randn(3, 4)).sum().backward()
    ref.stop()
    ref.close()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "struct"), level="L1", task="structure")
    assert dbg.config.level == "mix"
    dbg.start(model=net)
    net(torch.randn(3, 4)).sum().backward()
    dbg.stop()
    dbg.close()
    dump, stack, construct = load_dump(tmp_path / "struct")
    ref_dump, ref_stack, ref_construct = load_dump(tmp_path / "stats")
    assert dump["data"] == {} and dump["task"] == "structure" and dump["level"] == "mix"
    assert construct == ref_construct and len(construct) > 10
    assert set(stack) == set(ref_stack)
    assert not (tmp_path / "struct" / "step0" / "rank" / "dump_tensor_data").exists()


def test_model_list_and_tuple_names(tmp_path):
    torch.manual_seed(0)
    m0, m1 = ModuleOP(), nn.Sequential(nn.Linear(2, 2))
    for kind, models in (("list", [m0, m1]), ("tuple", (m0, m1))):
        dbg = PrecisionDebugger(dump_path=str(tmp_path / kind), level="L0")
        dbg.start(model=models)
        y = m1(m0(torch.randn(3, 8)))
        y.sum().backward()
        dbg.stop()
        dbg.close()
        dump, _, _ = load_dump(tmp_path / kind)
        assert set(dump["data"]) == {
            "Module.0.linear_1.Linear.forward.0", "Module.0.linear_1.Linear.backward.0",
            "Module.0.linear_2.Linear.forward.0", "Module.0.linear_2.Linear.backward.0",
            "Module.1.0.Linear.forward.0", "Module.1.0.Linear.backward.0",
            "Module.0.linear_1.Linear.parameters_grad", "Module.0.linear_2.Linear.parameters_grad",
            "Module.1.0.Linear.parameters_grad"}


def test_model_list_tensor_file_names(tmp_path):
    torch.manual_seed(0)
    m0 = ModuleOP()
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L0", task="tensor")
    dbg.start(model=[m0])
    m0(torch.randn(3, 8)).sum().backward()
    dbg.stop()
    dbg.close()
    tdir = tmp_path / "step0" / "rank" / "dump_tensor_data"
    w = torch.load(tdir / "Module.0.linear_1.Linear.forward.0.parameters.weight.pt", weights_only=True)
    assert torch.equal(w, m0.linear_1.weight)
    g = torch.load(tdir / "Module.0.linear_1.Linear.parameters_grad.weight.pt", weights_only=True)
    assert torch.equal(g, m0.linear_1.weight.grad)


def test_forward_backward_dump_end_warns_once(tmp_path):
    torch.manual_seed(0)
    module = ModuleOP()
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            dbg.start()
            out = module(torch.randn(2, 8))
            dbg.forward_backward_dump_end()
            out.sum().backward()
            dbg.step()
    dbg.close()
    assert sum(issubclass(w.category, DeprecationWarning) and "forward_backward_dump_end" in str(w.message)
               for w in caught) == 1
    for step in (0, 1):
        names = set(load_dump(tmp_path, step)[0]["data"])
        # forward and backward of what ran between start and forward_backward_dump_end
        assert names == both("Functional.linear.0", "Functional.linear.1", "Functional.relu.0")
