"""A Cell applied twice in one step (weight sharing): each call's backward entry holds the
gradients of that very call, checked against the analytic gradient of a Dense layer in
numpy float64; ``null`` only where MindSpore itself computes no gradient (its own
``Cell.register_backward_hook`` hands ``None`` for that input)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")

from ms_helpers import assert_record, load_dump  # noqa: E402
from msprobe.mindspore import PrecisionDebugger  # noqa: E402

import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402


class Twice(nn.Cell):
    """``fc(fc(pre(x)))`` or, with ``pre=False``, ``fc(fc(x))``; ``fc`` is one Dense(4→4)."""

    def __init__(self, pre: bool) -> None:
        super().__init__()
        self.use_pre = pre
        self.pre = nn.Dense(4, 4)
        self.fc = nn.Dense(4, 4)

    def construct(self, x):
        h = self.pre(x) if self.use_pre else x
        return self.fc(self.fc(h))


def make(pre: bool):
    rng = np.random.default_rng(3)
    net = Twice(pre)
    for p in net.trainable_params():
        p.set_data(Tensor(rng.standard_normal(p.shape).astype(np.float32)))
    x = rng.standard_normal((3, 4)).astype(np.float32)
    c = rng.standard_normal((3, 4)).astype(np.float32)  # loss = sum(c * out): d loss / d out = c
    return net, x, c


def record(net, x, c, grad_position, tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0")
    fn = ms.value_and_grad(lambda i: (net(i) * Tensor(c)).sum(), grad_position, net.trainable_params())
    dbg.start(net)
    loss, _ = fn(Tensor(x))
    dbg.stop()
    dbg.step()
    dbg.close()
    return loss.asnumpy(), load_dump(tmp_path / "d")[0]["data"]


def analytic(net, x, c):
    """float64 forward values and gradients of ``fc(fc(h))`` (Dense: y = h W^T + b)."""
    w, b = (p.asnumpy().astype(np.float64) for p in (net.fc.weight, net.fc.bias))
    if net.use_pre:
        h = x.astype(np.float64) @ net.pre.weight.asnumpy().T.astype(np.float64) + net.pre.bias.asnumpy()
    else:
        h = x.astype(np.float64)
    y1 = h @ w.T + b
    y2 = y1 @ w.T + b
    g_y2 = c.astype(np.float64)
    g_y1 = g_y2 @ w  # backward.1 output: the gradient w.r.t. the second call's input y1
    g_h = g_y1 @ w   # backward.0 output: the gradient w.r.t. the first call's input h
    return dict(h=h, y1=y1, y2=y2, g_y2=g_y2, g_y1=g_y1, g_h=g_h)


@pytest.mark.parametrize("pre, grad_position", [(False, 0), (True, None), (True, 0)])
def test_both_calls_hold_the_gradient_wrt_their_own_input(tmp_path, pre, grad_position):
    net, x, c = make(pre)
    want = analytic(net, x, c)
    loss, data = record(net, x, c, grad_position, tmp_path)
    assert float(loss) == pytest.approx(float((want["y2"] * c).sum()), rel=1e-5)
    first, second = data["Cell.fc.Dense.backward.0"], data["Cell.fc.Dense.backward.1"]
    assert_record(second["input"][0], want["g_y2"])
    assert_record(second["output"][0], want["g_y1"])
    assert_record(first["input"][0], want["g_y1"])
    assert_record(first["output"][0], want["g_h"])
    assert_record(data["Cell.fc.Dense.forward.0"]["input_args"][0], want["h"])
    assert_record(data["Cell.fc.Dense.forward.1"]["input_args"][0], want["y1"])


def test_first_call_on_an_input_without_gradient_is_null_as_mindspore_reports(tmp_path):
    """``fc(fc(x))`` differentiated w.r.t. the weights only: no gradient w.r.t. ``x`` is
    computed. MindSpore's own backward hook of the Cell (unrecorded run) gets ``None`` as
    the first call's grad_input, and the recorded entry says ``null``; the second call's
    input (the first call's output) does get its gradient."""
    net, x, c = make(pre=False)
    want = analytic(net, x, c)
    seen = []
    handle = net.fc.register_backward_hook(lambda cell, grad_in, grad_out: seen.append(grad_in))
    ms.grad(lambda i: (net(i) * Tensor(c)).sum(), None, net.trainable_params())(Tensor(x))
    handle.remove()
    # backward order: the second call first
    assert [g is None for g in seen[0]] == [False] and [g is None for g in seen[1]] == [True]
    np.testing.assert_allclose(seen[0][0].asnumpy(), want["g_y1"], rtol=1e-5, atol=1e-6)

    _, data = record(net, x, c, None, tmp_path)
    assert data["Cell.fc.Dense.backward.0"]["output"] == [None]
    assert_record(data["Cell.fc.Dense.backward.0"]["input"][0], want["g_y1"])
    assert_record(data["Cell.fc.Dense.backward.1"]["output"][0], want["g_y1"])
