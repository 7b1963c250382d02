"""Several backward passes over one graph in a step: a backward entry holds the sum of the
gradients of every pass, as ``.grad`` accumulates them. Checked on ``backward(retain_graph=True)``
followed by a second loss's ``backward()`` and on a WGAN-style gradient penalty
(``torch.autograd.grad(..., create_graph=True)`` then ``backward()``), for API and module
entries, against tensor hooks of an unrecorded run; training stays bit-identical. A pass
whose earlier sums were not kept is reported once in the log."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import torch.nn as nn

from msprobe.pytorch import PrecisionDebugger
from pt_helpers import load_dump


def _check(rec: dict, t: torch.Tensor) -> None:
    a = t.detach().double().numpy().ravel()
    assert rec["shape"] == list(t.shape)
    assert rec["Max"] == float(t.max()) and rec["Min"] == float(t.min())
    assert rec["Norm"] == pytest.approx(float(np.sqrt((a * a).sum())), rel=1e-6)
    assert rec["Mean"] == pytest.approx(float(a.mean()), rel=1e-6, abs=1e-9)


class Summed:
    """Tensor hooks that add up a tensor's gradient over every pass (read only)."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}

    def watch(self, name: str, t: torch.Tensor) -> None:
        def hook(g):
            self.sums[name] = g.detach().clone() if name not in self.sums else self.sums[name] + g.detach()
        t.register_hook(hook)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 5)
        self.act = nn.Tanh()
        self.out = nn.Linear(5, 1)

    def forward(self, x, probe=None):
        h = self.fc(x)
        a = self.act(h)
        if probe is not None:
            probe.watch("h", h)
            probe.watch("a", a)
        return self.out(a)


def _two_losses(dump_path=None, level="mix"):
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(3, 4, requires_grad=True)
    probe = None if dump_path else Summed()
    if probe:
        probe.watch("x", x)
    dbg = PrecisionDebugger(dump_path=str(dump_path), level=level, model=net) if dump_path else None
    if dbg:
        dbg.start()
    y = net(x, probe)
    loss1 = y.square().sum()
    loss2 = torch.sin(y).sum()
    loss1.backward(retain_graph=True)
    loss2.backward()
    if dbg:
        dbg.stop()
        dbg.step()
        dbg.close()
    grads = [x.grad.clone()] + [p.grad.clone() for p in net.parameters()]
    return grads, probe


def test_retain_graph_then_second_backward(tmp_path):
    ref, probe = _two_losses()
    got, _ = _two_losses(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(got, ref))
    data = load_dump(tmp_path)[0]["data"]
    # module entries: the sum over both passes
    fc = data["Module.fc.Linear.backward.0"]
    _check(fc["input"][0], probe.sums["h"])
    _check(fc["output"][0], probe.sums["x"])
    act = data["Module.act.Tanh.backward.0"]
    _check(act["input"][0], probe.sums["a"])
    _check(act["output"][0], probe.sums["h"])
    # the API entry inside Tanh
    tanh = data["Torch.tanh.0.backward"]
    _check(tanh["input"][0], probe.sums["a"])
    _check(tanh["output"][0], probe.sums["h"])
    # parameters_grad: the accumulated .grad
    _check(data["Module.fc.Linear.parameters_grad"]["weight"][0], ref[1])


def _penalty(dump_path=None, steps=2):
    """WGAN-GP critic steps: the gradient penalty needs autograd.grad with create_graph."""
    torch.manual_seed(0)
    critic = Net()
    opt = torch.optim.SGD(critic.parameters(), lr=0.05)
    dbg = PrecisionDebugger(dump_path=str(dump_path), level="mix", model=critic) if dump_path else None
    probes, losses = [], []
    for _ in range(steps):
        real, fake = torch.randn(6, 4), torch.randn(6, 4)
        eps = torch.rand(6, 1)
        if dbg:
            dbg.start()
        probe = None if dbg else Summed()
        interp = (eps * real + (1 - eps) * fake).requires_grad_(True)
        if probe:
            probe.watch("x", interp)
        score = critic(interp, probe)
        (g,) = torch.autograd.grad(score.sum(), interp, create_graph=True)
        gp = ((g.norm(2, dim=1) - 1) ** 2).mean()
        loss = critic(fake).mean() - critic(real).mean() + 10 * gp
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        probes.append(probe)
        if dbg:
            dbg.stop()
            dbg.step()
    if dbg:
        dbg.close()
    return losses, [p.detach().clone() for p in critic.parameters()], probes


def test_gradient_penalty(tmp_path):
    ref_losses, ref_params, probes = _penalty()
    losses, params, _ = _penalty(tmp_path)
    assert losses == ref_losses
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))
    for step, probe in enumerate(probes):
        data = load_dump(tmp_path, step)[0]["data"]
        fc = data["Module.fc.Linear.backward.0"]  # the interpolated batch's call
        _check(fc["input"][0], probe.sums["h"])
        _check(fc["output"][0], probe.sums["x"])
        _check(data["Module.act.Tanh.backward.0"]["input"][0], probe.sums["a"])
        _check(data["Torch.tanh.0.backward"]["output"][0], probe.sums["h"])


def test_unsummable_pass_is_reported_once(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="msprobe")
    x = torch.randn(4, requires_grad=True)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    dbg.start()
    y = torch.add(x, 1)  # AddBackward keeps nothing: a graph not retained runs again
    z = torch.add(y, 2)
    z.sum().backward()
    z.sum().backward()
    z.sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    lost = [r for r in caplog.records if "further backward pass" in r.getMessage()]
    assert len(lost) == 1
    data = load_dump(tmp_path)[0]["data"]
    assert data["Torch.add.0.backward"]["input"][0]["Max"] == 1.0  # the first pass's gradient
    assert torch.equal(x.grad, torch.full((4,), 3.0))


def test_backward_after_step_is_reported_once(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="msprobe")
    x = torch.randn(4, requires_grad=True)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1", step=[0, 1])
    dbg.start()
    y = torch.mul(torch.mul(x, 2), 3)
    dbg.stop()
    dbg.step()  # step 0 ends before its backward
    y.sum().backward()
    dbg.close()
    late = [r for r in caplog.records if "after step() ended step 0" in r.getMessage()]
    assert len(late) == 1
    assert torch.equal(x.grad, torch.full((4,), 6.0))
    data = load_dump(tmp_path)[0]["data"]
    assert "Torch.mul.0.backward" not in data and "Torch.mul.0.forward" in data


def _penalty_on_inputs(dump_path=None):
    """``autograd.grad(y, x, create_graph=True)`` needs no weight gradient of the last
    Linear; the final ``backward()`` gives it. Returns (loss, params, (last Linear's weight
    grad, its bias grad))."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 1))
    dbg = PrecisionDebugger(dump_path=str(dump_path), level="L1", model=model) if dump_path else None
    x = torch.randn(5, 6, requires_grad=True)
    if dbg:
        dbg.start()
    y = model(x).sum()
    (g,) = torch.autograd.grad(y, x, create_graph=True)
    loss = y * 0.01 + g.norm(2, dim=1).sub(1).pow(2).mean()
    loss.backward()
    if dbg:
        dbg.stop()
        dbg.step()
        dbg.close()
    return loss.detach(), [p.detach().clone() for p in model.parameters()], (model[2].weight.grad.clone(),
                                                                           model[2].bias.grad.clone())


def test_weight_gradient_only_in_the_later_pass_is_recorded(tmp_path, caplog):
    """A gradient absent from an earlier pass that retained the graph (not needed there) is
    no lost sum: the later pass's value is recorded, and nothing is reported as lost."""
    caplog.set_level(logging.WARNING, logger="msprobe")
    ref_loss, ref_params, (ref_w_grad, ref_b_grad) = _penalty_on_inputs()
    loss, params, _ = _penalty_on_inputs(tmp_path)
    assert torch.equal(loss, ref_loss) and all(torch.equal(a, b) for a, b in zip(params, ref_params))
    assert not [r for r in caplog.records if "further backward pass" in r.getMessage()]
    data = load_dump(tmp_path)[0]["data"]
    entry = data["Functional.linear.1.backward"]
    # the gradients w.r.t. the weight and bias arguments: the later pass's (.grad)
    _check(entry["output"][1], ref_w_grad)
    _check(entry["output"][2], ref_b_grad)
