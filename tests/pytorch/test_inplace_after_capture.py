"""An in-place op on a tensor the recorder captured as a module or API input
(``nn.ReLU(inplace=True)``, ``add_``, ``mul_``, a residual ``out += identity`` then an
in-place ReLU) leaves ``backward()`` working and the gradients bit-identical to an
unrecorded run, at task tensor and statistics (summary_mode md5 too), levels mix, L1 and
L0, with async_dump true and false; the captured tensor file holds the value before the
in-place write."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn

from msprobe.pytorch import PrecisionDebugger


class AddOne(nn.Module):
    def forward(self, x):
        return x.add_(1)


class LinearMul(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        y = self.fc(x)
        y.mul_(2)
        return y


class BasicBlock(nn.Module):
    """torchvision's BasicBlock pattern: ``out += identity; out = relu(out)``, in-place ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Linear(6, 6)
        self.bn = nn.BatchNorm1d(6)
        self.relu = nn.ReLU(inplace=True)
        self.c2 = nn.Linear(6, 6)

    def forward(self, x):
        identity = x
        out = self.c2(self.relu(self.bn(self.c1(x))))
        out += identity
        return self.relu(out)


MODELS = {
    "relu_inplace": lambda: nn.Sequential(nn.Linear(6, 6), nn.ReLU(inplace=True), nn.Linear(6, 6),
                                          nn.ReLU(inplace=True), nn.Linear(6, 2)),
    "add_": lambda: nn.Sequential(nn.Linear(6, 6), AddOne(), nn.Linear(6, 2)),
    "mul_": lambda: nn.Sequential(LinearMul(), nn.Tanh(), nn.Linear(6, 2)),
    "basic_block": lambda: nn.Sequential(nn.Linear(6, 6), BasicBlock(), BasicBlock(), nn.Linear(6, 2)),
}
#: what async_dump's task tensor needs as its list: every entry of these models
LIST = ["Linear", "ReLU", "relu", "add", "mul", "AddOne", "LinearMul", "BasicBlock", "Tanh", "BatchNorm1d",
        "batch_norm", "tanh", "iadd"]


def train(name, cfg_path=None):
    torch.manual_seed(0)
    model = MODELS[name]()
    x = torch.randn(4, 6)
    dbg = PrecisionDebugger(config_path=str(cfg_path), model=model) if cfg_path else None
    if dbg:
        dbg.start()
    first = model[0](x)  # the tensor the next module captures as input, then writes in place
    before = first.detach().clone()
    out = model[1:](first)
    (out * out).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    if dbg:
        dbg.stop()
        dbg.step()
        assert not dbg.session.failed
        dbg.close()
    return grads, before


@pytest.mark.parametrize("name", sorted(MODELS))
def test_inplace_after_capture(name, tmp_path):
    ref, _ = train(name)
    for level in ("mix", "L1", "L0"):
        for task, summary in (("tensor", "statistics"), ("statistics", "md5")):
            for async_dump in (False, True):
                path = tmp_path / f"{level}_{task}_{async_dump}"
                cfg = {"task": task, "level": level, "dump_path": str(path), "async_dump": async_dump,
                       "statistics": {"summary_mode": summary},
                       "tensor": {"list": LIST if async_dump else []}}
                cfg_path = tmp_path / "config.json"
                cfg_path.write_text(json.dumps(cfg))
                grads, before = train(name, cfg_path)
                assert all(torch.equal(a, b) for a, b in zip(grads, ref)), (level, task, async_dump)
                if task != "tensor" or level == "L1":
                    continue
                # the second module's input, captured before its in-place write
                data = json.loads((path / "step0" / "rank" / "dump.json").read_text())["data"]
                entry = next(k for k in data if k.startswith("Module.1.") and ".forward." in k)
                rec = data[entry]["input_args"][0]
                saved = torch.load(path / "step0" / "rank" / "dump_tensor_data" / rec["data_name"],
                                   weights_only=True)
                assert torch.equal(saved, before), (level, async_dump, entry)
