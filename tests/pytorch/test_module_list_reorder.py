"""A module that moves the elements of a list it was given (insert, pop, reverse, del,
extend with itself) gets the caller's tensors back in the caller's list after the call,
wherever they moved: a recorder view left there would carry the caller's later uses of
the element through the module's backward hook (its recorded gradient would include
them) and the caller's list would hold other objects than without msprobe."""
from __future__ import annotations

import pytest
import torch

from pt_helpers import assert_record, load_dump
from msprobe.pytorch import PrecisionDebugger

OPS = {
    "insert": lambda hs, out: hs.insert(0, out),
    "pop": lambda hs, out: hs.pop(0),
    "reverse": lambda hs, out: hs.reverse(),
    "del_slice": lambda hs, out: hs.__delitem__(slice(0, 1)),
    "extend_self": lambda hs, out: hs.extend(list(hs)),
}


class Mover(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, hs):
        out = hs[0] * 2
        OPS[self.op](hs, out)
        return out


class Net(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.m = Mover(op)

    def forward(self, a, b):
        hs = [a, b]
        out = self.m(hs)
        # the caller keeps using what the module left in its list
        return out.sum() + sum((h * h).sum() for h in hs), hs


def _run(op, tmp_path=None):
    a = torch.tensor([1.0, 2.0], requires_grad=True)
    b = torch.tensor([3.0, -1.0], requires_grad=True)
    net = Net(op)
    dbg = None
    if tmp_path is not None:
        dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0")
        dbg.start(model=net)
    loss, hs = net(a, b)
    loss.backward()
    if dbg is not None:
        dbg.step()
        dbg.close()
    names = ["a" if h is a else "b" if h is b else "new" for h in hs]
    return loss.detach(), a.grad, names


@pytest.mark.parametrize("op", sorted(OPS))
def test_moved_elements_come_back(tmp_path, op):
    loss0, ga0, names0 = _run(op)
    loss, ga, names = _run(op, tmp_path)
    assert names == names0  # the caller's own tensors, wherever the module moved them
    assert torch.equal(loss, loss0) and torch.equal(ga, ga0)
    bwd = load_dump(tmp_path / "d")[0]["data"]["Module.m.Mover.backward.0"]
    # out = 2 * hs[0] = 2a: the module contributed 2 * dL/dout to a, nothing of the
    # caller's own later uses of a
    g_out = 1 + 2 * (2 * torch.tensor([1.0, 2.0])) if op in ("insert",) else torch.ones(2)
    assert_record(bwd["input"][0], g_out)
    assert_record(bwd["output"][0][0], 2 * g_out)


class Twice(torch.nn.Module):
    def forward(self, xs, ys):
        out = xs[0] * ys[1]
        ys.reverse()
        return out


def test_list_given_twice_comes_back(tmp_path):
    """The same list as two arguments (its elements substituted twice, the second time by
    substitutes of the first substitutes) gets the caller's own tensors back."""
    a = torch.ones(2, requires_grad=True)
    b = torch.full((2,), 3.0, requires_grad=True)
    hs = [a, b]
    m = Twice()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0")
    dbg.start(model=m)
    m(hs, hs).sum().backward()
    dbg.stop()
    dbg.close()
    assert hs[0] is b and hs[1] is a
    assert a.grad.tolist() == [3.0, 3.0] and b.grad.tolist() == [1.0, 1.0]
