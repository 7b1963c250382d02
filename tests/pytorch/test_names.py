"""Entry names on the seeds' quick-start network: exactly what the spec implies, no
tool-induced entries (spec section 2.1; section 9 fixes 1, 2)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import msprobe
import store

from pt_helpers import ModuleOP, load_dump
from msprobe.core.errors import ConfigError
from msprobe.pytorch import PrecisionDebugger

L1 = {f"{n}.{d}" for n in ("Functional.linear.0", "Functional.linear.1", "Functional.relu.0", "Tensor.sum.0")
      for d in ("forward", "backward")}
L0 = {f"Module.{m}.Linear.{d}.0" for m in ("linear_1", "linear_2") for d in ("forward", "backward")} | {
    "Module.linear_1.Linear.parameters_grad", "Module.linear_2.Linear.parameters_grad"}


def run_quickstart(tmp_path, level):
    torch.manual_seed(0)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / level), level=level)
    module = ModuleOP()
    dbg.start(model=module)
    x = torch.randn(10, 8)
    out = module(x)
    loss = out.sum()
    loss.backward()
    dbg.stop()
    dbg.close()
    return load_dump(tmp_path / level)


@pytest.mark.parametrize("level,expected", [("L1", L1), ("L0", L0), ("mix", L0 | L1)])
def test_quickstart_names(tmp_path, level, expected):
    dump, stack, construct = run_quickstart(tmp_path, level)
    assert set(dump["data"]) == expected
    assert dump["level"] == level and dump["task"] == "statistics" and dump["framework"] == "pytorch"
    assert dump["dump_data_dir"] is None


def test_quickstart_construct_mix(tmp_path):
    _, stack, construct = run_quickstart(tmp_path, "mix")
    assert construct["Functional.linear.0.forward"] == "Module.linear_1.Linear.forward.0"
    assert construct["Functional.linear.1.forward"] == "Module.linear_2.Linear.forward.0"
    assert construct["Module.linear_1.Linear.forward.0"] is None
    assert construct["Functional.relu.0.forward"] is None
    assert construct["Functional.linear.1.backward"] == "Module.linear_2.Linear.backward.0"
    assert construct["Functional.linear.0.backward"] == "Module.linear_1.Linear.backward.0"
    assert "Module.linear_1.Linear.parameters_grad" not in construct


def test_construct_levels(tmp_path):
    assert run_quickstart(tmp_path, "L1")[2] == {}
    c0 = run_quickstart(tmp_path, "L0")[2]
    assert set(c0) == {n for n in L0 if "parameters_grad" not in n}


def test_stack_user_frames_only(tmp_path):
    _, stack, _ = run_quickstart(tmp_path, "mix")
    frames = stack["Functional.relu.0.forward"]
    assert frames and "r1 = F.relu(x2)" in frames[0]
    # no frame of msprobe's or torch's own files (the checkout's directory may be named msprobe)
    own = [str(Path(m.__file__).parent) + os.sep for m in (msprobe, store, torch)]
    assert not any(f.split(",")[0].startswith("File " + d) for d in own for f in frames)
    # backward entries carry the stack of their forward call (spec 9 fix 17)
    assert stack["Functional.relu.0.backward"] == frames


def test_entry_key_order(tmp_path):
    dump, _, _ = run_quickstart(tmp_path, "mix")
    data = dump["data"]
    assert list(data["Functional.linear.0.forward"]) == ["input_args", "input_kwargs", "is_recompute", "output"]
    assert list(data["Module.linear_1.Linear.forward.0"]) == ["input_args", "input_kwargs", "output", "parameters", "is_recompute"]
    assert list(data["Functional.linear.0.backward"]) == ["input", "output"]
    assert list(data["Module.linear_1.Linear.parameters_grad"]) == ["weight", "bias"]
    keys = list(data)
    # parameters_grad right after the module's first forward entry (spec 3.2)
    assert keys[keys.index("Module.linear_1.Linear.forward.0") + 1] == "Module.linear_1.Linear.parameters_grad"


def test_model_required_for_module_levels(tmp_path):
    for level in ("L0", "mix"):
        dbg = PrecisionDebugger(dump_path=str(tmp_path / level), level=level)
        with pytest.raises(ConfigError, match="model"):
            dbg.start()
        dbg.close()


def test_bad_model_type(tmp_path):
    with pytest.raises(ConfigError, match="torch.nn.Module"):
        PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix", model="not a model")


def test_hooks_removed_on_close(tmp_path):
    import torch.nn.functional as F
    original = F.linear
    orig_add = torch.Tensor.__add__
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    m = ModuleOP()
    dbg.start(m)
    assert F.linear is not original
    dbg.stop()
    dbg.close()
    assert F.linear is original
    assert torch.Tensor.__add__ is orig_add
    assert not m.linear_1._forward_pre_hooks and not m.linear_1._forward_hooks


def test_inplace_relu_after_linear_keeps_backward(tmp_path):
    """nn.ReLU(inplace=True) modifies the Linear's output in place: the backward entries of
    both still arrive, with the gradients autograd computes."""
    import torch.nn as nn
    from pt_helpers import assert_record

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 4), nn.ReLU(inplace=True), nn.Linear(4, 2))
    x = torch.randn(5, 8)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    dbg.start(net)
    net(x).sum().backward()
    dbg.stop()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    for name in ("Module.0.Linear.backward.0", "Module.1.ReLU.backward.0", "Module.2.Linear.backward.0",
                 "Functional.relu.0.backward", "Functional.linear.0.backward"):
        assert name in data, name
    # independent: gradient w.r.t. the first Linear's output
    w0, b0 = net[0].weight.detach(), net[0].bias.detach()
    h = torch.nn.functional.linear(x, w0, b0).requires_grad_()
    out = net[2](torch.relu(h)).sum()
    (g_h,) = torch.autograd.grad(out, h)
    assert_record(data["Module.0.Linear.backward.0"]["input"][0], g_h)
    assert_record(data["Module.1.ReLU.backward.0"]["output"][0], g_h)


def test_inference_mode_forward_does_not_stop_recording(tmp_path):
    torch.manual_seed(0)
    m = ModuleOP()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    dbg.start(m)
    with torch.inference_mode():
        m(torch.randn(2, 8))
    m(torch.randn(2, 8)).sum().backward()
    dbg.stop()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    assert "Module.linear_1.Linear.forward.1" in data and "Module.linear_1.Linear.backward.1" in data


def test_two_active_debuggers_record_no_internal_ops(tmp_path):
    a = PrecisionDebugger(dump_path=str(tmp_path / "a"), level="L1")
    b = PrecisionDebugger(dump_path=str(tmp_path / "b"), level="L1")
    a.start()
    b.start()
    torch.ones(2).add(1)
    b.stop()
    a.stop()
    a.close()
    b.close()
    assert set(load_dump(tmp_path / "a")[0]["data"]) == {"Tensor.add.0.forward"}
    assert set(load_dump(tmp_path / "b")[0]["data"]) == {"Tensor.add.0.forward"}


def test_module_forward_that_raises_is_not_recorded(tmp_path):
    import torch.nn as nn

    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.boom = Boom()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            try:
                return self.boom(x)
            except ValueError:
                return self.lin(x)

    net = Net()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0")
    dbg.start(net)
    net(torch.ones(1, 2))
    dbg.stop()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    assert "Module.lin.Linear.forward.0" in data
    assert not any(k.startswith("Module.boom") for k in data)
