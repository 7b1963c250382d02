"""config.json ``risk_level``: ALL records every API, FOCUS leaves out the low-risk shape,
copy and creation APIs, CORE keeps matrix products, convolutions, norms, embeddings,
attention and collectives (msprobe.core.risk). Unlike upstream 26.2.0, whose CORE list
lost ``linear``, a Linear model records ``Functional.linear`` at CORE."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from msprobe.core.risk import CORE_APIS, LOW_RISK_APIS, api_risk, recorded_at
from msprobe.pytorch import PrecisionDebugger


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.norm = nn.LayerNorm(3)

    def forward(self, x):
        y = self.norm(self.fc(x))                       # Functional.linear, Functional.layer_norm
        z = y.view(-1).reshape(3, 2).transpose(0, 1)    # LOW: view, reshape, transpose
        w = torch.cat([z, torch.zeros_like(z)])         # LOW: cat, zeros_like
        v = torch.matmul(w, w.t())                      # CORE: matmul; LOW: t
        return F.relu(v).sum()                          # FOCUS: relu, sum


def _names(tmp_path, risk_level=None, level="L1"):
    cfg = {"task": "statistics", "dump_path": str(tmp_path / "d"), "level": level}
    tmp_path.mkdir(exist_ok=True)
    if risk_level is not None:
        cfg["risk_level"] = risk_level
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    torch.manual_seed(0)
    net = Net()
    dbg = PrecisionDebugger(config_path=str(tmp_path / "c.json"))
    dbg.start(net)
    net(torch.randn(2, 4)).backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    data = json.loads((tmp_path / "d" / "step0" / "rank" / "dump.json").read_text())["data"]
    return {n for n in data if n.endswith(".forward") or ".forward." in n}


FOCUS = {"Functional.linear.0.forward", "Functional.layer_norm.0.forward", "Torch.matmul.0.forward",
         "Functional.relu.0.forward", "Tensor.sum.0.forward"}
LOW = {"Tensor.view.0.forward", "Tensor.reshape.0.forward", "Tensor.transpose.0.forward", "Torch.cat.0.forward",
       "Torch.zeros_like.0.forward", "Tensor.t.0.forward"}
CORE = {"Functional.linear.0.forward", "Functional.layer_norm.0.forward", "Torch.matmul.0.forward"}


def test_all_is_the_default_and_records_every_listed_api(tmp_path):
    names = _names(tmp_path)
    assert FOCUS <= names
    # the packaged API list hooks no view/to/clone nor tensor factories (docs/pytorch-features.md)
    assert LOW - {"Tensor.view.0.forward", "Torch.zeros_like.0.forward"} <= names
    assert names == _names(tmp_path / "all", "ALL")


def test_focus_leaves_out_low_risk_apis(tmp_path):
    all_names = _names(tmp_path / "all", "ALL")
    assert _names(tmp_path, "FOCUS") == all_names - LOW


def test_core_records_linear_matmul_and_norm(tmp_path):
    assert _names(tmp_path, "CORE") == CORE


def test_core_at_mix_keeps_modules(tmp_path):
    names = _names(tmp_path, "CORE", level="mix")
    assert names == CORE | {"Module.fc.Linear.forward.0", "Module.norm.LayerNorm.forward.0"}


@pytest.mark.parametrize(("family", "name", "risk"), [
    ("Functional", "linear", "CORE"), ("Tensor", "__matmul__", "CORE"), ("Tensor", "addmm_", "CORE"),
    ("Functional", "conv2d", "CORE"), ("Functional", "scaled_dot_product_attention", "CORE"),
    ("Functional", "embedding", "CORE"), ("Distributed", "all_reduce", "CORE"), ("NPU", "npu_fast_gelu", "CORE"),
    ("Tensor", "transpose_", "LOW"), ("Tensor", "to", "LOW"), ("Torch", "ones", "LOW"),
    ("Functional", "relu", "FOCUS"), ("Tensor", "__add__", "FOCUS"), ("Torch", "clamp", "FOCUS"),
])
def test_api_risk(family, name, risk):
    assert api_risk(family, name) == risk
    assert recorded_at("ALL", family, name)
    assert recorded_at("FOCUS", family, name) == (risk != "LOW")
    assert recorded_at("CORE", family, name) == (risk == "CORE")


def test_lists_are_disjoint_and_bad_level_raises():
    assert not CORE_APIS & LOW_RISK_APIS
    with pytest.raises(ValueError, match="risk_level: got 'LOW'"):
        recorded_at("LOW", "Torch", "add")
