"""A module that changes a list it was given (appends to it, replaces an element) changes
the caller's list, recorded or not: the backward taps put their views into the caller's
list for the call and the caller's elements back after it (before, the module got a copy
and the caller never saw the change). The gradients are still recorded per element."""
from __future__ import annotations

import torch

from pt_helpers import assert_record, load_dump
from msprobe.pytorch import PrecisionDebugger


class Collect(torch.nn.Module):
    def forward(self, hs, scale):
        h = hs[-1] * scale
        hs.append(h)
        return h


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Collect()
        self.b = Collect()

    def forward(self, x, hs):
        hs.append(x)
        self.a(hs, 2.0)
        self.b(hs, 3.0)
        return sum(h.sum() for h in hs)


def run(record, tmp_path=None):
    x = torch.tensor([1.0, -2.0], requires_grad=True)
    hs: list = []
    net = Net()
    dbg = None
    if record:
        dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0")
        dbg.start(model=net)
    loss = net(x, hs)
    loss.backward()
    if dbg is not None:
        dbg.step()  # emits b's backward entry: its input x got no gradient from b
        dbg.close()
    return x, hs, loss


def test_module_appends_reach_the_callers_list(tmp_path):
    x0, hs0, loss0 = run(False)
    x, hs, loss = run(True, tmp_path)
    assert len(hs) == len(hs0) == 3
    assert hs[0] is x  # the caller's own tensor again, not the recorder's view
    assert torch.equal(loss.detach(), loss0.detach())
    assert torch.equal(x.grad, x0.grad) and torch.equal(x.grad, torch.full((2,), 1 + 2 + 6.0))
    data = load_dump(tmp_path / "d")[0]["data"]
    # Module b got [x, 2x] and returned 6x: gradient w.r.t. its output is 1 (loss sums it);
    # its list input's elements get 0 (x: not used by b) and 3 (2x), as b contributed them
    bwd = data["Module.b.Collect.backward.0"]
    assert_record(bwd["input"][0], torch.ones(2))
    assert bwd["output"][0][0] is None
    assert_record(bwd["output"][0][1], torch.full((2,), 3.0))
    fwd = data["Module.b.Collect.forward.0"]
    assert len(fwd["input_args"][0]) == 2  # recorded before the call appended
