"""Shared networks and helpers for the MindSpore recorder tests.

Test modules call ``pytest.importorskip("mindspore")`` before importing this module, so
the whole directory is skipped cleanly where MindSpore is not installed."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, mint, nn, ops

ms.set_device("CPU")


class Net(nn.Cell):
    """Dense(4→3) → ReLU → ops.mul by 2 → Dense(3→2) → mint relu."""

    def __init__(self) -> None:
        super().__init__()
        self.d1 = nn.Dense(4, 3)
        self.relu = nn.ReLU()
        self.d2 = nn.Dense(3, 2)

    def construct(self, x):
        h = self.relu(self.d1(x))
        h = ops.mul(h, 2.0)
        return mint.nn.functional.relu(self.d2(h))


def make_net(seed: int = 0) -> Net:
    """A Net with deterministic weights (set from a numpy generator)."""
    rng = np.random.default_rng(seed)
    net = Net()
    for p in net.trainable_params():
        p.set_data(Tensor(rng.standard_normal(p.shape).astype(np.float32)))
    return net


def make_input(seed: int = 1) -> Tensor:
    return Tensor(np.random.default_rng(seed).standard_normal((5, 4)).astype(np.float32))


def load_dump(dump_path, step: int = 0, rank_dir: str = "rank") -> tuple[dict, dict, dict]:
    d = Path(dump_path) / f"step{step}" / rank_dir
    return tuple(json.loads((d / f).read_text()) for f in ("dump.json", "stack.json", "construct.json"))


def np_stats(a) -> dict:
    """Independent float64 statistics with numpy."""
    a = np.asarray(a.asnumpy() if isinstance(a, Tensor) else a)
    a = np.abs(a).astype(np.float64) if a.dtype.kind == "c" else a.astype(np.float32).astype(np.float64) \
        if a.dtype.kind not in "fiub" else a.astype(np.float64)
    return {"Max": float(a.max()), "Min": float(a.min()), "Mean": float(a.mean()),
            "Norm": float(np.sqrt((a * a).sum()))}


def assert_record(record: dict, expected, dtype: str = "Float32") -> None:
    """``record`` is a MindSpore tensor record of ``expected`` (Tensor or ndarray)."""
    arr = expected.asnumpy() if isinstance(expected, Tensor) else np.asarray(expected)
    assert record["type"] == "mindspore.Tensor"
    assert record["dtype"] == dtype
    assert record["shape"] == list(arr.shape)
    st = np_stats(arr)
    for key in ("Max", "Min", "Mean", "Norm"):
        assert record[key] == pytest.approx(st[key], rel=1e-6, abs=1e-7), key


def train_loop(net, x, dbg=None, steps: int = 2, level_model=True):
    """value_and_grad + SGD for ``steps`` steps; returns the losses (numpy float32)."""
    opt = nn.SGD(net.trainable_params(), 0.05)

    def fwd(inp):
        return (net(inp) * 1.5).sum()

    gf = ms.value_and_grad(fwd, None, opt.parameters)
    losses = []
    for _ in range(steps):
        if dbg is not None:
            dbg.start(net if level_model else None)
        loss, grads = gf(x)
        opt(grads)
        losses.append(loss.asnumpy())
        if dbg is not None:
            dbg.stop()
            dbg.step()
    return losses


def tensor_records(value):
    """Every record holding a ``data_name`` (a tensor file) in a dump.json value, in order."""
    if isinstance(value, dict):
        if "data_name" in value:
            yield value
        else:
            for v in value.values():
                yield from tensor_records(v)
    elif isinstance(value, list):
        for v in value:
            yield from tensor_records(v)
