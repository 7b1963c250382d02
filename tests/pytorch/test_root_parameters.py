"""Parameters owned by the root model (a ViT's ``cls_token`` and ``pos_embed``): the root
is not recorded (spec 9), but its own parameters' gradients are, under
``Module.model.{Class}.parameters_grad`` (``Module.{i}.{Class}`` in a list of models)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from msprobe.pytorch import PrecisionDebugger
from pt_helpers import assert_record, load_dump


class _TokenModel(nn.Module):
    """A ViT-like root: a class token and position embedding of its own, then a block."""

    def __init__(self) -> None:
        super().__init__()
        self.cls_token = nn.Parameter(torch.randn(1, 1, 8))
        self.pos_embed = nn.Parameter(torch.randn(1, 5, 8))
        self.frozen = nn.Parameter(torch.randn(8), requires_grad=False)
        self.proj = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        tokens = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), self.proj(x)], dim=1) + self.pos_embed
        return self.head(tokens[:, 0] + self.frozen)


def _grads(model: nn.Module, x: torch.Tensor) -> dict:
    model.zero_grad()
    model(x).square().sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_root_parameters_get_their_gradient_entry(tmp_path, level):
    torch.manual_seed(0)
    model = _TokenModel()
    x = torch.randn(2, 4, 8)
    expected = _grads(model, x)
    model.zero_grad()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level=level)
    dbg.start(model)
    model(x).square().sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    entry = data["Module.model._TokenModel.parameters_grad"]
    assert list(entry) == ["cls_token", "pos_embed"]  # the frozen one has no gradient
    assert_record(entry["cls_token"][0], expected["cls_token"])
    assert_record(entry["pos_embed"][0], expected["pos_embed"])
    assert_record(data["Module.proj.Linear.parameters_grad"]["weight"][0], expected["proj.weight"])
    assert not any(k.startswith("Module.model._TokenModel.forward") for k in data)


def test_root_parameters_in_a_list_of_models(tmp_path):
    torch.manual_seed(0)
    models = [_TokenModel(), nn.Linear(8, 3)]
    x = torch.randn(2, 4, 8)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0")
    dbg.start(models)
    (models[0](x).sum() + models[1](x).sum()).backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    assert_record(data["Module.0._TokenModel.parameters_grad"]["cls_token"][0], models[0].cls_token.grad)
    assert "Module.1.Linear.parameters_grad" in data  # a model without submodules: itself


def test_root_parameters_not_recorded_outside_a_recorded_step(tmp_path):
    """A backward after step() and before the next start() records nothing."""
    torch.manual_seed(0)
    model = _TokenModel()
    x = torch.randn(2, 4, 8)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0")
    dbg.start(model)
    model(x).sum().backward()
    dbg.stop()
    dbg.step()
    model(x).sum().backward()  # step 1 not started
    dbg.close()
    assert not (tmp_path / "d" / "step1").exists() or "Module.model._TokenModel.parameters_grad" not in (
        load_dump(tmp_path / "d", step=1)[0]["data"])
