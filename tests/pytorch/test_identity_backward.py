"""Calls that hand their input back unchanged (dropout with p=0, nn.Identity): the backward
entry's ``output`` (gradient w.r.t. that input) is recorded during the backward pass, equal
to the gradient w.r.t. the returned tensor (it was null, and the entry written only at step())."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from msprobe.pytorch import PrecisionDebugger
from pt_helpers import assert_record, load_dump


def _record(tmp_path, fn, level="L1", net=None, at_stop=False):
    """Run ``fn`` under a debugger; return the step's dump.json ``data``. ``at_stop``: as
    stop() wrote it, checking that step() then adds nothing (the entries were complete
    when the backward pass returned)."""
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level=level)
    dbg.start(net) if net is not None else dbg.start()
    fn()
    dbg.stop()
    data = load_dump(tmp_path / "d")[0]["data"] if at_stop else None
    dbg.step()
    dbg.close()
    final = load_dump(tmp_path / "d")[0]["data"]
    if at_stop:
        assert final == data
    return final


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
    data = _record(tmp_path, lambda: net(x).square().sum().backward(), "mix", net, at_stop=True)
    g = _grad_of_h(net, x)
    for name in ("Module.ident.Identity.backward.0", "Functional.dropout.0.backward"):
        assert name in data, sorted(data)
        assert_record(data[name]["input"][0], g)
        assert_record(data[name]["output"][0], g)


def test_nested_identity_module_and_api(tmp_path):
    """nn.Dropout(0.0) hands back its input, and so does the F.dropout inside it: both
    backward entries hold the gradient w.r.t. the Dropout's input (the inner call's was
    missing: both its nodes left the graph)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 5), nn.Dropout(0.0), nn.Tanh(), nn.Linear(5, 3))
    x = torch.randn(4, 6)
    data = _record(tmp_path, lambda: net(x).square().sum().backward(), "mix", net, at_stop=True)
    lin0, lin1 = net[0], net[3]
    h = F.linear(x, lin0.weight.detach(), lin0.bias.detach()).requires_grad_()
    loss = F.linear(torch.tanh(h), lin1.weight.detach(), lin1.bias.detach()).square().sum()
    (g,) = torch.autograd.grad(loss, h)
    for name in ("Module.1.Dropout.backward.0", "Functional.dropout.0.backward"):
        assert name in data, sorted(data)
        assert_record(data[name]["input"][0], g)
        assert_record(data[name]["output"][0], g)
    # forward entries and the other backward entries are untouched by the identity
    assert_record(data["Functional.dropout.0.forward"]["output"][0], h.detach())
    assert data["Module.2.Tanh.backward.0"]["output"][0] is not None


def test_identity_output_with_two_uses(tmp_path):
    """The tensor an identity returns is used twice: both slots hold its whole gradient."""
    torch.manual_seed(0)
    w = torch.randn(3, 3, requires_grad=True)
    x = torch.randn(2, 3)

    def run():
        a = F.dropout(torch.matmul(x, w), p=0.0, training=True)
        (torch.relu(a).sum() + a.sum()).backward()

    data = _record(tmp_path, run, at_stop=True)
    hh = torch.matmul(x, w.detach()).requires_grad_()
    (g,) = torch.autograd.grad(torch.relu(hh).sum() + hh.sum(), hh)
    entry = data["Functional.dropout.0.backward"]
    assert_record(entry["input"][0], g)
    assert_record(entry["output"][0], g)


class _Pair(nn.Module):
    def forward(self, x):
        return x, x


def test_module_returning_its_input_twice(tmp_path):
    torch.manual_seed(0)
    lin, head = nn.Linear(4, 3), nn.Linear(3, 2)
    net = nn.ModuleDict({"lin": lin, "pair": _Pair(), "head": head})

    def run(x):
        a, b = net["pair"](net["lin"](x))
        return net["head"](torch.tanh(a) + 2 * b)

    x = torch.randn(5, 4)
    data = _record(tmp_path, lambda: run(x).square().sum().backward(), "mix", net, at_stop=True)
    h = F.linear(x, lin.weight.detach(), lin.bias.detach()).requires_grad_()
    loss = F.linear(torch.tanh(h) + 2 * h, head.weight.detach(), head.bias.detach()).square().sum()
    (g,) = torch.autograd.grad(loss, h)
    entry = data["Module.pair._Pair.backward.0"]
    assert len(entry["input"]) == 2 and len(entry["output"]) == 1
    for record in entry["input"] + entry["output"]:
        assert_record(record, g)


def test_identity_of_a_leaf(tmp_path):
    """The caller's tensor is a leaf (no node produced it): the gradient is taken at its
    gradient accumulator (the entry was missing)."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, requires_grad=True)
    p = nn.Parameter(torch.randn(3, 4))

    def run():
        y = F.dropout(x, p=0.0, training=True)
        (y * 3).sum().backward()
        q = F.dropout(p, p=0.0, training=True)  # the leaf has another use later
        (q.square().sum() + p.sum()).backward()

    data = _record(tmp_path, run)
    for name, g in (("Functional.dropout.0.backward", torch.full((3, 4), 3.0)),
                    ("Functional.dropout.1.backward", 2 * p.detach() + 1)):
        assert name in data, sorted(data)
        assert_record(data[name]["input"][0], g)
        assert_record(data[name]["output"][0], g)
    assert torch.equal(x.grad, torch.full((3, 4), 3.0))


def test_identity_module_on_a_leaf(tmp_path):
    torch.manual_seed(0)
    net = nn.ModuleDict({"ident": nn.Identity(), "lin": nn.Linear(4, 2)})
    x = torch.randn(3, 4, requires_grad=True)
    data = _record(tmp_path, lambda: net["lin"](net["ident"](x)).square().sum().backward(), "mix", net)
    xx = x.detach().requires_grad_()
    (g,) = torch.autograd.grad(net["lin"](xx).square().sum(), xx)
    entry = data["Module.ident.Identity.backward.0"]
    assert_record(entry["input"][0], g)
    assert_record(entry["output"][0], g)


def test_identity_of_a_same_shape_user_view(tmp_path):
    """``h = x.view_as(x)`` is the caller's own view: the identity's gradient is the one
    w.r.t. ``h``, not ``x``'s whole gradient (``x`` has another use)."""
    torch.manual_seed(0)
    w = torch.randn(4, 4, requires_grad=True)
    inp = torch.randn(3, 4)

    def run():
        x = torch.matmul(inp, w)
        h = x.view_as(x)
        a = F.dropout(h, p=0.0, training=True)
        (a.square().sum() + 3 * x.sum()).backward()

    data = _record(tmp_path, run)
    x = torch.matmul(inp, w.detach())
    h = x.view_as(x).requires_grad_()
    (g,) = torch.autograd.grad((h.square().sum() + 3 * x.sum()), h)
    entry = data["Functional.dropout.0.backward"]
    assert_record(entry["input"][0], g)
    assert_record(entry["output"][0], g)


class _Twice(nn.Module):
    def forward(self, x):
        return F.dropout(x, p=0.0, training=True) * 2


def test_identity_inside_a_module_whose_input_has_other_uses(tmp_path):
    """F.dropout(p=0) hands back the module's input, which autograd cannot tell from the
    module's input itself (no node is added to tell them apart: that would change the
    gradient sums): both its slots hold the whole gradient of that tensor, its use outside
    the module included; the module (no identity) records its own part."""
    torch.manual_seed(0)
    net = _Twice()
    w = torch.randn(4, 4, requires_grad=True)
    inp = torch.randn(3, 4)

    def run():
        h = torch.matmul(inp, w)
        (net(h).square().sum() + h.sum()).backward()

    data = _record(tmp_path, run, "mix", net)
    h = torch.matmul(inp, w.detach()).requires_grad_()
    d = h.detach().requires_grad_()
    (gm,) = torch.autograd.grad((h * 2).square().sum() + h.sum(), h)  # h's whole gradient
    entry = data["Functional.dropout.0.backward"]
    assert_record(entry["input"][0], gm)
    assert_record(entry["output"][0], gm)
    (g,) = torch.autograd.grad((d * 2).square().sum(), d)  # through the module alone
    assert_record(data["Module.model._Twice.backward.0"]["output"][0], g)
    o = (d.detach() * 2).requires_grad_()
    (go,) = torch.autograd.grad(o.square().sum(), o)  # w.r.t. the module's output
    assert_record(data["Module.model._Twice.backward.0"]["input"][0], go)


class _Wrap(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


def test_identity_nested_three_deep_and_loss_bits(tmp_path):
    """Three modules around nn.Dropout(0.0) around F.dropout, on a leaf: every entry has
    the gradient w.r.t. the leaf; the forward and the gradients are bit-identical to a
    run without the debugger."""
    def run(record: bool):
        torch.manual_seed(0)
        net = nn.Sequential(_Wrap(_Wrap(nn.Dropout(0.0))), nn.Linear(4, 3), nn.Tanh())
        x = torch.randn(5, 4, requires_grad=True)
        out = {}

        def body():
            out["y"] = net(x)
            out["loss"] = out["y"].square().sum()
            out["loss"].backward()

        data = _record(tmp_path / str(record), body, "mix", net) if record else body()
        return data, out, x.grad, net[1].weight.grad

    data, out, gx, gw = run(True)
    _, ref, rx, rw = run(False)
    assert torch.equal(out["y"], ref["y"]) and torch.equal(out["loss"], ref["loss"])
    assert torch.equal(gx, rx) and torch.equal(gw, rw)
    for name in ("Module.0._Wrap.backward.0", "Module.0.inner._Wrap.backward.0",
                 "Module.0.inner.inner.Dropout.backward.0", "Functional.dropout.0.backward"):
        assert name in data, sorted(data)
        assert_record(data[name]["input"][0], rx)
        assert_record(data[name]["output"][0], rx)


class _AndTanh(nn.Module):
    def forward(self, x):
        return x, torch.tanh(x)


class _DropAndTanh(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        return self.drop(x), torch.tanh(x)


class _UseThenWrite(nn.Module):
    def forward(self, x):
        a = x * 2
        x.relu_()
        return a + x


def test_input_view_that_stays_in_the_graph(tmp_path):
    """The call uses its input besides handing it back (or before writing it in place):
    the input view's node stays in the graph and receives only that use's gradient. The
    entry waits for the gradient w.r.t. the whole input (it was emitted early with the
    partial gradient, and the returned input's ``input`` slot null)."""
    torch.manual_seed(0)
    net = nn.ModuleDict({"rt": _AndTanh(), "o": _DropAndTanh(), "ip": _UseThenWrite()})
    w = torch.randn(4, 4, requires_grad=True)
    inp = torch.randn(3, 4)

    def run():
        for key in ("rt", "o"):
            a, b = net[key](torch.matmul(inp, w))
            (a.square().sum() + b.sum()).backward()
        net["ip"](torch.matmul(inp, w) * 1).square().sum().backward()

    data = _record(tmp_path, run, "mix", net)
    h = torch.matmul(inp, w.detach()).requires_grad_()
    (g,) = torch.autograd.grad(h.square().sum() + torch.tanh(h).sum(), h)
    for name in ("Module.rt._AndTanh.backward.0", "Module.o._DropAndTanh.backward.0"):
        entry = data[name]
        assert_record(entry["input"][0], g)  # the returned input: its whole gradient
        assert_record(entry["input"][1], torch.ones(3, 4))
        assert_record(entry["output"][0], g)
    entry = data["Module.o.drop.Dropout.backward.0"]  # the gradient w.r.t. its input view
    assert_record(entry["input"][0], g)
    assert_record(entry["output"][0], g)
    (gi,) = torch.autograd.grad((h * 2 + torch.relu(h)).square().sum(), h)
    assert_record(data["Module.ip._UseThenWrite.backward.0"]["output"][0], gi)


def test_identity_of_a_leaf_in_reentrant_checkpoint(tmp_path):
    """Reentrant checkpoint recomputes on detached leaf copies of its inputs: the
    recomputed dropout's entry has the gradient w.r.t. that copy."""
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    w = torch.randn(4, 4, requires_grad=True)
    inp = torch.randn(3, 4)

    def body(h):
        return torch.tanh(F.dropout(h, p=0.0, training=True))

    data = _record(tmp_path, lambda: checkpoint(body, torch.matmul(inp, w), use_reentrant=True).sum().backward())
    h = torch.matmul(inp, w.detach()).requires_grad_()
    (g,) = torch.autograd.grad(torch.tanh(h).sum(), h)
    entry = data["Functional.dropout.1.backward"]
    assert_record(entry["input"][0], g)
    assert_record(entry["output"][0], g)


def test_identity_of_a_leaf_keeps_nothing_alive(tmp_path):
    """The leaf's gradient accumulator the entry keeps does not keep the entry, the
    accumulator or the leaf alive past the step, with or without a backward pass."""
    import gc
    import weakref

    refs = []

    def run():
        for backward in (False, True):
            x = torch.randn(3, 4, requires_grad=True)
            refs.append(weakref.ref(x))
            y = F.dropout(F.dropout(x, p=0.0, training=True), p=0.0, training=True)
            if backward:
                y.sum().backward()

    _record(tmp_path, run)
    gc.collect()
    assert [r() for r in refs] == [None, None]  # the accumulator holds its leaf


class _DropThenWrite(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        y = self.drop(x)
        y.mul_(2)
        return y


def test_identity_output_written_in_place_by_the_enclosing_module(tmp_path):
    """``y = self.drop(x); y.mul_(2); return y``: the dropout entries' hooks sat on the
    module's input view, whose node leaves the graph when ``mul_`` writes it (they were
    missing), and ``mul_``'s output slot sat on the node the module's view gets after the
    write, which leaves the graph when the module hands the caller's tensor back (null)."""
    torch.manual_seed(0)
    net = nn.ModuleDict({"dw": _DropThenWrite()})
    w = torch.randn(4, 4, requires_grad=True)
    inp = torch.randn(3, 4)

    def run():
        net["dw"](torch.matmul(inp, w) * 1).square().sum().backward()

    data = _record(tmp_path, run, "mix", net)
    h = (torch.matmul(inp, w.detach()) * 1).requires_grad_()
    (g,) = torch.autograd.grad((h * 2).square().sum(), h)  # w.r.t. the value before the write
    for name in ("Module.dw.drop.Dropout.backward.0", "Functional.dropout.0.backward"):
        assert name in data, sorted(data)
        assert_record(data[name]["input"][0], g)
        assert_record(data[name]["output"][0], g)
    y = (h.detach() * 2).requires_grad_()
    (gy,) = torch.autograd.grad(y.square().sum(), y)  # w.r.t. the value after the write
    assert_record(data["Tensor.mul_.0.backward"]["input"][0], gy)
    assert_record(data["Tensor.mul_.0.backward"]["output"][0], g)
    assert_record(data["Module.dw._DropThenWrite.backward.0"]["input"][0], gy)
    assert_record(data["Module.dw._DropThenWrite.backward.0"]["output"][0], g)


class _Containers(nn.Module):
    Pair = __import__("collections").namedtuple("Pair", "a b")

    def forward(self, x):
        return {"d": x, "n": self.Pair(x, 2)}


def test_identity_in_containers_no_grad_and_retained_graph(tmp_path):
    """The input handed back inside a dict and a namedtuple; an identity under no_grad has
    no backward entry; with retain_graph and a second pass the entry holds the sum of both
    passes' gradients (tests/pytorch/test_repeated_backward.py)."""
    torch.manual_seed(0)
    net = nn.ModuleDict({"c": _Containers()})
    w = torch.randn(4, 4, requires_grad=True)
    inp = torch.randn(3, 4)

    def run():
        out = net["c"](torch.matmul(inp, w))
        (out["d"].square().sum() + out["n"].a.sum()).backward()
        with torch.no_grad():
            F.dropout(torch.matmul(inp, w), p=0.0, training=True)
        h = torch.matmul(inp, w)
        loss = F.dropout(h, p=0.0, training=True).square().sum()
        loss.backward(retain_graph=True)
        (loss * 3).backward()

    data = _record(tmp_path, run, "mix", net)
    h = torch.matmul(inp, w.detach()).requires_grad_()
    (g,) = torch.autograd.grad(h.square().sum() + h.sum(), h)
    entry = data["Module.c._Containers.backward.0"]
    assert_record(entry["input"][0]["d"], g)
    assert_record(entry["input"][0]["n"]["a"], g)
    assert entry["input"][0]["n"]["b"] is None
    assert_record(entry["output"][0], g)
    assert "Functional.dropout.0.backward" not in data  # under no_grad
    entry = data["Functional.dropout.1.backward"]
    assert_record(entry["input"][0], 2 * h.detach() + 3 * (2 * h.detach()))
    assert_record(entry["output"][0], 2 * h.detach() + 3 * (2 * h.detach()))


class _ClampNoGrad(nn.Module):
    """Writes its input in place where autograd does not see it, and hands it back."""

    def forward(self, x):
        with torch.no_grad():
            x.clamp_(-1.0, 1.0)
        return x


def test_input_written_under_no_grad_and_handed_back(tmp_path):
    """A write under no_grad leaves the caller's tensor where autograd had it: the call is
    an identity for autograd, both slots hold the gradient w.r.t. the returned tensor. On
    a leaf the entry was missing (no node to hook); on a non-leaf both hooks sat on one
    node, the ``output`` one first, and the entry was emitted before the ``input`` slot
    was filled (null)."""
    torch.manual_seed(0)
    net = nn.ModuleDict({"leaf": _ClampNoGrad(), "mid": _ClampNoGrad(), "lin": nn.Linear(4, 2)})
    p = nn.Parameter(torch.randn(3, 4) * 2)
    x = torch.randn(3, 4, requires_grad=True)

    def run():
        net["lin"](net["leaf"](p)).square().sum().backward()
        net["lin"](net["mid"](x * 2)).square().sum().backward()

    data = _record(tmp_path, run, "mix", net, at_stop=True)
    lin = net["lin"]
    for name, value in (("Module.leaf._ClampNoGrad.backward.0", p.detach()),
                        ("Module.mid._ClampNoGrad.backward.0", (x.detach() * 2).clamp(-1.0, 1.0))):
        h = value.clone().requires_grad_()
        (g,) = torch.autograd.grad(F.linear(h, lin.weight.detach(), lin.bias.detach()).square().sum(), h)
        assert name in data, sorted(data)
        assert_record(data[name]["input"][0], g)
        assert_record(data[name]["output"][0], g)


class _ClampNoGradThenUse(nn.Module):
    def forward(self, x):
        with torch.no_grad():
            x.clamp_(-1.0, 1.0)
        return x * 3


def test_leaf_written_under_no_grad_and_used(tmp_path):
    """The call writes a leaf under no_grad and uses it: the ``output`` slot holds the
    leaf's gradient (it was null: a leaf has no node to move the hook to)."""
    torch.manual_seed(0)
    net = nn.ModuleDict({"c": _ClampNoGradThenUse()})
    p = nn.Parameter(torch.randn(3, 4) * 2)
    data = _record(tmp_path, lambda: net["c"](p).square().sum().backward(), "mix", net)
    h = p.detach().clone().requires_grad_()
    (g,) = torch.autograd.grad((h * 3).square().sum(), h)
    entry = data["Module.c._ClampNoGradThenUse.backward.0"]
    assert_record(entry["input"][0], 2 * 3 * h.detach())
    assert_record(entry["output"][0], g)


def test_view_written_under_no_grad_and_handed_back_nested(tmp_path):
    """The caller's tensor is its own view (``u = h.view_as(h)``, of a non-leaf or of a
    leaf): a no_grad write makes autograd rebuild the view's node, which later uses read;
    the entry's hooks go there (the one over a leaf had a null ``output``). Nested in a
    module that hands its input back, the inner entry's hooks move with the outer's."""
    torch.manual_seed(0)
    net = nn.ModuleDict({"c": _ClampNoGrad(), "w": _Wrap(_ClampNoGrad()), "lin": nn.Linear(4, 2)})
    x = torch.randn(3, 4, requires_grad=True)
    p = nn.Parameter(torch.randn(3, 4) * 2)

    def run():
        h = x * 2
        net["lin"](net["c"](h.view_as(h))).square().sum().backward()
        net["lin"](net["c"](p.view_as(p))).square().sum().backward()
        net["lin"](net["w"](x * 2)).square().sum().backward()

    data = _record(tmp_path, run, "mix", net, at_stop=True)
    lin = net["lin"]
    clamped = (x.detach() * 2).clamp(-1.0, 1.0)
    for names, value in ((["Module.c._ClampNoGrad.backward.0"], clamped),
                         (["Module.c._ClampNoGrad.backward.1"], p.detach()),
                         (["Module.w._Wrap.backward.0", "Module.w.inner._ClampNoGrad.backward.0"], clamped)):
        h = value.clone().requires_grad_()
        (g,) = torch.autograd.grad(F.linear(h, lin.weight.detach(), lin.bias.detach()).square().sum(), h)
        for name in names:
            assert name in data, sorted(data)
            assert_record(data[name]["input"][0], g)
            assert_record(data[name]["output"][0], g)


class _MulInPlace(nn.Module):
    def forward(self, x):
        x.mul_(2)
        return x


def test_part_of_a_larger_tensor_written_in_place(tmp_path):
    """The input is a part of a larger tensor (``h[1:3]``, ``p[0:2]``), written in place by
    a recorded op, or under no_grad, and handed back: the write rebases the whole tensor,
    so the part's own node leaves the graph; the ``output`` slot holds the part of the
    whole tensor's gradient taken where it was produced (it was null)."""
    torch.manual_seed(0)
    net = nn.ModuleDict({"m": _MulInPlace(), "c": _ClampNoGrad(), "lin": nn.Linear(4, 2)})
    x = torch.randn(4, 4, requires_grad=True)
    p = nn.Parameter(torch.randn(3, 4) * 2)
    lin = net["lin"]

    def head(t):
        return F.linear(t, lin.weight.detach(), lin.bias.detach()).square().sum()

    def run():
        h = x * 2
        (net["lin"](net["m"](h[1:3])).square().sum() + h.sum()).backward()
        h = x * 2
        net["lin"](net["c"](h.t()[1:3])).square().sum().backward()
        net["lin"](net["c"](p[0:2])).square().sum().backward()

    data = _record(tmp_path, run, "mix", net)
    # 1) h[1:3].mul_(2): the loss reads y = 2 * h[1:3] through the head and h.sum()
    u = (x.detach() * 2)[1:3].clone().requires_grad_()
    y = u * 2
    (gu,) = torch.autograd.grad(head(y) + y.sum(), u)
    yy = y.detach().requires_grad_()
    (gy,) = torch.autograd.grad(head(yy) + yy.sum(), yy)
    for name in ("Module.m._MulInPlace.backward.0", "Tensor.mul_.0.backward"):
        assert name in data, sorted(data)
        assert_record(data[name]["input"][0], gy)
        assert_record(data[name]["output"][0], gu)
    # 2) and 3) clamped under no_grad: identities for autograd (a non-contiguous part; a leaf's part)
    for n, value in ((0, (x.detach() * 2).t()[1:3].clamp(-1.0, 1.0)), (1, p.detach()[0:2])):
        h = value.clone().requires_grad_()
        (g,) = torch.autograd.grad(head(h), h)
        entry = data[f"Module.c._ClampNoGrad.backward.{n}"]
        assert_record(entry["input"][0], g)
        assert_record(entry["output"][0], g)


def test_part_of_a_transposed_tensor_written_in_place(tmp_path):
    """The whole tensor's layout differs from its gradient's (a transposed copy; its
    gradient is row-major): the part is cut from the gradient laid out as the tensor; the recorder's own
    tensor operations on the gradient are not recorded as calls."""
    torch.manual_seed(0)
    x = torch.randn(4, 4, requires_grad=True)
    m = torch.randn(16)

    def run():
        h = x.mT.clone()  # strides (1, 4), not a view
        assert h.stride() == (1, 4) and not h._is_view()
        h[1:3].mul_(3)
        (h.reshape(-1) * m).square().sum().backward()  # h's gradient comes row-major

    data = _record(tmp_path, run, at_stop=True)
    assert sorted(data) == ["Tensor.__getitem__.0.forward", "Tensor.__mul__.0.backward",
                            "Tensor.__mul__.0.forward", "Tensor.mul_.0.backward", "Tensor.mul_.0.forward",
                            "Tensor.reshape.0.backward", "Tensor.reshape.0.forward",
                            "Tensor.square.0.backward", "Tensor.square.0.forward", "Tensor.sum.0.backward",
                            "Tensor.sum.0.forward"]
    h0 = x.detach().mT.clone()
    u = h0[1:3].clone().requires_grad_()
    def loss(part):
        return (torch.cat([h0[:1], part, h0[3:]]).reshape(-1) * m).square().sum()

    (gu,) = torch.autograd.grad(loss(u * 3), u)
    y = (u.detach() * 3).requires_grad_()
    (gy,) = torch.autograd.grad(loss(y), y)
    entry = data["Tensor.mul_.0.backward"]
    assert_record(entry["input"][0], gy)
    assert_record(entry["output"][0], gu)


def test_part_written_under_no_grad_and_handed_back_with_other_uses(tmp_path):
    """A part of a larger tensor (``h.t()[1:3]``, ``p[0:2]``) clamped under no_grad and handed
    back is an identity for autograd (docs/pytorch.md): both slots hold the gradient w.r.t.
    the returned part, even when the whole tensor has other uses (``5 * h.sum()``). The
    ``output`` slot held the part of the whole tensor's gradient (those other uses included)."""
    torch.manual_seed(0)
    net = nn.ModuleDict({"c": _ClampNoGrad(), "lin": nn.Linear(4, 2)})
    x = torch.randn(4, 4, requires_grad=True)
    p = nn.Parameter(torch.randn(3, 4) * 2)
    lin = net["lin"]
    p0 = p.detach().clone()

    def run():
        h = x * 2
        (net["lin"](net["c"](h.t()[1:3])).square().sum() + 5 * h.sum()).backward()
        (net["lin"](net["c"](p[0:2])).square().sum() + 5 * p.sum()).backward()

    data = _record(tmp_path, run, "mix", net)
    for n, value in ((0, (x.detach() * 2).t()[1:3].clamp(-1.0, 1.0)), (1, p0[0:2].clamp(-1.0, 1.0))):
        u = value.clone().requires_grad_()
        (g,) = torch.autograd.grad(F.linear(u, lin.weight.detach(), lin.bias.detach()).square().sum(), u)
        entry = data[f"Module.c._ClampNoGrad.backward.{n}"]
        assert_record(entry["input"][0], g)
        assert_record(entry["output"][0], g)
