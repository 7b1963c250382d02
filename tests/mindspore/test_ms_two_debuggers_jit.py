"""Two MindSpore debuggers alive at once, both wrapping ``@jit`` calls (nn.SGD's update is
one): training runs as without them, the Jit call is recorded, and once both are closed
MindSpore's own executor class and ``grad`` method are back."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("mindspore")

from ms_helpers import make_input, make_net
from msprobe.mindspore import PrecisionDebugger

import mindspore as ms  # noqa: E402
import mindspore.graph.api as graph_api  # noqa: E402
from mindspore import nn  # noqa: E402
from mindspore.graph.api import _pynative_executor  # noqa: E402


def _train(dbgs, steps=3):
    net, x = make_net(), make_input()
    opt = nn.SGD(net.trainable_params(), 0.05)
    gf = ms.value_and_grad(lambda i: (net(i) * 1.5).sum(), None, opt.parameters)
    losses = []
    for _ in range(steps):
        for dbg in dbgs:
            dbg.start(net)
        loss, grads = gf(x)
        opt(grads)
        losses.append(float(loss.asnumpy()))
        for dbg in dbgs:
            dbg.stop()
        for dbg in dbgs:
            dbg.step()
    return losses


@pytest.mark.parametrize("order", ["AB", "BA"])
def test_two_debuggers_record_jit_calls(tmp_path, order):
    executor_class, own_grad = graph_api._JitExecutor, "grad" in vars(_pynative_executor)
    make = {"A": lambda: PrecisionDebugger(dump_path=str(tmp_path / "a"), level="L1", step=[0]),
            "B": lambda: PrecisionDebugger(dump_path=str(tmp_path / "b"), level="L1", step=[0, 1])}
    dbgs = {name: make[name]() for name in order}
    losses = _train([dbgs[name] for name in order])
    for dbg in dbgs.values():
        dbg.close()
    assert losses == _train([])
    # the debugger installed last records the calls (the other one's wrappers run inside it)
    last = "a" if order == "BA" else "b"
    data = json.loads((tmp_path / last / "step0" / "rank" / "dump.json").read_text())["data"]
    assert "Jit.SGD.0.forward" in data, list(data)
    assert graph_api._JitExecutor is executor_class
    assert ("grad" in vars(_pynative_executor)) == own_grad
