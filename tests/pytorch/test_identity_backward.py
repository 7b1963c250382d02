"""Calls that hand their input back unchanged (dropout with p=0, nn.Identity): the backward
entry's ``output`` (gradient w.r.t. that input) is recorded during the backward pass, equal
to the gradient w.r.t. the returned tensor (it was null, and the entry written only at step())."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from msprobe.pytorch import PrecisionDebugger
from pt_helpers import assert_record, load_dump


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 5)
        self.ident = nn.Identity()
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        h = self.lin(x)
        h = self.ident(h)
        h = F.dropout(h, p=0.0, training=True)
        return self.head(torch.tanh(h))


def _grad_of_h(net: _Net, x: torch.Tensor) -> torch.Tensor:
    """Gradient of the loss w.r.t. the first Linear's output, by autograd alone."""
    h = F.linear(x, net.lin.weight.detach(), net.lin.bias.detach()).requires_grad_()
    loss = F.linear(torch.tanh(h), net.head.weight.detach(), net.head.bias.detach()).square().sum()
    (g,) = torch.autograd.grad(loss, h)
    return g


def test_identity_calls_record_the_gradient_wrt_their_input(tmp_path):
    torch.manual_seed(0)
    net = _Net()
    x = torch.randn(4, 6)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    dbg.start(net)
    net(x).square().sum().backward()
    dbg.stop()
    # the entries are complete when backward returns: stop() wrote them, step() adds nothing
    data = load_dump(tmp_path / "d")[0]["data"]
    dbg.step()
    dbg.close()
    g = _grad_of_h(net, x)
    for name in ("Module.ident.Identity.backward.0", "Functional.dropout.0.backward"):
        assert name in data, sorted(data)
        assert_record(data[name]["input"][0], g)
        assert_record(data[name]["output"][0], g)
    assert load_dump(tmp_path / "d")[0]["data"] == data
