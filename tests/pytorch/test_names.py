"""Entry names on the seeds' quick-start network: exactly what the spec implies, no
tool-induced entries (spec section 2.1; section 9 fixes 1, 2)."""
from __future__ import annotations

import pytest
import torch

from conftest import ModuleOP, load_dump
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
    assert all("msprobe" not in f.split(",")[0] for f in frames)
    assert all("/torch/" not in f.split(",")[0] for f in frames)
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
