"""module_dump's parameter-gradient hooks: installed once per module however often
module_dump() is called, and removed by step() of the last step (module_dump() past it
hooks nothing)."""
from __future__ import annotations

import torch
import torch.nn as nn

from msprobe.pytorch import PrecisionDebugger
from pt_helpers import load_dump, np_stats


def _grad_hooks(model: nn.Module) -> int:
    return sum(len(p._post_accumulate_grad_hooks or {}) for p in model.parameters())


def test_module_dump_every_step(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1", step=[0, 1])
    during, after, grads = [], [], []
    for step in range(4):
        dbg.module_dump(model[0], "first")
        dbg.start(model)
        loss = model(torch.full((3, 8), 0.25 * (step + 1))).square().sum()
        loss.backward()
        grads.append(model[0].weight.grad.detach().clone())
        during.append(_grad_hooks(model))
        opt.step()
        opt.zero_grad()
        dbg.stop()
        dbg.module_dump_end()
        dbg.step()
        after.append(_grad_hooks(model))
    dbg.close()
    assert during == [2, 2, 0, 0]  # weight and bias of model[0], once; none past the last step
    assert after == [2, 0, 0, 0]  # step() of the last step (1) removed them
    for step in (0, 1):
        data = load_dump(tmp_path / "d", step=step)[0]["data"]
        record = data["Module.first.Linear.parameters_grad"]["weight"][0]
        for key, value in np_stats(grads[step]).items():
            assert abs(record[key] - value) <= 1e-6 * max(1.0, abs(value)), (step, key)
    assert sorted(p.name for p in (tmp_path / "d").iterdir() if p.name.startswith("step")) == ["step0", "step1"]
