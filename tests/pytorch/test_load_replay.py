"""config.json ``load``: the inputs of the modules named in ``load.modules`` are replaced,
at their forward, by the tensors of their entries in an earlier tensor dump, so such a
module's output is the one it had in the recorded run whatever the new run feeds it.
Checked against the recorded output files and against the module recomputed on the
recorded input in an unrecorded run; bad paths and modules are ConfigErrors."""
from __future__ import annotations

import json
import logging

import pytest
import torch
import torch.nn as nn

from msprobe.core.errors import ConfigError
from msprobe.pytorch import PrecisionDebugger


class Gate(nn.Module):
    def forward(self, x, *, mask):
        return x * mask


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 3)
        self.gate = Gate()

    def forward(self, x):
        h = self.fc2(torch.relu(self.fc1(x)))
        return self.gate(h, mask=(h > 0).float()) + self.fc2(torch.ones(2, 4))[0, 0]


def _net():
    torch.manual_seed(0)
    return Net()


def _inputs(scale=1.0, shift=0.0):
    g = torch.Generator().manual_seed(7)
    return [torch.randn(2, 4, generator=g) * scale + shift for _ in range(2)]


@pytest.fixture()
def recorded(tmp_path):
    """A two-step tensor dump at level L0; returns its dump path."""
    net = _net()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "rec"), task="tensor", level="L0")
    for x in _inputs():
        dbg.start(net)
        net(x).sum().backward()
        dbg.stop()
        dbg.step()
    dbg.close()
    return tmp_path / "rec"


def _data(dump, step):
    return dump / f"step{step}" / "rank" / "dump_tensor_data"


def _replay_run(tmp_path, load, *, level="L0", task="tensor", inputs=None, grad=True):
    """A run with other inputs and ``load``; returns the outputs of fc1, fc2 (per call) and gate per step."""
    cfg = tmp_path / "load.json"
    cfg.write_text(json.dumps({"task": task, "dump_path": str(tmp_path / "new"), "level": level, "load": load}))
    net = _net()
    seen = []
    for name in ("fc1", "fc2", "gate"):
        getattr(net, name).register_forward_hook(lambda m, a, o, name=name: seen[-1].setdefault(name, []).append(o))
    dbg = PrecisionDebugger(config_path=str(cfg))
    for x in inputs or _inputs(scale=5.0, shift=1.0):
        seen.append({})
        dbg.start(net)
        y = net(x).sum()
        if grad:
            y.backward()
        dbg.stop()
        dbg.step()
    net.pre_hooks_before_close = len(net.fc2._forward_pre_hooks)
    dbg.close()
    return seen, net


def test_replayed_module_gives_its_recorded_output(tmp_path, recorded):
    seen, net = _replay_run(tmp_path, {"path": str(recorded), "modules": ["Module.fc2.Linear.forward.0"]})
    for step in (0, 1):
        want = torch.load(_data(recorded, step) / "Module.fc2.Linear.forward.0.output.0.pt", weights_only=True)
        assert torch.equal(seen[step]["fc2"][0], want)
        # recomputed: the module on the recorded input, nothing recorded
        x = torch.load(_data(recorded, step) / "Module.fc2.Linear.forward.0.input.0.pt", weights_only=True)
        with torch.no_grad():
            assert torch.equal(_net().fc2(x), seen[step]["fc2"][0].detach())
        # fc1 saw the new input: its output is not the recorded one
        rec_fc1 = torch.load(_data(recorded, step) / "Module.fc1.Linear.forward.0.output.0.pt", weights_only=True)
        assert not torch.equal(seen[step]["fc1"][0], rec_fc1)
        # the second call of fc2 (forward.1) is not listed: it keeps its own input
        assert torch.equal(seen[step]["fc2"][1].detach(), _net().fc2(torch.ones(2, 4)).detach())
    # load only (dump_after_load false): nothing is recorded
    assert not (tmp_path / "new").exists() or not any((tmp_path / "new").glob("step*"))
    # the replayed input is a new leaf of the graph: fc1 gets no gradient through fc2
    assert net.fc1.weight.grad is None and net.fc2.weight.grad is not None


def test_keyword_tensor_inputs_are_replayed(tmp_path, recorded):
    seen, _ = _replay_run(tmp_path, {"path": str(recorded), "modules": ["Module.gate.Gate.forward.0"]})
    for step in (0, 1):
        want = torch.load(_data(recorded, step) / "Module.gate.Gate.forward.0.output.0.pt", weights_only=True)
        assert torch.equal(seen[step]["gate"][0], want)
        mask = torch.load(_data(recorded, step) / "Module.gate.Gate.forward.0.kwargs.mask.pt", weights_only=True)
        x = torch.load(_data(recorded, step) / "Module.gate.Gate.forward.0.input.0.pt", weights_only=True)
        assert torch.equal(want, x * mask)


def test_dump_after_load_records_the_replayed_inputs(tmp_path, recorded):
    load = {"path": str(recorded), "modules": ["Module.fc2.Linear.forward.0"], "dump_after_load": True}
    seen, _ = _replay_run(tmp_path, load)
    for step in (0, 1):
        for part in ("input.0", "output.0"):
            name = f"Module.fc2.Linear.forward.0.{part}.pt"
            new = torch.load(_data(tmp_path / "new", step) / name, weights_only=True)
            assert torch.equal(new, torch.load(_data(recorded, step) / name, weights_only=True))
        new_fc1 = torch.load(_data(tmp_path / "new", step) / "Module.fc1.Linear.forward.0.output.0.pt",
                             weights_only=True)
        assert torch.equal(new_fc1, seen[step]["fc1"][0])


def test_load_step_selects_the_steps_replayed(tmp_path, recorded):
    seen, _ = _replay_run(tmp_path, {"path": str(recorded), "modules": ["Module.fc2.Linear.forward.0"],
                                     "step": ["1"]})
    rec = [torch.load(_data(recorded, s) / "Module.fc2.Linear.forward.0.output.0.pt", weights_only=True)
           for s in (0, 1)]
    assert not torch.equal(seen[0]["fc2"][0], rec[0])
    assert torch.equal(seen[1]["fc2"][0], rec[1])
    seen, _ = _replay_run(tmp_path, {"path": str(recorded), "modules": ["Module.fc2.Linear.forward.0"],
                                     "rank": [1]})
    assert not torch.equal(seen[0]["fc2"][0], rec[0])  # this process is rank 0


def test_a_step_missing_in_the_dump_keeps_the_input(tmp_path, recorded, caplog):
    x = _inputs(scale=5.0)
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        seen, _ = _replay_run(tmp_path, {"path": str(recorded), "modules": ["Module.fc2.Linear.forward.0"]},
                              inputs=x + [x[0]])
    with torch.no_grad():
        net = _net()
        assert torch.equal(seen[2]["fc2"][0], net.fc2(torch.relu(net.fc1(x[0]))))
    assert "step 2" in caplog.text and "no step2" in caplog.text


@pytest.mark.parametrize("load, field, words", [
    ({"path": "nowhere", "modules": ["Module.fc2.Linear.forward.0"]}, "load.path", "does not exist"),
    ({"modules": ["Module.fc2.Linear.forward.0"]}, "load.path", ""),
    ({"path": "{empty}", "modules": ["Module.fc2.Linear.forward.0"]}, "load.path", "no step*/*/dump_tensor_data"),
    ({"path": "{rec}", "modules": ["Module.fc3.Linear.forward.0"]}, "load.modules", "no Module.fc3"),
    ({"path": "{rec}", "modules": ["Module.fc2.Linear.backward.0"]}, "load.modules", ""),
    ({"path": "{rec}", "modules": ["fc2"]}, "load.modules", ""),
    ({"path": "{rec}", "modules": []}, "load.modules", ""),
    ({"path": "{rec}", "modules": ["Module.fc2.Linear.forward.0"] * 2}, "load.modules", "listed twice"),
    ({"path": "{rec}", "modules": ["Module.fc2.Linear.forward.0"], "dump_after_load": "yes"},
     "load.dump_after_load", ""),
    ({"path": "{rec}", "modules": ["Module.fc2.Linear.forward.0"], "step": ["x"]}, "load.step", ""),
    ("{rec}", "load", ""),
])
def test_bad_load_is_a_config_error(tmp_path, recorded, load, field, words):
    (tmp_path / "empty").mkdir()
    text = json.dumps({"task": "tensor", "dump_path": str(tmp_path / "new"), "level": "L0", "load": load})
    text = text.replace("{rec}", str(recorded)).replace("{empty}", str(tmp_path / "empty"))
    (tmp_path / "c.json").write_text(text)
    with pytest.raises(ConfigError) as info:
        PrecisionDebugger(config_path=str(tmp_path / "c.json"))
    assert info.value.field == field
    assert words in str(info.value)


def test_a_module_the_model_lacks_is_a_config_error_at_start(tmp_path, recorded):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": "tensor", "dump_path": str(tmp_path / "new"), "level": "L0",
                               "load": {"path": str(recorded), "modules": ["Module.fc2.Linear.forward.0"]}}))
    dbg = PrecisionDebugger(config_path=str(cfg))
    with pytest.raises(ConfigError) as info:
        dbg.start(nn.Sequential(nn.Linear(4, 4)))
    assert info.value.field == "load.modules" and "no module Module.fc2.Linear" in str(info.value)
    for model in (None, "net"):
        with pytest.raises(ConfigError) as info:
            dbg.start(model)
        assert info.value.field == "model" and "load replays module inputs" in str(info.value)
    dbg.close()


def test_hooks_are_removed_at_close(tmp_path, recorded):
    _, net = _replay_run(tmp_path, {"path": str(recorded), "modules": ["Module.fc2.Linear.forward.0"]})
    assert net.pre_hooks_before_close > 0
    assert not net.fc2._forward_pre_hooks


def test_load_alone_needs_no_dump_path_and_reports_calls_that_did_not_run(tmp_path, recorded, caplog):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": "tensor", "level": "L0",
                               "load": {"path": str(recorded), "modules": ["Module.fc2.Linear.forward.0",
                                                                           "Module.fc1.Linear.forward.0"]}}))
    before = sorted(str(p) for p in recorded.rglob("*"))
    dbg = PrecisionDebugger(config_path=str(cfg))
    net = _net()
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        dbg.start(net)
        y = net.fc2(torch.zeros(2, 4))  # fc1 does not run in this step
        dbg.stop()
        dbg.step()
    dbg.close()
    want = torch.load(_data(recorded, 0) / "Module.fc2.Linear.forward.0.output.0.pt", weights_only=True)
    assert torch.equal(y, want)
    assert "Module.fc1.Linear.forward.0" in caplog.text and "no forward call in step 0" in caplog.text
    assert sorted(str(p) for p in recorded.rglob("*")) == before  # nothing written into the loaded dump
