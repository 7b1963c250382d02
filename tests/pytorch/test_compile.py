"""torch.compile: recording a compiled model never raises or stops with an internal error,
changes no bit of the losses, gradients and parameters, and records what runs eagerly: the
``_orig_mod`` module around the compiled call (forward and backward), every parameter's
gradient, and the API calls outside the compiled region (docs/pytorch.md, "torch.compile").
Backends ``eager``, ``aot_eager`` and ``inductor`` (the last where a C compiler exists),
levels L0, L1 and mix, the model compiled and warmed up before ``start()`` or traced for
the first time while recording."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from msprobe.pytorch import PrecisionDebugger

STEPS = 2
LINEARS = ("fc1", "fc2", "fc3")


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act1 = nn.ReLU()
        self.fc2 = nn.Linear(16, 16)
        self.act2 = nn.ReLU()
        self.fc3 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc3(self.act2(self.fc2(self.act1(self.fc1(x)))))


def _backends() -> list:
    out = [pytest.param("eager"), pytest.param("aot_eager")]
    cc = shutil.which("gcc") or shutil.which("cc") or shutil.which("clang")
    out.append(pytest.param("inductor", marks=pytest.mark.skipif(cc is None, reason="inductor needs a C compiler")))
    return out


def train(backend: str, level=None, dump_path=None, warm_up: bool = True):
    """``STEPS`` SGD steps of the compiled MLP; returns (losses, grads per step, params, dbg)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = MLP()
    compiled = torch.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs = [torch.randn(4, 8) for _ in range(STEPS)]
    ys = [torch.randn(4, 4) for _ in range(STEPS)]
    if warm_up:  # compiled (forward and backward) before recording starts
        F.mse_loss(compiled(xs[0]), ys[0]).backward()
        opt.zero_grad()
    dbg = PrecisionDebugger(dump_path=str(dump_path), level=level, task="statistics",
                            model=compiled) if level else None
    losses, grads, outs = [], [], []
    for x, y in zip(xs, ys):
        if dbg:
            dbg.start()
        out = compiled(x)
        loss = F.mse_loss(out, y)
        loss.backward()
        losses.append(loss.detach().clone())
        outs.append(out.detach().clone())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
        if dbg:
            dbg.stop()
            dbg.step()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return losses, grads, params, outs, xs, dbg


_REFERENCE: dict = {}


def reference(backend: str):
    if backend not in _REFERENCE:
        _REFERENCE[backend] = train(backend)
    return _REFERENCE[backend]


def _f64(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def check(backend: str, level: str, tmp_path, warm_up: bool) -> None:
    ref_losses, ref_grads, ref_params, ref_outs, xs, _ = reference(backend)
    losses, grads, params, outs, _, dbg = train(backend, level, tmp_path, warm_up=warm_up)
    try:
        assert not dbg.session.failed  # no internal error stopped recording
        for a, b in zip(losses, ref_losses):
            assert torch.equal(a, b)
        for g, rg in zip(grads, ref_grads):
            assert g.keys() == rg.keys() and all(torch.equal(g[n], rg[n]) for n in g)
        assert all(torch.equal(params[n], ref_params[n]) for n in params)
        for step in range(STEPS):
            data = json.loads((tmp_path / f"step{step}" / "rank" / "dump.json").read_text())["data"]
            if level in ("L0", "mix"):
                fwd = data["Module._orig_mod.MLP.forward.0"]
                x = _f64(xs[step])
                assert fwd["input_args"][0]["Norm"] == pytest.approx(np.linalg.norm(x), rel=1e-12)
                assert fwd["input_args"][0]["Max"] == x.max()
                assert fwd["output"][0]["Norm"] == pytest.approx(np.linalg.norm(_f64(ref_outs[step])), rel=1e-12)
                assert sorted(fwd["parameters"]) == []  # the MLP owns no parameters itself
                bwd = data["Module._orig_mod.MLP.backward.0"]
                assert bwd["input"][0]["shape"] == [4, 4]
                assert bwd["output"][0] is None  # the input needs no gradient
                for name in LINEARS:
                    entry = data[f"Module._orig_mod.{name}.Linear.parameters_grad"]
                    for pname in ("weight", "bias"):
                        expect = np.linalg.norm(_f64(ref_grads[step][f"{name}.{pname}"]))
                        assert entry[pname][0]["Norm"] == pytest.approx(expect, rel=1e-12)
                # modules inside the compiled region run without hooks: no entries of their own
                assert not any(k.startswith("Module._orig_mod.fc1.Linear.forward") for k in data)
            else:
                assert not any(k.startswith("Module.") for k in data)
            if level in ("L1", "mix"):
                mse = data["Functional.mse_loss.0.forward"]  # outside the compiled region
                assert mse["input_args"][0]["Norm"] == pytest.approx(np.linalg.norm(_f64(ref_outs[step])), rel=1e-12)
                assert mse["output"][0]["Max"] == pytest.approx(float(ref_losses[step]), rel=1e-7)
                assert "Functional.mse_loss.0.backward" in data
                # the compiled runtime's own calls (AOTAutograd's gradient copies) are not recorded
                assert "Tensor.copy_.0.forward" not in data
    finally:
        dbg.close()


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
@pytest.mark.parametrize("backend", _backends())
def test_compiled_before_start(backend, level, tmp_path):
    check(backend, level, tmp_path, warm_up=True)


@pytest.mark.parametrize("backend", _backends())
def test_compiled_while_recording(backend, tmp_path):
    check(backend, "mix", tmp_path, warm_up=False)


def test_fake_tensors_get_no_values(tmp_path):
    """Under a user's FakeTensorMode (outside torch.compile) a call is recorded with the
    tensors' dtype and shape and null statistics; nothing reads their (absent) data."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    for task in ("statistics", "tensor"):
        path = tmp_path / task
        dbg = PrecisionDebugger(dump_path=str(path), level="L1", task=task)
        dbg.start()
        with FakeTensorMode():
            x = torch.randn(3, 4, requires_grad=True)
            torch.relu(x).sum().backward()
        dbg.stop()
        dbg.step()
        assert not dbg.session.failed
        dbg.close()
        rec = json.loads((path / "step0" / "rank" / "dump.json").read_text())["data"]["Torch.relu.0.forward"]
        leaf = rec["input_args"][0]
        assert leaf["shape"] == [3, 4] and leaf["dtype"] == "torch.float32"
        assert leaf["Max"] is None and leaf["Norm"] is None and "data_name" not in leaf
