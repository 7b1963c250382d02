"""Module backward at the module's boundary, without changing the computation: ``input``
holds the gradient w.r.t. each output as the caller receives it (not the output's total
gradient when the module uses the output itself), containers such as dataclasses and
HF-style ``ModelOutput`` dicts get their entry, and one tensor in several argument slots
records the combined gradient once, with ``alias_of`` in the other slots."""
from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from msprobe.pytorch import PrecisionDebugger
from pt_helpers import assert_record, load_dump


def _record(tmp_path, net, run, level="mix"):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level=level)
    dbg.start(net)
    run()
    dbg.stop()
    dbg.step()
    dbg.close()
    return load_dump(tmp_path / "d")[0]["data"]


class _UsesItsOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        logits = self.lin(x)
        return {"logits": logits, "aux": logits.tanh()}


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = _UsesItsOutput()

    def forward(self, x):
        out = self.body(x)
        return (out["logits"] * 3).sum() + out["aux"].square().sum()


def test_output_gradient_is_the_callers(tmp_path):
    torch.manual_seed(0)
    net = _Outer()
    x = torch.randn(5, 4, requires_grad=True)
    data = _record(tmp_path, net, lambda: net(x).backward())
    logits = net.body.lin(x).detach().requires_grad_()
    aux = logits.tanh().detach().requires_grad_()
    loss = (logits * 3).sum() + aux.square().sum()
    g_logits, g_aux = torch.autograd.grad(loss, (logits, aux))  # as the caller receives them
    entry = data["Module.body._UsesItsOutput.backward.0"]
    assert_record(entry["input"][0]["logits"], g_logits)  # 3 everywhere, not 3 + the tanh path
    assert_record(entry["input"][0]["aux"], g_aux)
    xx = x.detach().requires_grad_()
    (gx,) = torch.autograd.grad(_Outer.forward(net, xx), xx)
    assert_record(entry["output"][0], gx)


@dataclasses.dataclass
class _Out:
    hidden: torch.Tensor
    scale: float


class _ReturnsDataclass(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return _Out(hidden=self.lin(x), scale=2.0)


class _DataclassUser(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _ReturnsDataclass()

    def forward(self, x):
        out = self.inner(x)
        return (out.hidden * out.scale).square().sum()


def test_dataclass_output_gets_its_backward_entry(tmp_path):
    torch.manual_seed(0)
    net = _DataclassUser()
    x = torch.randn(3, 4, requires_grad=True)
    data = _record(tmp_path, net, lambda: net(x).backward())
    h = net.inner.lin(x).detach().requires_grad_()
    (gh,) = torch.autograd.grad((h * 2.0).square().sum(), h)
    entry = data["Module.inner._ReturnsDataclass.backward.0"]
    assert list(entry["input"][0]) == ["hidden", "scale"]
    assert_record(entry["input"][0]["hidden"], gh)
    assert entry["input"][0]["scale"] is None
    xx = x.detach().requires_grad_()
    (gx,) = torch.autograd.grad(net(xx), xx)
    assert_record(entry["output"][0], gx)


class _Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, query, key, value):
        assert query is key is value  # the caller's identity is kept
        w = torch.softmax(self.q(query) @ self.k(key).T, dim=-1)
        return w @ self.v(value)


class _SelfAttn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = _Attn()

    def forward(self, y):
        return y + self.attn(y, y, y)


def test_one_tensor_in_several_slots_is_an_alias(tmp_path):
    torch.manual_seed(0)
    net = _SelfAttn()
    y = torch.randn(3, 4, requires_grad=True)
    data = _record(tmp_path, net, lambda: net(y).square().sum().backward())
    yy = y.detach().requires_grad_()
    a = net.attn(yy, yy, yy)
    (g_through_attn,) = torch.autograd.grad((yy.detach() + a).square().sum(), yy)
    entry = data["Module.attn._Attn.backward.0"]
    assert_record(entry["output"][0], g_through_attn)  # the combined gradient, once
    for slot in (1, 2):
        assert entry["output"][slot]["alias_of"] == "output.0"
        assert entry["output"][slot]["Norm"] == entry["output"][0]["Norm"]
    fwd = data["Module.attn._Attn.forward.0"]
    assert len(fwd["input_args"]) == 3


def test_recording_keeps_gradients_bit_identical(tmp_path):
    """The pattern whose sums a node per module input regroups: a residual next to a
    module that reads its input three times."""
    def grads(level=None):
        torch.manual_seed(0)
        net = _SelfAttn()
        y = (torch.randn(16, 4) * 3).requires_grad_()
        if level is None:
            net(y).square().sum().backward()
        else:
            _record(tmp_path / level, net, lambda: net(y).square().sum().backward(), level)
        return [y.grad] + [p.grad for p in net.parameters()]

    base = grads()
    for level in ("L0", "L1", "mix"):
        assert all(torch.equal(a, b) for a, b in zip(base, grads(level))), level
