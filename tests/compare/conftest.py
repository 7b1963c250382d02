"""Tiny seeded CPU models recorded with PrecisionDebugger, with differences known by
construction (perturbed op, inserted ops, bf16 autocast, a fragile op)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from msprobe.pytorch import PrecisionDebugger


class Block(nn.Module):
    """fc1 → gelu → (optional inserted ``tanh(h)*0 + h``) → LayerNorm → fc2, plus residual."""

    def __init__(self, width: int = 8, hidden: int = 16) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.ln = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, width)
        self.insert = False

    def forward(self, x):
        h = self.fc1(x)
        h = F.gelu(h)
        if self.insert:
            h = torch.tanh(h) * 0 + h
        h = self.ln(h)
        h = self.fc2(h)
        return x + h


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 4)
        self.fragile = False

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        out = self.head(x)
        if self.fragile:
            z = out + 1000.0
            var = (z * z).mean() - z.mean() ** 2   # catastrophic cancellation in low precision
            out = out + var * 0
        return out


def record(path: Path, *, level: str = "mix", md5: bool = False, perturb: Optional[dict] = None,
           insert: bool = False, autocast: bool = False, fragile: bool = False, steps: int = 1,
           loss_scale: float = 1.0, task: str = "statistics") -> Path:
    """Record ``steps`` training steps of the seeded Net into ``path``.

    ``perturb`` maps ``(module, attribute)`` names such as ``"F.gelu"`` to a wrapper
    ``f(original) -> replacement``; replacements are installed before the debugger, so
    they add no entry, and removed afterwards.
    """
    torch.manual_seed(0)
    net = Net()
    net.blocks[0].insert = insert
    net.fragile = fragile
    x = torch.randn(4, 8)
    config = path.parent / f"{path.name}.config.json"
    cfg = {"task": task, "dump_path": str(path), "level": level}
    if md5:
        cfg["statistics"] = {"summary_mode": "md5"}
    config.write_text(json.dumps(cfg))
    saved = {}
    for key, make in (perturb or {}).items():
        owner = {"F": F, "torch": torch}[key.split(".")[0]]
        attr = key.split(".", 1)[1]
        saved[key] = (owner, attr, getattr(owner, attr))
        setattr(owner, attr, make(getattr(owner, attr)))
    try:
        debugger = PrecisionDebugger(config_path=str(config))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(steps):
            debugger.start(model=net)
            if autocast:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = net(x)
            else:
                out = net(x)
            out.float().pow(2).mean().backward(torch.tensor(loss_scale))
            debugger.stop()
            debugger.step()
            opt.step()
            opt.zero_grad()
        debugger.close()
    finally:
        for owner, attr, original in saved.values():
            setattr(owner, attr, original)
    return path


def scaled(factor: float) -> Callable:
    """Replacement factory: ``original(*a, **k) * factor``."""
    def make(original):
        def replacement(*args, **kwargs):
            return original(*args, **kwargs) * factor
        return replacement
    return make


def one_ulp(original):
    """Replacement: every output element moved up by one ulp."""
    def replacement(*args, **kwargs):
        y = original(*args, **kwargs)
        return torch.nextafter(y, torch.full_like(y, float("inf")))
    return replacement


import pytest


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """All recorded runs, once per test session: ``{name: dump_path}``."""
    d = tmp_path_factory.mktemp("compare_runs")
    out = {
        "base": record(d / "base", md5=True),
        "same": record(d / "same", md5=True),
        "gelu": record(d / "gelu", md5=True, perturb={"F.gelu": scaled(1 + 1e-3)}),
        "ulp": record(d / "ulp", md5=True, perturb={"F.gelu": one_ulp}),
        "ins": record(d / "ins", md5=True, insert=True),
        "ins_ln": record(d / "ins_ln", md5=True, insert=True, perturb={"F.layer_norm": scaled(1 + 1e-3)}),
        "bf16": record(d / "bf16", autocast=True),
        "fp32": record(d / "fp32"),
        "bf16_fragile": record(d / "bf16_fragile", autocast=True, fragile=True),
        "fp32_fragile": record(d / "fp32_fragile", fragile=True),
        "nan": record(d / "nan", perturb={"F.layer_norm": scaled(float("inf"))}),
        "scaled8": record(d / "scaled8", md5=True, loss_scale=8.0),
        "two_steps": record(d / "two_steps", md5=True, steps=2),
    }
    return out


@pytest.fixture(scope="session")
def record_run():
    """The :func:`record` helper (a fixture: ``conftest`` module names collide across test dirs)."""
    return record


@pytest.fixture(scope="session")
def scaled_fn():
    """The :func:`scaled` replacement factory."""
    return scaled
