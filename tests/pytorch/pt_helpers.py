"""Shared networks and helpers for the PyTorch recorder tests."""
from __future__ import annotations

import json
import math
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
def memo_all_sizes(monkeypatch):
    """The statistics memo for tensors of every size: tests of the memo's reuse rules use
    small tensors, which the plain leaf path otherwise reduces at every record
    (``msprobe.pytorch.leaves.MEMO_MIN_BYTES``)."""
    import msprobe.pytorch.leaves as leaves_mod
    monkeypatch.setattr(leaves_mod, "MEMO_MIN_BYTES", -1)


@pytest.fixture
def quickstart():
    torch.manual_seed(0)
    return ModuleOP()


def _inference_tensor() -> torch.Tensor:
    with torch.inference_mode():
        return torch.randn(6)


#: plain CPU float tensors with data that the native statistics pass reads (contiguous,
#: one per dtype and the odd values: 0-dim, -0.0, NaN/Inf, float64 extremes, a parameter,
#: a tensor with autograd history, an offset part of a larger tensor, an inference tensor);
#: name -> factory. Shared by the tests of the plain leaf path and of the fused md5 pass.
PLAIN_FLOAT_CASES = {
    "f32": lambda: torch.randn(3, 5),
    "f64": lambda: torch.randn(17, dtype=torch.float64),
    "bf16": lambda: torch.randn(9).to(torch.bfloat16),
    "f16": lambda: (torch.randn(33) * 100).to(torch.float16),
    "zero-dim": lambda: torch.tensor(-2.5),
    "negative zero 0-dim": lambda: torch.tensor(-0.0),
    "nan-inf": lambda: torch.tensor([1.0, float("nan"), float("inf"), -3.0]),
    "inf only": lambda: torch.tensor([float("-inf"), 2.0]),
    "huge f64": lambda: torch.tensor([1e300, -2e300, 3e299], dtype=torch.float64),
    "tiny f64": lambda: torch.tensor([1e-300, 2e-310], dtype=torch.float64),
    "parameter": lambda: torch.nn.Parameter(torch.randn(4, 4)),
    "requires grad": lambda: torch.randn(5, requires_grad=True) * 2,
    "offset part": lambda: torch.randn(10)[3:7],
    "inference mode": _inference_tensor,
}


#: the fields of a ``store.records.Leaf`` that the leaf tests compare
LEAF_FIELDS = ("io", "path", "leaf_kind", "type", "dtype", "shape", "numel", "max", "min", "mean", "norm",
               "max_finite", "min_finite", "crc32", "requires_grad", "has_nan", "has_inf", "data_name",
               "payload", "value_json")


def assert_same_leaf(a, b) -> None:
    """Assert that the leaves ``a`` and ``b`` agree in every :data:`LEAF_FIELDS` field
    (NaN equals NaN; floats compared exactly)."""
    for field in LEAF_FIELDS:
        x, y = getattr(a, field), getattr(b, field)
        if isinstance(x, float) and math.isnan(x):
            assert isinstance(y, float) and math.isnan(y), field
        else:
            assert x == y, (field, x, y)


def train_steps(model: nn.Module, opt: torch.optim.Optimizer, dbg, steps: int, make_input,
                on_step=None) -> list[torch.Tensor]:
    """Run ``steps`` optimizer steps on the loss ``model(make_input()).pow(2).mean()``,
    recorded between ``dbg.start(model)`` and ``dbg.stop()``/``dbg.step()`` when ``dbg``
    (a PrecisionDebugger) is given, which is closed at the end; ``on_step(step)`` runs before
    each step's input is made. Returns the detached losses."""
    losses = []
    for step in range(steps):
        if on_step:
            on_step(step)
        x = make_input()
        if dbg:
            dbg.start(model)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        if dbg:
            dbg.stop()
            dbg.step()
    if dbg:
        dbg.close()
    return losses


def tensor_records(data: dict):
    """``(record path, tensor record)`` of every tensor record in a dump.json ``data``
    object (``"Functional.linear.0.forward.input_args.0"``, the record's dict), nested
    lists and dicts walked."""
    for name, entry in data.items():
        stack = [(name, entry)]
        while stack:
            path, v = stack.pop()
            if isinstance(v, dict) and v.get("type") == "torch.Tensor":
                yield path, v
            elif isinstance(v, dict):
                stack.extend((f"{path}.{k}", x) for k, x in v.items())
            elif isinstance(v, list):
                stack.extend((f"{path}.{i}", x) for i, x in enumerate(v))


#: value lists with every combination of NaN and the infinities (and a finite one)
NONFINITE = {
    "nan_and_inf": [1.0, float("nan"), float("inf"), -2.0],
    "inf_only_positive": [1.0, float("inf")],
    "neg_inf_only": [float("-inf"), float("-inf")],
    "nan_and_neg_inf": [float("nan"), float("-inf")],
    "both_infinities": [float("inf"), float("-inf"), float("nan")],
    "all_nan": [float("nan")] * 3,
    "finite": [0.5, -0.25, 3.0],
}


def device_ops():
    """``benchmarks/device_ops.py`` loaded as a module (the counter of msprobe's operations
    and synchronisations per recorded tensor on the device path)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "device_ops.py"
    spec = importlib.util.spec_from_file_location("msprobe_device_ops", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
