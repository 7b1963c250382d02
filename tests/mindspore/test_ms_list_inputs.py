"""A Cell that appends to a list it was given changes the caller's list, recorded or not,
also while gradients are computed (the backward taps put their identities into the
caller's list for the call and its elements back after it; before, the Cell got a copy
and the loss changed)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")

import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402

from ms_helpers import load_dump  # noqa: E402
from msprobe.mindspore import PrecisionDebugger  # noqa: E402


class Collect(nn.Cell):
    def construct(self, hs):
        hs.append(hs[-1] * 2.0)
        return hs[-1]


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.c = Collect()

    def construct(self, x):
        hs = [x]
        out = self.c(hs)
        assert hs[0] is x  # the caller's own tensor back
        return out.sum() + len(hs) * 100.0


def test_cell_append_reaches_the_callers_list_under_grad(tmp_path):
    x = Tensor(np.array([1.0, 2.0], np.float32))
    plain_loss, plain_grad = ms.value_and_grad(Net())(x)
    assert float(plain_loss) == 206.0  # 2 * (1 + 2) + 2 * 100
    net = Net()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0")
    dbg.start(model=net)
    loss, grad = ms.value_and_grad(net)(x)
    dbg.stop()
    dbg.step()
    dbg.close()
    assert float(loss) == 206.0
    np.testing.assert_array_equal(grad.asnumpy(), plain_grad.asnumpy())
    np.testing.assert_array_equal(grad.asnumpy(), [2.0, 2.0])
    data = load_dump(tmp_path / "d")[0]["data"]
    bwd = [v for k, v in data.items() if k.startswith("Cell.c.Collect.backward.")]
    assert len(bwd) == 1
    assert bwd[0]["output"][0][0]["Max"] == 2.0 and bwd[0]["output"][0][0]["Min"] == 2.0


class Front(nn.Cell):
    def construct(self, hs):
        hs.insert(0, hs[0] * 2.0)  # the caller's element moves to index 1
        return hs[0]


class FrontNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.c = Front()

    def construct(self, x):
        hs = [x]
        out = self.c(hs)
        assert hs[1] is x  # the caller's own tensor back, where the Cell moved it
        return out.sum() + (hs[1] * hs[1]).sum()


def test_cell_insert_moves_the_callers_element(tmp_path):
    x = Tensor(np.array([1.0, 2.0], np.float32))
    plain_loss, plain_grad = ms.value_and_grad(FrontNet())(x)
    net = FrontNet()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0")
    dbg.start(model=net)
    loss, grad = ms.value_and_grad(net)(x)
    dbg.stop()
    dbg.step()
    dbg.close()
    assert float(loss) == float(plain_loss) == 11.0
    np.testing.assert_array_equal(grad.asnumpy(), plain_grad.asnumpy())
    data = load_dump(tmp_path / "d")[0]["data"]
    bwd = [v for k, v in data.items() if k.startswith("Cell.c.Front.backward.")]
    assert len(bwd) == 1  # the Cell contributed 2 to x, nothing of the caller's x * x
    assert bwd[0]["output"][0][0]["Max"] == 2.0 and bwd[0]["output"][0][0]["Min"] == 2.0
