"""Recording adds no node that regroups a gradient sum (docs/mindspore.md, "Backward
entries"): a Cell that reads its input twice next to a residual add (L0/mix), and an API
call that reads one tensor in two slots next to another use (L1/mix), train bit for bit as
unrecorded; the Cell's backward ``output`` is the whole gradient of its input and each slot
of ``x * x`` holds its own contribution."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")

import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn, ops  # noqa: E402

from ms_helpers import assert_record, load_dump  # noqa: E402
from msprobe.mindspore import PrecisionDebugger  # noqa: E402


class Pair(nn.Cell):
    """Reads its input twice: ``tanh(a(x)) * b(x)``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Dense(32, 32)
        self.b = nn.Dense(32, 32)

    def construct(self, x):
        return ops.tanh(self.a(x)) * self.b(x)


class Residual(nn.Cell):
    """``h = inp(x)``; ``h * h + pair(h) + h``: ``h`` reaches the loss through the residual,
    the Cell's two uses and both slots of one ``mul``."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Dense(32, 32)
        self.pair = Pair()

    def construct(self, x):
        h = self.inp(x)
        return ops.mul(h, h) + self.pair(h) + h


def _make(seed: int = 0):
    rng = np.random.default_rng(seed)
    net = Residual()
    for p in net.trainable_params():
        p.set_data(Tensor(rng.standard_normal(p.shape).astype(np.float32)))
    x = Tensor(rng.standard_normal((64, 32)).astype(np.float32))
    c = Tensor(rng.standard_normal((64, 32)).astype(np.float32))
    return net, x, c


def _grads(net, x, c, dbg=None):
    """``(loss, parameter gradients)`` as numpy arrays; recorded by ``dbg`` when given."""

    def fwd(inp):
        return (net(inp) * c).sum()

    fn = ms.value_and_grad(fwd, None, net.trainable_params())
    if dbg is not None:
        dbg.start(net)
    loss, grads = fn(x)
    if dbg is not None:
        dbg.stop()
        dbg.step()
        dbg.close()
    return loss.asnumpy(), [g.asnumpy() for g in grads]


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_gradients_bit_identical(level, tmp_path):
    net, x, c = _make()
    plain, plain_grads = _grads(net, x, c)
    recorded, grads = _grads(net, x, c, PrecisionDebugger(dump_path=str(tmp_path / "d"), level=level))
    assert recorded.tobytes() == plain.tobytes()
    for p, a, b in zip(net.trainable_params(), plain_grads, grads):
        assert a.tobytes() == b.tobytes(), p.name


def test_cell_output_is_the_whole_gradient_and_api_slots_their_own(tmp_path):
    net, x, c = _make()
    h = net.inp(x)
    # the whole gradient of h: the residual, the Cell's two uses and x * x
    gh = ms.grad(lambda t: ((t * t + net.pair(t) + t) * c).sum())(h)
    # what the Cell alone sends to h
    g_pair = ms.grad(lambda t: (net.pair(t) * c).sum())(h)
    _grads(net, x, c, PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix"))
    data = load_dump(tmp_path / "d")[0]["data"]
    bwd = data["Cell.pair.Pair.backward.0"]
    assert_record(bwd["input"][0], c)
    assert_record(bwd["output"][0], gh)
    assert not np.allclose(gh.asnumpy(), g_pair.asnumpy())   # the two contracts differ here
    mul = data["Functional.mul.0.backward"]
    want = h.asnumpy().astype(np.float64) * c.asnumpy()      # d(h*h)/d slot = other slot * c
    assert_record(mul["output"][0], want)
    assert_record(mul["output"][1], want)
