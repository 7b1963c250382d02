"""A module whose parameters a containing module uses without calling it
(``nn.MultiheadAttention.out_proj``) gets its ``parameters_grad`` entry, with the gradient
autograd accumulated, when the containing module ran in the step; a module of the model
that did not run and whose parameters got no gradient gets none."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn as nn

from msprobe.pytorch import PrecisionDebugger


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.unused = nn.Linear(8, 8)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


def _run(dump_path=None):
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(2, 3, 8)
    dbg = PrecisionDebugger(dump_path=str(dump_path), level="L0", model=net) if dump_path else None
    if dbg:
        dbg.start()
    net(x).square().sum().backward()
    if dbg:
        dbg.stop()
        dbg.step()
        dbg.close()
    return {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}


def test_out_proj_gradient_recorded(tmp_path):
    ref = _run()
    assert _run(tmp_path).keys() == ref.keys()
    data = json.loads((tmp_path / "step0" / "rank" / "dump.json").read_text())["data"]
    entry = data["Module.attn.out_proj.NonDynamicallyQuantizableLinear.parameters_grad"]
    for pname in ("weight", "bias"):
        expect = np.linalg.norm(ref[f"attn.out_proj.{pname}"].double().numpy())
        assert entry[pname][0]["Norm"] == pytest.approx(expect, rel=1e-12)
    assert not any(k.startswith("Module.unused.") for k in data)
