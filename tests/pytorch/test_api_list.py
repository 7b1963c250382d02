"""The API list: the packaged support_wrap_ops.yaml, a user's own copy through the config
key ``api_list`` (unknown names reported, not fatal), and the NPU family tested with a
stand-in ``torch_npu`` module (no Ascend hardware here)."""
from __future__ import annotations

import json
import logging
import sys
import types

import pytest
import torch
import torch.nn.functional as F
import yaml

from pt_helpers import load_dump
from msprobe.core.errors import ConfigError
from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch.api_hooks import DEFAULT_API_LIST, load_api_list


def config(tmp_path, api_list, level="L1"):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "dump"), "level": level,
                                "api_list": str(api_list)}))
    return str(path)


def test_packaged_list_resolves_in_this_torch():
    specs, unknown = load_api_list()
    names = {(s.family, s.api) for s in specs}
    assert {("Functional", "linear"), ("Tensor", "__add__"), ("Torch", "matmul"), ("VF", "lstm")} <= names
    assert unknown == []
    doc = yaml.safe_load(open(DEFAULT_API_LIST))
    assert set(doc) == {"functional", "tensor", "torch", "_VF", "aten", "distributed"}


def test_own_list_only_those_apis_and_unknown_reported(tmp_path, caplog):
    own = tmp_path / "my_ops.yaml"
    own.write_text("functional:\n  - relu\n  - no_such_function\ntorch:\n  - add\nbogus_family:\n  - x\n")
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        dbg = PrecisionDebugger(config_path=config(tmp_path, own))
    assert dbg.unknown_apis[0] == "functional.no_such_function"
    assert dbg.unknown_apis[1].startswith("bogus_family (unsupported family")
    assert "no_such_function" in caplog.text
    dbg.start()
    a = torch.ones(2)
    F.relu(torch.add(a, 1) * 2)          # mul is not in the list
    dbg.stop()
    dbg.close()
    dump, _, _ = load_dump(tmp_path / "dump")
    assert set(dump["data"]) == {"Torch.add.0.forward", "Functional.relu.0.forward"}


@pytest.mark.parametrize("content,match", [
    (None, "`api_list`"),                       # missing file
    ("functional: relu\n", "`api_list`"),        # not a list
    ("functional: [relu\n", "`api_list`"),       # YAML error
])
def test_bad_own_list(tmp_path, content, match):
    own = tmp_path / "bad.yaml"
    if content is not None:
        own.write_text(content)
    with pytest.raises(ConfigError, match=match):
        PrecisionDebugger(config_path=config(tmp_path, own))


@pytest.fixture
def fake_torch_npu(monkeypatch):
    """A stand-in for torch_npu with two custom ops."""
    mod = types.ModuleType("torch_npu")

    def npu_fast_gelu(x):
        return x * torch.sigmoid(1.702 * x)

    def npu_rms_norm(x, gamma, epsilon=1e-6):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + epsilon) * gamma

    mod.npu_fast_gelu = npu_fast_gelu
    mod.npu_rms_norm = npu_rms_norm
    monkeypatch.setitem(sys.modules, "torch_npu", mod)
    import importlib.machinery
    mod.__spec__ = importlib.machinery.ModuleSpec("torch_npu", None)
    return mod


def test_npu_family_with_stand_in(tmp_path, fake_torch_npu):
    own = tmp_path / "ops.yaml"
    own.write_text("torch_npu:\n  - npu_fast_gelu\n  - npu_rms_norm\n  - npu_not_there\n")
    dbg = PrecisionDebugger(config_path=config(tmp_path, own))
    assert dbg.unknown_apis == ["torch_npu.npu_not_there"]
    original = fake_torch_npu.npu_fast_gelu
    dbg.start()
    x = torch.randn(2, 4, requires_grad=True)
    y = fake_torch_npu.npu_fast_gelu(x)
    z = fake_torch_npu.npu_rms_norm(y, torch.ones(4), epsilon=1e-5)
    z.sum().backward()
    dbg.stop()
    dbg.close()
    assert fake_torch_npu.npu_fast_gelu is original     # restored by close()
    dump, _, _ = load_dump(tmp_path / "dump")
    data = dump["data"]
    assert set(data) == {"NPU.npu_fast_gelu.0.forward", "NPU.npu_fast_gelu.0.backward",
                         "NPU.npu_rms_norm.0.forward", "NPU.npu_rms_norm.0.backward"}
    assert data["NPU.npu_rms_norm.0.forward"]["input_kwargs"]["epsilon"] == {"type": "float", "value": 1e-5}
    assert data["NPU.npu_fast_gelu.0.forward"]["output"][0]["Max"] == float(y.detach().max())


def test_npu_section_ignored_without_torch_npu(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import torch_npu fails
    own = tmp_path / "ops.yaml"
    own.write_text("torch_npu:\n  - npu_fast_gelu\nfunctional:\n  - relu\n")
    specs, unknown = load_api_list(str(own))
    assert [(s.family, s.api) for s in specs] == [("Functional", "relu")] and unknown == []


def _generator():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "tools" / "gen_wrap_ops.py"
    spec = importlib.util.spec_from_file_location("gen_wrap_ops", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generator_reproduces_packaged_list(tmp_path, capsys):
    gen = _generator()
    out = tmp_path / "ops.yaml"
    assert gen.main(["gen", str(out)]) == 0
    assert yaml.safe_load(out.read_text()) == yaml.safe_load(open(DEFAULT_API_LIST))


def test_generator_lists_npu_ops_of_stand_in(fake_torch_npu):
    assert _generator().npu_names() == ["npu_fast_gelu", "npu_rms_norm"]
