"""Parameters frozen when recording begins and trained later get their ``parameters_grad``
entries: a GAN whose phases toggle ``requires_grad_`` within each step (the generator is
frozen at the first ``start()``) and progressive unfreezing across steps. Each entry holds
the ``.grad`` that an unrecorded run of the same script accumulates, and the training is
bit-identical to that run."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from msprobe.pytorch import PrecisionDebugger

STEPS = 3


def _norm(t: torch.Tensor) -> float:
    return float(np.linalg.norm(t.detach().double().numpy().ravel()))


def _entries(dump_path, step: int) -> dict:
    data = json.loads((dump_path / f"step{step}" / "rank" / "dump.json").read_text())["data"]
    return {k: v for k, v in data.items() if k.endswith(".parameters_grad")}


def _gan(dump_path=None, level="L0"):
    """Train a tiny GAN; returns (per step: {entry name: {param: grad}}, final params, losses)."""
    torch.manual_seed(0)
    gen = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 6))
    disc = nn.Sequential(nn.Linear(6, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))
    g_opt = torch.optim.SGD(gen.parameters(), lr=0.1)
    d_opt = torch.optim.SGD(disc.parameters(), lr=0.1)
    gen.requires_grad_(False)  # the discriminator phase comes first
    dbg = PrecisionDebugger(dump_path=str(dump_path), level=level, model=[gen, disc]) if dump_path else None
    expect, losses = [], []
    for _ in range(STEPS):
        if dbg:
            dbg.start()
        real, z = torch.randn(5, 6), torch.randn(5, 4)
        step = {}
        # discriminator phase
        gen.requires_grad_(False)
        disc.requires_grad_(True)
        d_opt.zero_grad()
        fake = gen(z)
        d_loss = (F.binary_cross_entropy_with_logits(disc(real), torch.ones(5, 1))
                  + F.binary_cross_entropy_with_logits(disc(fake), torch.zeros(5, 1)))
        d_loss.backward()
        step.update({("1", n): p.grad.clone() for n, p in disc.named_parameters()})
        d_opt.step()
        # generator phase
        disc.requires_grad_(False)
        gen.requires_grad_(True)
        g_opt.zero_grad()
        g_loss = F.binary_cross_entropy_with_logits(disc(gen(z)), torch.ones(5, 1))
        g_loss.backward()
        step.update({("0", n): p.grad.clone() for n, p in gen.named_parameters()})
        g_opt.step()
        losses += [d_loss.item(), g_loss.item()]
        expect.append(step)
        if dbg:
            dbg.stop()
            dbg.step()
    if dbg:
        dbg.close()
    params = [p.detach().clone() for p in list(gen.parameters()) + list(disc.parameters())]
    return expect, params, losses


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_gan_phases_record_both_networks(tmp_path, level):
    ref, ref_params, ref_losses = _gan()
    got, params, losses = _gan(tmp_path, level)
    assert losses == ref_losses
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))
    for step in range(STEPS):
        entries = _entries(tmp_path, step)
        names = {f"Module.{net}.{idx}.Linear.parameters_grad" for net in "01" for idx in "02"}
        assert set(entries) == names
        for (net, pname), grad in ref[step].items():
            idx, key = pname.split(".")
            rec = entries[f"Module.{net}.{idx}.Linear.parameters_grad"][key][0]
            assert rec["shape"] == list(grad.shape)
            assert rec["Max"] == float(grad.max()) and rec["Min"] == float(grad.min())
            assert rec["Norm"] == pytest.approx(_norm(grad), rel=1e-12)


class Tower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer1 = nn.Linear(6, 6)
        self.layer2 = nn.Linear(6, 6)
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        return self.head(torch.relu(self.layer2(torch.relu(self.layer1(x)))))


def _unfreeze(dump_path=None):
    """Progressive unfreezing: the head trains from step 0, layer2 from step 1, layer1 from step 2."""
    torch.manual_seed(0)
    model = Tower()
    model.layer1.requires_grad_(False)
    model.layer2.requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    dbg = PrecisionDebugger(dump_path=str(dump_path), level="L0", model=model) if dump_path else None
    grads = []
    for step in range(STEPS):
        if step == 1:
            model.layer2.requires_grad_(True)
        if step == 2:
            model.layer1.requires_grad_(True)
        if dbg:
            dbg.start()
        opt.zero_grad()
        model(torch.randn(4, 6)).square().mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        opt.step()
        if dbg:
            dbg.stop()
            dbg.step()
    if dbg:
        dbg.close()
    return grads, [p.detach().clone() for p in model.parameters()]


def test_progressive_unfreezing(tmp_path):
    ref, ref_params = _unfreeze()
    got, params = _unfreeze(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))
    trained = [("head",), ("layer2", "head"), ("layer1", "layer2", "head")]
    for step in range(STEPS):
        entries = _entries(tmp_path, step)
        assert set(entries) == {f"Module.{m}.Linear.parameters_grad" for m in trained[step]}
        for name, grad in ref[step].items():
            mod, key = name.split(".")
            rec = entries[f"Module.{mod}.Linear.parameters_grad"][key][0]
            assert rec["Norm"] == pytest.approx(_norm(grad), rel=1e-12)
            assert rec["Max"] == float(grad.max())


class AdaptedTower(Tower):
    """:class:`Tower` with an optional residual adapter after ``layer1``."""

    def __init__(self) -> None:
        super().__init__()
        self.adapter = None

    def forward(self, x):
        h = torch.relu(self.layer1(x))
        if self.adapter is not None:
            h = h + self.adapter(h)
        return self.head(torch.relu(self.layer2(h)))


def _attach(dump_path=None):
    """An adapter attached before step 1 and the head's weight replaced by a new Parameter
    before step 2 (both added to the optimizer). Returns (per step {param name: grad},
    final params, losses, the model)."""
    torch.manual_seed(0)
    model = AdaptedTower()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    dbg = PrecisionDebugger(dump_path=str(dump_path), level="mix", model=model) if dump_path else None
    grads, losses = [], []
    for step in range(STEPS):
        if step == 1:
            model.adapter = nn.Sequential(nn.Linear(6, 2), nn.Linear(2, 6))
            opt.add_param_group({"params": model.adapter.parameters()})
        if step == 2:
            model.head.weight = nn.Parameter(model.head.weight.detach() * 0.5)
            opt.add_param_group({"params": [model.head.weight]})
        if dbg:
            dbg.start()
        opt.zero_grad()
        loss = model(torch.randn(4, 6)).square().mean()
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        losses.append(loss.item())
        opt.step()
        if dbg:
            dbg.stop()
            dbg.step()
    if dbg:
        dbg.close()
    return grads, [p.detach().clone() for p in model.parameters()], losses, model


def test_modules_and_parameters_added_mid_run(tmp_path):
    ref, ref_params, ref_losses, _ = _attach()
    got, params, losses, model = _attach(tmp_path)
    assert losses == ref_losses
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))
    assert not model.layer1._forward_pre_hooks  # close() removed every hook, none left twice
    for step in range(STEPS):
        data = json.loads((tmp_path / f"step{step}" / "rank" / "dump.json").read_text())["data"]
        entries = {k: v for k, v in data.items() if k.endswith(".parameters_grad")}
        owners = {".".join(name.split(".")[:-1]) for name in ref[step]}
        want = {f"Module.{o}.Linear.parameters_grad" for o in owners}
        assert set(entries) == want
        for name, grad in ref[step].items():
            *path, key = name.split(".")
            recs = entries[f"Module.{'.'.join(path)}.Linear.parameters_grad"][key]
            assert len(recs) == 1, name  # one hook per parameter, old ones removed
            assert recs[0]["Norm"] == pytest.approx(_norm(grad), rel=1e-12)
            assert recs[0]["Max"] == float(grad.max())
        # every module call of the step has exactly one forward entry
        assert ("Module.adapter.0.Linear.forward.0" in data) == (step >= 1)
        assert "Module.layer1.Linear.forward.1" not in data
