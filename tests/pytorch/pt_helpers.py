"""Shared networks and helpers for the PyTorch recorder tests."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModuleOP(nn.Module):
    """The seeds' quick-start network: two Linear layers and relu."""

    def __init__(self) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_features=8, out_features=4)
        self.linear_2 = nn.Linear(in_features=4, out_features=2)

    def forward(self, x):
        x1 = self.linear_1(x)
        x2 = self.linear_2(x1)
        r1 = F.relu(x2)
        return r1


def load_dump(dump_path, step: int = 0, rank_dir: str = "rank") -> tuple[dict, dict, dict]:
    d = Path(dump_path) / f"step{step}" / rank_dir
    return tuple(json.loads((d / f).read_text()) for f in ("dump.json", "stack.json", "construct.json"))


def np_stats(t: torch.Tensor) -> dict:
    """Independent float64 statistics with numpy."""
    a = t.detach().to(torch.float64).numpy() if not t.is_complex() else np.abs(t.detach().numpy()).astype(np.float64)
    return {"Max": float(a.max()), "Min": float(a.min()), "Mean": float(a.mean()),
            "Norm": float(np.sqrt((a * a).sum()))}


def assert_record(rec: dict, t: torch.Tensor, rel: float = 1e-6) -> None:
    assert rec["type"] == "torch.Tensor"
    assert rec["dtype"] == str(t.dtype)
    assert rec["shape"] == list(t.shape)
    exp = np_stats(t)
    for k in ("Max", "Min"):
        assert rec[k] == exp[k], (k, rec[k], exp[k])
    for k in ("Mean", "Norm"):
        assert rec[k] == pytest.approx(exp[k], rel=rel, abs=1e-12), (k, rec[k], exp[k])


@pytest.fixture
def quickstart():
    torch.manual_seed(0)
    return ModuleOP()
