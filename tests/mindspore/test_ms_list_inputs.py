"""A Cell that appends to a list it was given changes the caller's list, recorded or not,
also while gradients are computed: the Cell gets the caller's own list and tensors (its
inputs are observed by tensor hooks, not replaced), and its backward ``output`` holds the
whole gradient of the tensor in the list (docs/mindspore.md, "Backward entries")."""
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


class Front(nn.Cell):
    def construct(self, hs):
        hs.insert(0, hs[0] * 2.0)  # the caller's element moves to index 1
        return hs[0]


class Net(nn.Cell):
    """Hands the Cell ``c`` a list holding x; the loss reads what the Cell did to the list."""

    def __init__(self, cell, at):
        super().__init__()
        self.c = cell
        self.at = at  # where the caller's x is after the call

    def construct(self, x):
        hs = [x]
        out = self.c(hs)
        assert hs[self.at] is x  # the caller's own tensor back, where the Cell left it
        return out.sum() + (hs[self.at] * hs[self.at]).sum() + len(hs) * 100.0


def _plain_and_recorded(tmp_path, make_cell, at):
    """``(plain loss, plain gradient, loss, gradient, the Cell's backward records)``."""
    x = Tensor(np.array([1.0, 2.0], np.float32))
    plain_loss, plain_grad = ms.value_and_grad(Net(make_cell(), at))(x)
    net = Net(make_cell(), at)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0")
    dbg.start(model=net)
    loss, grad = ms.value_and_grad(net)(x)
    dbg.stop()
    dbg.step()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    name = f"Cell.c.{type(net.c).__name__}.backward."
    return plain_loss, plain_grad, loss, grad, [v for k, v in data.items() if k.startswith(name)]


def test_cell_append_reaches_the_callers_list_under_grad(tmp_path):
    plain_loss, plain_grad, loss, grad, bwd = _plain_and_recorded(tmp_path, Collect, 0)
    assert float(plain_loss) == float(loss) == 211.0  # 2 * (1 + 2) + (1 + 4) + 2 * 100
    np.testing.assert_array_equal(grad.asnumpy(), plain_grad.asnumpy())
    np.testing.assert_array_equal(grad.asnumpy(), [4.0, 6.0])  # 2 from the Cell + 2x
    assert len(bwd) == 1  # x's whole gradient: 2 from the Cell + 2x from the caller's x * x
    assert bwd[0]["output"][0][0]["Max"] == 6.0 and bwd[0]["output"][0][0]["Min"] == 4.0


def test_cell_insert_moves_the_callers_element(tmp_path):
    plain_loss, plain_grad, loss, grad, bwd = _plain_and_recorded(tmp_path, Front, 1)
    assert float(loss) == float(plain_loss) == 211.0
    np.testing.assert_array_equal(grad.asnumpy(), plain_grad.asnumpy())
    assert len(bwd) == 1  # x's whole gradient: 2 from the Cell + 2x from the caller's x * x
    assert bwd[0]["output"][0][0]["Max"] == 6.0 and bwd[0]["output"][0][0]["Min"] == 4.0
