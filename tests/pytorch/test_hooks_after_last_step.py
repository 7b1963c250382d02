"""After the last step of ``step``, step() removes every hook: the rest of the run calls
torch's own functions, and what was recorded stays as it was."""
from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from msprobe.pytorch import PrecisionDebugger
from pt_helpers import ModuleOP, load_dump, np_stats

ORIGINALS = {"F.relu": F.relu, "F.linear": F.linear, "torch.add": torch.add,
             "Tensor.add": torch.Tensor.add, "Tensor.backward": torch.Tensor.backward}


def _current():
    return {"F.relu": F.relu, "F.linear": F.linear, "torch.add": torch.add,
            "Tensor.add": torch.Tensor.add, "Tensor.backward": torch.Tensor.backward}


def _module_hooks(model: torch.nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def _grad_hooks(model: torch.nn.Module) -> int:
    return sum(len(p._post_accumulate_grad_hooks or {}) for p in model.parameters())


def test_last_step_removes_every_hook(tmp_path):
    torch.manual_seed(0)
    model = ModuleOP()
    x = torch.randn(3, 8)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix", step=[0, 1])
    for step in range(4):
        dbg.start(model)
        if step <= 1:  # recording: wrapped APIs and hooked modules
            assert _current()["F.relu"] is not ORIGINALS["F.relu"]
            assert _module_hooks(model) > 0 and _grad_hooks(model) > 0
        out = model(x * (step + 1))
        out.sum().backward()
        dbg.stop()
        dbg.step()
        model.zero_grad()
        if step == 0:  # not the last step: the hooks stay for step 1
            assert _current()["F.relu"] is not ORIGINALS["F.relu"]
        else:
            assert _current() == ORIGINALS
            assert _module_hooks(model) == 0 and _grad_hooks(model) == 0
    dbg.close()
    assert sorted(p.name for p in (tmp_path / "d").iterdir() if p.name.startswith("step")) == ["step0", "step1"]
    # the last step's files hold its data: the relu output of step 1, from an unrecorded run
    data = load_dump(tmp_path / "d", step=1)[0]["data"]
    with torch.no_grad():
        expected = np_stats(F.relu(model.linear_2(model.linear_1(x * 2))))
    record = data["Functional.relu.0.forward"]["output"][0]
    for key, value in expected.items():
        assert abs(record[key] - value) <= 1e-6 * max(1.0, abs(value)), (key, record[key], value)
    assert "Module.linear_1.Linear.parameters_grad" in data


def test_steps_after_the_last_run_like_an_unrecorded_run(tmp_path):
    """Gradients and outputs of the steps after the last one equal those of a run without
    msprobe (same seed, same data)."""
    def train(with_debugger: bool) -> list:
        torch.manual_seed(1)
        model = ModuleOP()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix", step=[0]) if with_debugger else None
        losses = []
        for step in range(3):
            if dbg is not None:
                dbg.start(model)
            loss = model(torch.full((2, 8), 0.5 * (step + 1))).square().sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            if dbg is not None:
                dbg.stop()
                dbg.step()
            losses.append(loss.item())
        if dbg is not None:
            dbg.close()
        return losses + [p.detach().clone() for p in model.parameters()]

    plain, recorded = train(False), train(True)
    assert plain[:3] == recorded[:3]
    assert all(torch.equal(a, b) for a, b in zip(plain[3:], recorded[3:]))


def test_compiled_function_after_the_last_step(tmp_path):
    """A function compiled while the wrappers were in place gives the same values after
    they are gone (compiled once more: Dynamo guards on the functions it traced)."""
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    fn = torch.compile(lambda t: F.gelu(model(t)) + 1, backend="eager")
    x = torch.randn(2, 4)
    with torch.no_grad():
        expected = F.gelu(model(x)) + 1
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1", step=[0])
    for _ in range(3):
        dbg.start()
        out = fn(x)
        dbg.stop()
        dbg.step()
        assert torch.equal(out, expected)
    dbg.close()
    torch._dynamo.reset()
    assert json.loads((tmp_path / "d" / "step0" / "rank" / "dump.json").read_text())["level"] == "L1"
