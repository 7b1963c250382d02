"""Filters on a small network whose every entry name is written out by hand: scope
(inclusive, backward follows forward), list (substrings; at mix a module keeps what runs
inside it), data_mode combinations, step and rank lists (spec 5.4-5.6, section 9 fixes
19, 21)."""
from __future__ import annotations

import json
import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from pt_helpers import load_dump
from msprobe.pytorch import PrecisionDebugger


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return F.relu(self.fc(x))          # Functional.linear.1, Functional.relu.0


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 4)
        self.body = Block()
        self.tail = nn.Linear(4, 2)

    def forward(self, x):
        x = self.head(x)                   # Functional.linear.0
        x = self.body(x)
        x = torch.add(x, 1)                # Torch.add.0
        return self.tail(x)                # Functional.linear.2


def both(*names):
    return {f"{n}.{d}" for n in names for d in ("forward", "backward")}


def mod(*prefixes):
    return {f"Module.{p}.{d}.0" for p in prefixes for d in ("forward", "backward")}


def pg(*prefixes):
    return {f"Module.{p}.parameters_grad" for p in prefixes}


API_ALL = both("Functional.linear.0", "Functional.linear.1", "Functional.linear.2", "Functional.relu.0",
               "Torch.add.0", "Tensor.sum.0")
MOD_ALL = mod("head.Linear", "body.Block", "body.fc.Linear", "tail.Linear")
PG_ALL = pg("head.Linear", "body.fc.Linear", "tail.Linear")


def run(tmp_path, level, *, scope=None, names=None, data_mode=None, steps=1, step=None, rank=None):
    cfg = {"task": "statistics", "dump_path": str(tmp_path / "dump"), "level": level,
           "statistics": {"scope": scope or [], "list": names or [], "data_mode": data_mode or ["all"]}}
    if step is not None:
        cfg["step"] = step
    if rank is not None:
        cfg["rank"] = rank
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    torch.manual_seed(0)
    net = Net()
    dbg = PrecisionDebugger(config_path=str(path))
    for _ in range(steps):
        dbg.start(model=net)
        out = net(torch.randn(3, 4))
        out.sum().backward()
        dbg.stop()
        dbg.step()
    dbg.close()
    return tmp_path / "dump"


def names_of(dump_path, step=0):
    return set(load_dump(dump_path, step)[0]["data"])


def test_no_filter_mix_is_everything(tmp_path):
    assert names_of(run(tmp_path, "mix")) == API_ALL | MOD_ALL | PG_ALL


def test_scope_api_range_inclusive_with_backward(tmp_path):
    dump = run(tmp_path, "L1", scope=["Functional.linear.1.forward", "Torch.add.0.forward"])
    data = load_dump(dump)[0]["data"]
    assert set(data) == both("Functional.linear.1", "Functional.relu.0", "Torch.add.0")
    assert data["Torch.add.0.forward"]["output"][0]["shape"] == [3, 4]  # end API keeps its output


def test_scope_one_module_keeps_its_inside(tmp_path):
    dump = run(tmp_path, "mix", scope=["Module.body.Block.forward.0", "Module.body.Block.forward.0"])
    assert names_of(dump) == (mod("body.Block", "body.fc.Linear") | both("Functional.linear.1", "Functional.relu.0")
                              | pg("body.fc.Linear"))


def test_scope_api_to_module(tmp_path):
    dump = run(tmp_path, "mix", scope=["Functional.relu.0.forward", "Module.tail.Linear.forward.0"])
    assert names_of(dump) == (both("Functional.relu.0", "Torch.add.0", "Functional.linear.2")
                              | mod("tail.Linear") | pg("tail.Linear"))


def test_scope_resets_each_step(tmp_path):
    dump = run(tmp_path, "L1", scope=["Functional.relu.0.forward", "Torch.add.0.forward"], steps=2)
    for step in (0, 1):
        assert names_of(dump, step) == both("Functional.relu.0", "Torch.add.0")


def test_list_substring_l1(tmp_path):
    assert names_of(run(tmp_path, "L1", names=["relu"])) == both("Functional.relu.0")


def test_list_exact_forward_name(tmp_path):
    assert names_of(run(tmp_path, "L1", names=["Functional.linear.1.forward"])) == {"Functional.linear.1.forward"}


def test_list_module_forward_name_at_mix_keeps_inside_forward(tmp_path):
    dump = run(tmp_path, "mix", names=["Module.body.Block.forward.0"])
    assert names_of(dump) == {"Module.body.Block.forward.0", "Module.body.fc.Linear.forward.0",
                              "Functional.linear.1.forward", "Functional.relu.0.forward"}


def test_list_short_module_string_at_mix_keeps_forward_and_backward(tmp_path):
    dump = run(tmp_path, "mix", names=["body"])
    assert names_of(dump) == (mod("body.Block", "body.fc.Linear") | both("Functional.linear.1", "Functional.relu.0")
                              | pg("body.fc.Linear"))


def test_list_module_name_at_l0(tmp_path):
    dump = run(tmp_path, "L0", names=["Module.body.Block.forward.0"])
    assert names_of(dump) == {"Module.body.Block.forward.0"}


def test_scope_and_list_combine(tmp_path):
    dump = run(tmp_path, "L1", scope=["Functional.linear.0.forward", "Torch.add.0.forward"], names=["linear"])
    assert names_of(dump) == both("Functional.linear.0", "Functional.linear.1")


FWD_KEYS_API = ["input_args", "input_kwargs", "is_recompute", "output"]


@pytest.mark.parametrize("data_mode,api_fwd,api_bwd,pgrad,mod_fwd", [
    (["all"], FWD_KEYS_API, ["input", "output"], True,
     ["input_args", "input_kwargs", "output", "parameters", "is_recompute"]),
    (["forward"], FWD_KEYS_API, None, False, ["input_args", "input_kwargs", "output", "parameters", "is_recompute"]),
    (["backward"], None, ["input", "output"], True, None),
    (["input"], ["input_args", "input_kwargs", "is_recompute"], ["input"], False,
     ["input_args", "input_kwargs", "parameters", "is_recompute"]),
    (["output"], ["is_recompute", "output"], ["output"], True, ["output", "is_recompute"]),
    (["forward", "output"], ["is_recompute", "output"], None, False, ["output", "is_recompute"]),
    (["backward", "input"], None, ["input"], False, None),
    (["forward", "backward", "input", "output"], FWD_KEYS_API, ["input", "output"], True,
     ["input_args", "input_kwargs", "output", "parameters", "is_recompute"]),
])
def test_data_mode(tmp_path, data_mode, api_fwd, api_bwd, pgrad, mod_fwd):
    data = load_dump(run(tmp_path, "mix", data_mode=data_mode))[0]["data"]
    expected = set()
    if api_fwd:
        expected |= {n for n in API_ALL if n.endswith("forward")}
        assert list(data["Functional.linear.0.forward"]) == api_fwd
    if api_bwd:
        expected |= {n for n in API_ALL if n.endswith("backward")} | {n for n in MOD_ALL if ".backward." in n}
        assert list(data["Functional.linear.0.backward"]) == api_bwd
        assert list(data["Module.head.Linear.backward.0"]) == api_bwd
    if mod_fwd:
        expected |= {n for n in MOD_ALL if ".forward." in n}
        assert list(data["Module.head.Linear.forward.0"]) == mod_fwd
    if pgrad:
        expected |= PG_ALL
    assert set(data) == expected


def test_step_list_with_range(tmp_path):
    dump = run(tmp_path, "L1", names=["relu"], steps=5, step=[0, "2-3"])
    assert sorted(p.name for p in dump.iterdir() if p.name.startswith("step")) == ["step0", "step2", "step3"]
    for step in (0, 2, 3):
        assert names_of(dump, step) == both("Functional.relu.0")


def test_step_and_rank_lists_as_strings(tmp_path):
    # upstream 26.x writes "0" and "2-3" as strings
    dump = run(tmp_path, "L1", names=["relu"], steps=5, step=["0", "3-4"], rank=["0"])
    assert sorted(p.name for p in dump.iterdir() if p.name.startswith("step")) == ["step0", "step3", "step4"]
    assert names_of(dump, 3) == both("Functional.relu.0")


def test_rank_list_selects_rank0_of_non_distributed_run(tmp_path):
    dump = run(tmp_path, "L1", names=["relu"], rank=[0, "2-3"])
    assert names_of(dump) == both("Functional.relu.0")


def test_rank_list_excluding_rank0_records_nothing_and_warns(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        dump = run(tmp_path, "L1", names=["relu"], rank=[1])
    assert not dump.exists() or not any(p.name.startswith("step") for p in dump.iterdir())
    assert any("rank" in r.getMessage() for r in caplog.records)
