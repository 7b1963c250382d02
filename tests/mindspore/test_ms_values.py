"""Recorded MindSpore values equal independent computations: numpy float64 statistics,
zlib CRC-32, gradients from mindspore.grad / value_and_grad; recording changes no loss bit."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

pytest.importorskip("mindspore")

from ms_helpers import assert_record, load_dump, make_input, make_net, np_stats, train_loop
from msprobe.mindspore import PrecisionDebugger
from msprobe.mindspore.stats import array_stats, crc32_hex

import mindspore as ms  # noqa: E402
from mindspore import Tensor, mint, nn, ops  # noqa: E402


def independent(net, x):
    """Forward values and gradients of the Net recomputed by hand (no recorder)."""
    w1, b1 = net.d1.weight.asnumpy().copy(), net.d1.bias.asnumpy().copy()
    w2, b2 = net.d2.weight.asnumpy().copy(), net.d2.bias.asnumpy().copy()

    def f(x_, w1_, b1_, w2_, b2_):
        y1 = ops.matmul(x_, w1_.T) + b1_
        r1 = ops.relu(y1)
        h = r1 * 2.0
        y2 = ops.matmul(h, w2_.T) + b2_
        return (ops.relu(y2) * 1.5).sum(), (y1, r1, h, y2)

    args = [x] + [Tensor(a) for a in (w1, b1, w2, b2)]
    (loss, (y1, r1, h, y2)), grads = ms.value_and_grad(f, grad_position=(1, 2, 3, 4), has_aux=True)(*args)
    gy2 = ms.grad(lambda y: (ops.relu(y) * 1.5).sum())(y2)
    gh = ms.grad(lambda hh: (ops.relu(ops.matmul(hh, Tensor(w2).T) + Tensor(b2)) * 1.5).sum())(h)
    return dict(y1=y1, r1=r1, h=h, y2=y2, loss=loss, gw1=grads[0], gb1=grads[1], gw2=grads[2], gb2=grads[3],
                gy2=gy2, gh=gh, w1=w1)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vals")
    net, x = make_net(), make_input()
    ref = independent(net, x)
    dbg = PrecisionDebugger(dump_path=str(tmp / "d"), level="mix")
    train_loop(net, x, dbg, steps=1)
    dbg.close()
    return ref, x, load_dump(tmp / "d")[0]["data"]


def test_forward_statistics(recorded):
    v, x, data = recorded
    e = data["Primitive.matmul.MatMul.0.forward"]
    assert_record(e["input_args"][0], x)
    assert_record(e["input_args"][1], v["w1"])
    assert e["input_args"][1]["requires_grad"] is True and "requires_grad" not in e["input_args"][0]
    assert e["input_kwargs"] == {}
    assert_record(data["Primitive.bias_add.BiasAdd.0.forward"]["output"][0], v["y1"])
    assert_record(data["Cell.relu.ReLU.forward.0"]["output"][0], v["r1"])
    mul = data["Functional.mul.0.forward"]
    assert_record(mul["input_args"][0], v["r1"])
    assert mul["input_args"][1] == {"type": "float", "value": 2.0}
    assert_record(mul["output"][0], v["h"])
    assert_record(data["Tensor.sum.0.forward"]["output"][0], v["loss"])
    params = data["Cell.d1.Dense.forward.0"]["parameters"]
    assert list(params) == ["weight", "bias"] and params["weight"]["requires_grad"] is True
    assert_record(params["weight"], v["w1"])


def test_backward_equals_independent_gradients(recorded):
    v, _, data = recorded
    pg = data["Cell.d1.Dense.parameters_grad"]
    assert list(pg) == ["weight", "bias"]
    assert_record(pg["weight"][0], v["gw1"])
    assert_record(pg["bias"][0], v["gb1"])
    assert_record(data["Cell.d2.Dense.parameters_grad"]["weight"][0], v["gw2"])
    # Cell d2: input = grad w.r.t. its output, output = grad w.r.t. its input h
    d2 = data["Cell.d2.Dense.backward.0"]
    assert_record(d2["input"][0], v["gy2"])
    assert_record(d2["output"][0], v["gh"])
    # Functional.mul(h, 2.0): output[0] = 2 * dL/dh, output[1] = null (a float)
    mul = data["Functional.mul.0.backward"]
    assert_record(mul["input"][0], v["gh"])
    assert_record(mul["output"][0], v["gh"].asnumpy() * 2.0)
    assert mul["output"][1] is None
    # MatMul(x, w1): x does not require grad -> null; w1 slot = grad of weight
    mm = data["Primitive.matmul.MatMul.0.backward"]
    assert mm["output"][0] is None
    assert_record(mm["output"][1], v["gw1"])


def test_per_call_contributions():
    """A tensor used by two calls: each backward output holds that call's contribution only."""
    h = Tensor(np.array([1.0, -2.0, 3.0], np.float32))

    def f(t):
        return ops.mul(t, t).sum() + ops.mul(t, 3.0).sum()

    import tempfile
    with tempfile.TemporaryDirectory() as d:
        dbg = PrecisionDebugger(dump_path=d, level="L1")
        dbg.start()
        g = ms.grad(f)(h)
        dbg.stop()
        dbg.close()
        data = load_dump(d)[0]["data"]
    np.testing.assert_array_equal(g.asnumpy(), 2 * h.asnumpy() + 3.0)
    first = data["Functional.mul.0.backward"]["output"]  # t*t: each slot its own contribution, t
    assert first[0]["Max"] == 3.0 and first[0]["Min"] == -2.0 and first[1] == first[0]
    second = data["Functional.mul.1.backward"]["output"]
    assert second[0]["Max"] == 3.0 and second[0]["Min"] == 3.0 and second[1] is None


def test_recording_changes_no_loss_bit(tmp_path):
    x = make_input()
    ref_net = make_net()
    plain = train_loop(ref_net, x, None, steps=3)
    net = make_net()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    recorded = train_loop(net, x, dbg, steps=3)
    dbg.close()
    assert [a.tobytes() for a in plain] == [b.tobytes() for b in recorded]
    for p, q in zip(net.trainable_params(), ref_net.trainable_params()):
        assert p.asnumpy().tobytes() == q.asnumpy().tobytes()


def test_md5_is_crc32(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"dump_path": "%s", "level": "L1", "statistics": {"summary_mode": "md5"}}' % (tmp_path / "d"))
    a = Tensor(np.random.default_rng(3).standard_normal((4, 5)).astype(np.float32))
    dbg = PrecisionDebugger(config_path=str(cfg))
    dbg.start()
    out = ops.abs(a)
    dbg.stop()
    dbg.close()
    rec = load_dump(tmp_path / "d")[0]["data"]["Functional.abs.0.forward"]
    assert rec["input_args"][0]["md5"] == format(zlib.crc32(a.asnumpy().tobytes()), "08x")
    assert rec["output"][0]["md5"] == format(zlib.crc32(out.asnumpy().tobytes()), "08x")
    assert rec["output"][0]["Max"] == pytest.approx(np_stats(out)["Max"])


@pytest.mark.parametrize("dtype", [ms.float16, ms.bfloat16, ms.float32, ms.float64, ms.int8, ms.int32,
                                   ms.int64, ms.uint8])
def test_dtype_statistics_through_dump(tmp_path, dtype):
    base = np.array([[1.5, -2.25, 3.0], [0.0, 7.0, -1.0]], np.float32)
    t = Tensor(base).astype(dtype)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    ops.reshape(t, (3, 2))
    dbg.stop()
    dbg.close()
    rec = load_dump(tmp_path / "d")[0]["data"]["Functional.reshape.0.forward"]["input_args"][0]
    assert rec["dtype"] == str(dtype)
    arr = t.asnumpy()
    ref = arr.astype(np.float32).astype(np.float64) if str(dtype) == "BFloat16" else arr.astype(np.float64)
    assert rec["Max"] == ref.max() and rec["Min"] == ref.min()
    assert rec["Mean"] == pytest.approx(ref.mean(), rel=1e-12)
    assert rec["Norm"] == pytest.approx(np.sqrt((ref * ref).sum()), rel=1e-12)


def test_stats_edge_cases():
    b = array_stats(np.array([True, False]))
    assert (b.max, b.min, b.mean, b.norm) == (1.0, 0.0, None, None)
    e = array_stats(np.zeros((0, 3), np.float32))
    assert (e.max, e.min, e.mean, e.norm) == (None, None, None, None)
    z = array_stats(np.array(-8.5, np.float32))
    assert (z.max, z.min, z.mean, z.norm) == (-8.5, -8.5, -8.5, 8.5)
    c = array_stats(np.array([3 + 4j, 0 + 1j], np.complex64))
    assert (c.max, c.min, c.mean) == (5.0, 1.0, 3.0) and c.norm == pytest.approx(np.sqrt(26))
    n = array_stats(np.array([1.0, np.nan, np.inf, -2.0], np.float32))
    assert np.isnan(n.max) and n.has_nan and n.has_inf and (n.max_finite, n.min_finite) == (1.0, -2.0)
    allnan = array_stats(np.array([np.nan, np.nan]))
    assert np.isnan(allnan.max_finite)
    big = np.full(4, 60000, np.float16)  # fp16 norm overflows in fp16, not here
    assert array_stats(big).norm == 120000.0
    assert crc32_hex(np.zeros(0, np.float32)) == "00000000"
    bf = Tensor(np.array([1.5, -2.0], np.float32)).astype(ms.bfloat16).asnumpy()
    assert crc32_hex(bf) == format(zlib.crc32(np.array([1.5, -2.0], np.float32).tobytes()), "08x")


def test_value_records(tmp_path):
    t = Tensor(np.ones((2, 3), np.float32))
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    ops.cast(t, ms.float16)
    t[0:1, ...]
    ops.sum(t, 1, keepdim=True)
    dbg.stop()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    assert data["Functional.cast.0.forward"]["input_args"][1] == {"type": "mindspore.dtype", "value": "Float16"}
    assert data["Functional.cast.0.forward"]["output"][0]["dtype"] == "Float16"
    assert data["Tensor.__getitem__.0.forward"]["input_args"][1] == [
        {"type": "slice", "value": [0, 1, None]}, {"type": "ellipsis", "value": "..."}]
    assert data["Functional.sum.0.forward"]["input_kwargs"] == {"keepdim": {"type": "bool", "value": True}}


def test_nested_calls_and_tool_ops_not_recorded(tmp_path):
    """mint.nn.functional.linear calls other APIs internally; only the outer call appears,
    and msprobe's own HookBackward/asnumpy never show up."""
    x = Tensor(np.ones((2, 3), np.float32))
    w = ms.Parameter(Tensor(np.ones((4, 3), np.float32)), name="w")
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    ms.grad(lambda a: mint.nn.functional.linear(a, w).sum())(x)
    dbg.stop()
    dbg.close()
    assert list(load_dump(tmp_path / "d")[0]["data"]) == [
        "MintFunctional.linear.0.forward", "Tensor.sum.0.forward",
        "Tensor.sum.0.backward", "MintFunctional.linear.0.backward"]


def test_argument_identity_preserved():
    seen = []

    class Same(nn.Cell):
        def construct(self, a, b):
            seen.append(a is b)
            return a + b

    class Outer(nn.Cell):
        def __init__(self):
            super().__init__()
            self.same = Same()

        def construct(self, x):
            return self.same(x, x)

    import tempfile
    net = Outer()
    x = Tensor(np.ones(3, np.float32))
    with tempfile.TemporaryDirectory() as d:
        dbg = PrecisionDebugger(dump_path=d, level="mix")
        dbg.start(net)
        ms.grad(lambda t: net(t).sum())(x)
        dbg.stop()
        dbg.close()
        data = load_dump(d)[0]["data"]
    assert seen == [True]
    out = data["Cell.same.Same.backward.0"]["output"]
    assert out[0]["Max"] == 2.0 and out[1] == out[0]


def test_batchnorm_running_statistics_unchanged(tmp_path):
    """Cells that update Parameters in place (BatchNorm's moving mean/variance) keep doing
    so while recorded: same loss, same running statistics."""

    def run(dbg):
        net = nn.SequentialCell([nn.Dense(4, 3), nn.BatchNorm1d(3)])
        net.set_train(True)
        rng = np.random.default_rng(0)
        for p in net.trainable_params():
            p.set_data(Tensor(rng.standard_normal(p.shape).astype(np.float32)))
        x = Tensor(rng.standard_normal((6, 4)).astype(np.float32))
        if dbg is not None:
            dbg.start(net)
        loss, _ = ms.value_and_grad(lambda t: net(t).sum(), None, net.trainable_params())(x)
        if dbg is not None:
            dbg.stop()
            dbg.close()
        bn = net[1]
        return [a.tobytes() for a in (loss.asnumpy(), bn.moving_mean.asnumpy(), bn.moving_variance.asnumpy())]

    assert run(PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")) == run(None)
    assert "Cell.1.BatchNorm1d.backward.0" in load_dump(tmp_path / "d")[0]["data"]
