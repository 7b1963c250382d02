"""Entry names, keys, construct.json and levels of the MindSpore recorder (spec 2.1, 3.2, 4.2)."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("mindspore")

from ms_helpers import load_dump, make_input, make_net, np_stats, train_loop
from msprobe.core.errors import ConfigError
from msprobe.mindspore import PrecisionDebugger

import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn, ops  # noqa: E402


def run(tmp_path, level, model=True, **kw):
    net = make_net()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level=level, **kw)
    train_loop(net, make_input(), dbg, steps=1, level_model=model)
    dbg.close()
    return load_dump(tmp_path / "d")


FWD_MIX = [
    "Primitive.shape_op.Shape.0.forward", "Primitive.matmul.MatMul.0.forward",
    "Primitive.bias_add.BiasAdd.0.forward", "Cell.d1.Dense.forward.0", "Cell.d1.Dense.parameters_grad",
    "Primitive.relu.ReLU.0.forward", "Cell.relu.ReLU.forward.0", "Functional.mul.0.forward",
    "Primitive.shape_op.Shape.1.forward", "Primitive.matmul.MatMul.1.forward",
    "Primitive.bias_add.BiasAdd.1.forward", "Cell.d2.Dense.forward.0", "Cell.d2.Dense.parameters_grad",
    "MintFunctional.relu.0.forward", "Tensor.__mul__.0.forward", "Tensor.sum.0.forward",
]
BWD_MIX = [
    "Tensor.sum.0.backward", "Tensor.__mul__.0.backward", "MintFunctional.relu.0.backward",
    "Cell.d2.Dense.backward.0", "Primitive.bias_add.BiasAdd.1.backward", "Primitive.matmul.MatMul.1.backward",
    "Functional.mul.0.backward", "Cell.relu.ReLU.backward.0", "Primitive.relu.ReLU.0.backward",
    "Cell.d1.Dense.backward.0", "Primitive.bias_add.BiasAdd.0.backward", "Primitive.matmul.MatMul.0.backward",
]


def test_mix_names_order_and_construct(tmp_path):
    dump, stack, construct = run(tmp_path, "mix")
    assert dump["framework"] == "mindspore" and dump["level"] == "mix" and dump["dump_data_dir"] is None
    names = list(dump["data"])
    # the SGD optimizer's construct is a @jit function: recorded as Jit
    assert names == FWD_MIX + BWD_MIX + ["Jit.SGD.0.forward"]
    data = dump["data"]
    assert list(data["Cell.d1.Dense.forward.0"]) == ["input_args", "input_kwargs", "output", "parameters"]
    assert list(data["Functional.mul.0.forward"]) == ["input_args", "input_kwargs", "output"]
    assert list(data["Cell.d1.Dense.backward.0"]) == ["input", "output"]
    assert construct["Primitive.matmul.MatMul.0.forward"] == "Cell.d1.Dense.forward.0"
    assert construct["Cell.d1.Dense.forward.0"] is None
    assert construct["Primitive.matmul.MatMul.1.backward"] == "Cell.d2.Dense.backward.0"
    assert "Cell.d1.Dense.parameters_grad" not in construct
    # stacks: user frames only; backward entries carry their forward's stack (fix 17)
    assert set(stack) == {n for n in names if not n.endswith("parameters_grad")}
    assert stack["Functional.mul.0.backward"] == stack["Functional.mul.0.forward"]
    frames = stack["Functional.mul.0.forward"]
    assert any("h = ops.mul(h, 2.0)" in f for f in frames)
    import os
    import msprobe
    tool_dirs = (os.path.dirname(ms.__file__), os.path.dirname(msprobe.__file__))
    assert not any(f.startswith(f"File {d}") for f in frames for d in tool_dirs)


def test_l1_without_model_has_no_primitives(tmp_path):
    dump, _, construct = run(tmp_path, "L1", model=False)
    names = list(dump["data"])
    assert not any(n.startswith(("Primitive.", "Cell.")) for n in names)
    assert names[:4] == ["Functional.mul.0.forward", "MintFunctional.relu.0.forward",
                         "Tensor.__mul__.0.forward", "Tensor.sum.0.forward"]
    assert "Functional.mul.0.backward" in names
    assert construct == {}


def test_l1_with_model_records_primitives(tmp_path):
    dump, _, _ = run(tmp_path, "L1")
    names = list(dump["data"])
    assert "Primitive.matmul.MatMul.1.forward" in names and "Primitive.matmul.MatMul.1.backward" in names
    assert not any(n.startswith("Cell.") for n in names)


def test_l0_names(tmp_path):
    dump, _, construct = run(tmp_path, "L0")
    assert list(dump["data"]) == [
        "Cell.d1.Dense.forward.0", "Cell.d1.Dense.parameters_grad", "Cell.relu.ReLU.forward.0",
        "Cell.d2.Dense.forward.0", "Cell.d2.Dense.parameters_grad",
        "Cell.d2.Dense.backward.0", "Cell.relu.ReLU.backward.0", "Cell.d1.Dense.backward.0"]
    assert set(construct) == {n for n in dump["data"] if "parameters_grad" not in n}


def test_list_of_models_and_sequential(tmp_path):
    a, b = nn.SequentialCell([nn.Dense(2, 2)]), nn.SequentialCell([nn.Dense(2, 2), nn.ReLU()])
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0")
    dbg.start([a, b])
    b(a(Tensor(np.ones((1, 2), np.float32))))
    dbg.stop()
    dbg.close()
    assert list(load_dump(tmp_path / "d")[0]["data"]) == [
        "Cell.0.0.Dense.forward.0", "Cell.1.0.Dense.forward.0", "Cell.1.1.ReLU.forward.0"]


def test_leaf_cell_as_model_is_recorded_as_itself(tmp_path):
    d = nn.Dense(2, 2)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0")
    dbg.start(d)
    d(Tensor(np.ones((1, 2), np.float32)))
    dbg.stop()
    dbg.close()
    assert list(load_dump(tmp_path / "d")[0]["data"]) == ["Cell.model.Dense.forward.0"]


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_model_levels_need_a_cell(tmp_path, level):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level=level)
    with pytest.raises(ConfigError, match="model"):
        dbg.start()
    with pytest.raises(ConfigError, match="mindspore.nn.Cell"):
        dbg.start(model="net")
    dbg.close()


def test_counters_reset_per_step_and_step_filter(tmp_path):
    net = make_net()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1", step=[0, "2-3"])
    train_loop(net, make_input(), dbg, steps=5, level_model=False)
    dbg.close()
    assert sorted(p.name for p in (tmp_path / "d").iterdir() if p.name.startswith("step")) == \
        ["step0", "step2", "step3"]
    assert "Functional.mul.0.forward" in load_dump(tmp_path / "d", step=3)[0]["data"]


def test_list_and_data_mode_filters(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"task": "statistics", "dump_path": "%s", "level": "mix", '
                   '"statistics": {"list": ["Dense"], "data_mode": ["forward"]}}' % (tmp_path / "d"))
    net = make_net()
    dbg = PrecisionDebugger(config_path=str(cfg))
    train_loop(net, make_input(), dbg, steps=1)
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    # at mix, everything running inside a Cell that matches the list is kept (spec 5.5);
    # data_mode forward keeps no backward entry
    assert list(data) == ["Primitive.shape_op.Shape.0.forward", "Primitive.matmul.MatMul.0.forward",
                          "Primitive.bias_add.BiasAdd.0.forward", "Cell.d1.Dense.forward.0",
                          "Primitive.shape_op.Shape.1.forward", "Primitive.matmul.MatMul.1.forward",
                          "Primitive.bias_add.BiasAdd.1.forward", "Cell.d2.Dense.forward.0"]
    got = data["Primitive.matmul.MatMul.0.forward"]["input_args"][0]
    want = np_stats(make_input())
    assert {k: got[k] for k in want} == pytest.approx(want, rel=1e-6)


def test_list_at_L1_keeps_only_matching_names(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"task": "statistics", "dump_path": "%s", "level": "L1", '
                   '"statistics": {"list": ["mul"], "data_mode": ["forward"]}}' % (tmp_path / "d"))
    net = make_net()
    dbg = PrecisionDebugger(config_path=str(cfg))
    train_loop(net, make_input(), dbg, steps=1, level_model=False)
    dbg.close()
    # substring match: "mul" keeps ops.mul and the `* 1.5` of the loss, not MatMul (case)
    assert list(load_dump(tmp_path / "d")[0]["data"]) == ["Functional.mul.0.forward", "Tensor.__mul__.0.forward"]


def test_jit_function(tmp_path):
    @ms.jit
    def jit_fn(a, b):
        return ops.mul(a, b) + 1.0

    a = Tensor(np.array([1.0, 2.0, 3.0], np.float32))
    b = Tensor(np.array([4.0, 5.0, 6.0], np.float32))
    expected = jit_fn(a, b).asnumpy()
    g_expected = ms.grad(lambda u, v: jit_fn(u, v).sum(), grad_position=(0, 1))(a, b)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    out = jit_fn(a, b)
    grads = ms.grad(lambda u, v: jit_fn(u, v).sum(), grad_position=(0, 1))(a, b)
    dbg.stop()
    dbg.close()
    np.testing.assert_array_equal(out.asnumpy(), expected)
    for g, ge in zip(grads, g_expected):
        np.testing.assert_array_equal(g.asnumpy(), ge.asnumpy())
    data = load_dump(tmp_path / "d")[0]["data"]
    assert "Functional.mul.0.forward" not in data  # calls inside the graph are not Python calls
    fwd = data["Jit.jit_fn.0.forward"]
    assert fwd["output"][0]["Max"] == 19.0 and fwd["input_args"][1]["Norm"] == pytest.approx(np.sqrt(77))
    bwd = data["Jit.jit_fn.1.backward"]
    assert bwd["output"][0]["Max"] == 6.0 and bwd["output"][1]["Max"] == 3.0  # d/da = b, d/db = a
    assert "Jit.jit_fn.0.backward" not in data  # a plain forward has no backward


def test_hooks_removed_after_close(tmp_path):
    originals = (ops.mul, Tensor.__mul__, ms.graph.api._JitExecutor)
    net = make_net()
    prim_cls = type(net.d1.matmul)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    dbg.start(net)
    assert ops.mul is not originals[0] and type(net.d1.matmul) is not prim_cls
    dbg.stop()
    dbg.close()
    assert (ops.mul, Tensor.__mul__, ms.graph.api._JitExecutor) == originals
    assert type(net.d1.matmul) is prim_cls
    assert "grad" not in vars(ms.graph.api._pynative_executor)
    assert not net.d1._forward_pre_hook and not net.d1._forward_hook


def test_jit_cell_with_hooked_subcells(tmp_path):
    """A Cell whose construct is @jit: its hooked subcells and Primitives are taken out of
    the graph while it compiles and runs (values unchanged), the call is one Jit entry."""

    class JNet(nn.Cell):
        def __init__(self):
            super().__init__()
            self.d = nn.Dense(3, 2)

        @ms.jit
        def construct(self, x):
            return self.d(x) * 2

    net = JNet()
    x = Tensor(np.ones((2, 3), np.float32))
    ref = net(x).asnumpy()
    g_ref = ms.grad(lambda t: net(t).sum())(x).asnumpy()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    dbg.start(net)
    out = net(x)
    g = ms.grad(lambda t: net(t).sum())(x)
    dbg.stop()
    dbg.close()
    np.testing.assert_array_equal(out.asnumpy(), ref)
    np.testing.assert_array_equal(g.asnumpy(), g_ref)
    data = load_dump(tmp_path / "d")[0]["data"]
    assert list(data) == ["Jit.JNet.0.forward", "Jit.JNet.1.forward", "Tensor.sum.0.forward",
                          "Tensor.sum.0.backward", "Jit.JNet.1.backward"]
    assert data["Jit.JNet.1.backward"]["output"][0]["Max"] == pytest.approx(float(g_ref.max()))


def test_inplace_semantics_kept(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    t = Tensor(np.zeros(3, np.float32))
    t[0] = 5.0
    u = Tensor(np.zeros(3, np.float32))
    u.copy_(Tensor(np.ones(3, np.float32)))

    def f(a):
        b = a * 1.0
        b[1] = 7.0
        return (b * a).sum()

    ga = ms.grad(f)(Tensor(np.array([1.0, 2.0, 3.0], np.float32)))
    dbg.stop()
    dbg.close()
    np.testing.assert_array_equal(t.asnumpy(), [5, 0, 0])
    np.testing.assert_array_equal(u.asnumpy(), [1, 1, 1])
    np.testing.assert_array_equal(ga.asnumpy(), [2, 7, 6])
    data = load_dump(tmp_path / "d")[0]["data"]
    assert data["Tensor.__setitem__.0.forward"]["input_args"][0]["Max"] == 0.0  # recorded before the write
    assert data["Tensor.copy_.0.forward"]["output"][0]["Max"] == 1.0


@pytest.mark.parametrize("level", ["L1", "L0", "mix"])
def test_seeds_example_7_2_1_1(tmp_path, level):
    """The seeds' PyNative loop without Model: ``grad_net = ms.grad(model)(data)``."""
    model = nn.SequentialCell([nn.Dense(4, 3), nn.ReLU()])
    data = Tensor(np.arange(8, dtype=np.float32).reshape(2, 4) / 8 - 0.3)
    g_ref = ms.grad(model)(data).asnumpy()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level=level)
    for _ in range(2):
        dbg.start(model if level != "L1" else None)
        grad_net = ms.grad(model)(data)
        dbg.stop()
        dbg.step()
    dbg.close()
    np.testing.assert_array_equal(grad_net.asnumpy(), g_ref)
    for step in (0, 1):
        names = list(load_dump(tmp_path / "d", step=step)[0]["data"])
        if level == "L1":
            assert names == []  # nn.Dense/nn.ReLU call Primitives; without a model none is recorded
        elif level == "L0":
            assert names == ["Cell.0.Dense.forward.0", "Cell.1.ReLU.forward.0",
                             "Cell.1.ReLU.backward.0", "Cell.0.Dense.backward.0"]
        else:
            assert "Cell.0.Dense.backward.0" in names and "Primitive.relu.ReLU.0.backward" in names
    if level == "L0":
        dense = load_dump(tmp_path / "d")[0]["data"]["Cell.0.Dense.backward.0"]
        np.testing.assert_allclose(dense["output"][0]["Max"], g_ref.max(), rtol=1e-6)


def test_rank_filter_without_distributed(tmp_path):
    """A non-distributed run counts as rank 0 (spec fix 18)."""
    for rank, expect in (([1], False), ([0], True)):
        cfg = tmp_path / f"c{rank[0]}.json"
        out = tmp_path / f"d{rank[0]}"
        cfg.write_text('{"dump_path": "%s", "level": "L1", "rank": %s}' % (out, rank))
        dbg = PrecisionDebugger(config_path=str(cfg))
        dbg.start()
        ops.relu(Tensor(np.ones(2, np.float32)))
        dbg.stop()
        dbg.step()
        dbg.close()
        assert (out / "step0" / "rank" / "dump.json").exists() is expect


def test_scope_is_inclusive_and_covers_backward(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"dump_path": str(tmp_path / "d"), "level": "L1", "statistics": {
        "scope": ["Functional.mul.0.forward", "Tensor.__mul__.0.forward"]}}))
    dbg = PrecisionDebugger(config_path=str(cfg))
    train_loop(make_net(), make_input(), dbg, steps=2, level_model=False)
    dbg.close()
    for step in (0, 1):  # the range closes at step end and opens again
        data = load_dump(tmp_path / "d", step=step)[0]["data"]
        assert list(data) == [
            "Functional.mul.0.forward", "MintFunctional.relu.0.forward", "Tensor.__mul__.0.forward",
            "Tensor.__mul__.0.backward", "MintFunctional.relu.0.backward", "Functional.mul.0.backward"]
        assert data["Tensor.__mul__.0.forward"]["output"]  # the end entry keeps its output


def test_scope_with_cells_at_mix(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"dump_path": str(tmp_path / "d"), "level": "mix", "statistics": {
        "scope": ["Cell.relu.ReLU.forward.0", "Cell.d2.Dense.forward.0"]}}))
    dbg = PrecisionDebugger(config_path=str(cfg))
    train_loop(make_net(), make_input(), dbg, steps=1)
    dbg.close()
    names = list(load_dump(tmp_path / "d")[0]["data"])
    assert names == [
        "Primitive.relu.ReLU.0.forward", "Cell.relu.ReLU.forward.0", "Functional.mul.0.forward",
        "Primitive.shape_op.Shape.1.forward", "Primitive.matmul.MatMul.1.forward",
        "Primitive.bias_add.BiasAdd.1.forward", "Cell.d2.Dense.forward.0", "Cell.d2.Dense.parameters_grad",
        "Cell.d2.Dense.backward.0", "Primitive.bias_add.BiasAdd.1.backward", "Primitive.matmul.MatMul.1.backward",
        "Functional.mul.0.backward", "Cell.relu.ReLU.backward.0", "Primitive.relu.ReLU.0.backward"]
