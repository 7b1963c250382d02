"""Statistics of MindSpore tensors computed with device ops and brought to the host once per
flush (msprobe.mindspore.device_stats): values equal numpy float64 over the same data, NaN/Inf
facts and every dtype as the host path gives them, host transfers per flush do not grow with
the number of recorded tensors, and in-place writes come after the measurement."""
from __future__ import annotations

import logging
import math

import numpy as np
import pytest

pytest.importorskip("mindspore")

from ms_helpers import load_dump, make_input, make_net, train_loop  # noqa: E402
from msprobe.core.arrays import array_stats  # noqa: E402
from msprobe.mindspore import PrecisionDebugger  # noqa: E402
from msprobe.mindspore import device_stats  # noqa: E402

import mindspore as ms  # noqa: E402
from mindspore import Tensor, mint, ops  # noqa: E402


@pytest.fixture(autouse=True)
def device_path(monkeypatch):
    """Every tensor takes the device path (on CPU it is off by default)."""
    monkeypatch.setenv("MSPROBE_MS_DEVICE_STATS", "1")


def test_device_path_chosen_by_device_target_or_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("MSPROBE_MS_DEVICE_STATS")
    assert ms.get_context("device_target") == "CPU"
    assert PrecisionDebugger(dump_path=str(tmp_path / "a"), level="L1").recorder.leaves.device is None
    monkeypatch.setenv("MSPROBE_MS_DEVICE_STATS", "1")
    assert PrecisionDebugger(dump_path=str(tmp_path / "b"), level="L1").recorder.leaves.device is not None
    monkeypatch.setenv("MSPROBE_MS_DEVICE_STATS", "0")
    assert device_stats.wanted() is False
    monkeypatch.setenv("MSPROBE_MS_DEVICE_STATS", "yes")
    with pytest.raises(ValueError, match="MSPROBE_MS_DEVICE_STATS: got 'yes'"):
        device_stats.wanted()


def _f32(values) -> Tensor:
    return Tensor(np.array(values, np.float32))


def _cases() -> dict:
    """name -> tensor; each is recorded as the input of one ``ops.reshape`` call."""
    rng = np.random.default_rng(7)
    base = rng.standard_normal((6, 5)).astype(np.float32)
    return {
        "f32": Tensor(base),
        "f16": Tensor(base.astype(np.float16)),
        "bf16": Tensor(base).astype(ms.bfloat16),
        "f64": Tensor(base.astype(np.float64) * 1e3),
        "i8": Tensor(np.arange(-7, 8, dtype=np.int8)),
        "i32": Tensor(rng.integers(-1000, 1000, (4, 4)).astype(np.int32)),
        "i64": Tensor(rng.integers(-2**40, 2**40, (9,)).astype(np.int64)),
        "u8": Tensor(np.arange(0, 250, 7, dtype=np.uint8)),
        "bool": Tensor(np.array([[True, False], [False, False]])),
        "bool_all": Tensor(np.array([True, True])),
        "c64": Tensor(np.array([3 + 4j, 0 + 1j, -2 - 2j], np.complex64)),
        "nan_inf": _f32([1.0, np.nan, np.inf, -2.0]),
        "inf_only": _f32([np.inf, -np.inf, np.inf]),
        "all_nan": _f32([np.nan, np.nan]),
        "neg_inf_f16": Tensor(np.array([-np.inf, 3.0], np.float16)),
        "f16_big": Tensor(np.full(4, 60000, np.float16)),  # its Norm overflows float16, not here
        "f64_huge": Tensor(np.array([2e200, -1e200, 3.0])),  # squares overflow float64: rescaled
        "f64_tiny": Tensor(np.array([1e-200, -3e-201])),  # squares underflow: rescaled
        "scalar": Tensor(np.float32(-8.5)),
        "scalar_neg_zero": Tensor(np.float32(-0.0)),
        "scalar_i32": Tensor(np.int32(-3)),
        "empty": Tensor(np.zeros((0, 3), np.float32)),
    }


def _reference(t: Tensor) -> dict:
    """Independent float64 statistics of ``t``'s values with numpy (bool: any/all)."""
    a = t.asnumpy()
    if a.dtype == np.bool_:
        return {"Max": float(a.any()), "Min": float(a.all())}
    if a.dtype.kind == "c":
        f = np.abs(a).astype(np.float64)
    elif a.dtype.kind not in "fiu":  # bfloat16: exact in float32
        f = a.astype(np.float32).astype(np.float64)
    else:
        f = a.astype(np.float64)
    if f.size == 0:
        return {}
    ref = {"Max": float(np.max(f)), "Min": float(np.min(f))}
    finite = f[np.isfinite(f)]
    if finite.size == f.size:
        m = float(np.max(np.abs(f)))
        scale = 2.0 ** math.frexp(m)[1] if m else 1.0  # no overflow or underflow in the squares
        ref["Mean"] = float(np.mean(f)) if f.ndim else float(f)
        ref["Norm"] = float(np.sqrt(np.sum((f / scale) ** 2)) * scale) if f.ndim else abs(float(f))
    return ref


def _record(tmp_path, tensors: dict, **kwargs) -> dict:
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1", **kwargs)
    dbg.start()
    for t in tensors.values():
        ops.reshape(t, (-1,))
    dbg.stop()
    dbg.step()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    return {name: data[f"Functional.reshape.{i}.forward"]["input_args"][0] for i, name in enumerate(tensors)}


def test_values_equal_numpy_float64_for_every_dtype_and_edge_case(tmp_path):
    cases = _cases()
    records = _record(tmp_path, cases)
    for name, t in cases.items():
        rec, ref = records[name], _reference(t)
        assert rec["dtype"] == str(t.dtype) and rec["shape"] == list(t.shape), name
        if not ref:  # empty: no statistics
            assert rec["Max"] is None and rec["Mean"] is None and rec["Norm"] is None, name
            continue
        for key in ("Max", "Min"):  # exact, NaN where numpy gives NaN
            assert (math.isnan(rec[key]) and math.isnan(ref[key])) or rec[key] == ref[key], (name, key)
        if name.startswith("bool"):
            assert rec["Mean"] is None and rec["Norm"] is None, name
            continue
        if "Mean" in ref:
            assert rec["Mean"] == pytest.approx(ref["Mean"], rel=1e-12, abs=0), name
            assert rec["Norm"] == pytest.approx(ref["Norm"], rel=1e-12, abs=0), name
        # the NaN/Inf facts and the finite extremes are those of the host path
        host = array_stats(t.asnumpy())
        for key, field in (("Max_except_inf_nan", "max_finite"), ("Min_except_inf_nan", "min_finite")):
            want = getattr(host, field)
            if want is None:
                assert key not in rec or rec[key] is None, (name, key)
            else:
                assert (math.isnan(rec[key]) and math.isnan(want)) or rec[key] == want, (name, key)
    assert math.copysign(1.0, records["scalar_neg_zero"]["Max"]) == -1.0  # -0.0 kept
    assert records["scalar"]["Mean"] == -8.5 and records["scalar"]["Norm"] == 8.5
    assert records["f16_big"]["Norm"] == 120000.0
    assert records["nan_inf"]["Max_except_inf_nan"] == 1.0 and records["nan_inf"]["Min_except_inf_nan"] == -2.0


def test_host_transfers_per_flush_do_not_grow_with_the_number_of_tensors(tmp_path, monkeypatch):
    calls = []
    original = Tensor.asnumpy

    def counting(self):
        calls.append(1)
        return original(self)

    monkeypatch.setattr(Tensor, "asnumpy", counting)
    rng = np.random.default_rng(3)
    counts = {}
    for n in (4, 64):
        xs = [Tensor(rng.standard_normal((3, 5)).astype(np.float32)) for _ in range(n)]
        dbg = PrecisionDebugger(dump_path=str(tmp_path / f"d{n}"), level="L1")
        dbg.start()
        calls.clear()
        outs = [ops.abs(x) for x in xs]  # 2 tensors per call: input and output
        recording = len(calls)
        dbg.stop()
        counts[n] = (recording, len(calls) - recording, dbg.recorder.device_stats.transfers)
        dbg.step()
        dbg.close()
        monkeypatch.setattr(Tensor, "asnumpy", original)
        data = load_dump(tmp_path / f"d{n}")[0]["data"]
        monkeypatch.setattr(Tensor, "asnumpy", counting)
        for i in (0, n - 1):
            rec = data[f"Functional.abs.{i}.forward"]["output"][0]
            assert rec["Max"] == float(np.abs(xs[i].asnumpy()).max())
            assert rec["Norm"] == pytest.approx(float(np.linalg.norm(outs[i].asnumpy().astype(np.float64))), rel=1e-12)
    # nothing is copied to the host while recording; the flush at stop() makes one transfer
    assert counts[4] == counts[64] == (0, 1, 1)


def test_flush_at_the_limit_keeps_order_and_values(tmp_path):
    rng = np.random.default_rng(4)
    xs = [Tensor(rng.standard_normal((2, 3)).astype(np.float32)) for _ in range(10)]
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.recorder.device_stats.limit = 3  # a flush every 3 pending tensors
    dbg.start()
    for x in xs:
        ops.neg(x)
    dbg.stop()
    transfers = dbg.recorder.device_stats.transfers
    dbg.step()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    assert list(data) == [f"Functional.neg.{i}.forward" for i in range(10)]
    for i, x in enumerate(xs):
        a = x.asnumpy().astype(np.float64)
        assert data[f"Functional.neg.{i}.forward"]["input_args"][0]["Min"] == a.min()
        assert data[f"Functional.neg.{i}.forward"]["output"][0]["Max"] == (-a).max()
    assert transfers == 7  # 20 tensors: a flush after every 3rd, and the 2 left at stop()


def test_inplace_write_comes_after_the_measurement(tmp_path):
    x = Tensor(np.zeros((2, 3), np.float32))
    y = Tensor(np.ones((2, 3), np.float64))
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    x.add_(Tensor(np.full((2, 3), 5.0, np.float32)))
    y[0] = 9.0
    dbg.stop()
    dbg.step()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    assert data["Tensor.add_.0.forward"]["input_args"][0]["Max"] == 0.0  # before the write
    assert data["Tensor.add_.0.forward"]["output"][0]["Max"] == 5.0
    assert data["Tensor.__setitem__.0.forward"]["input_args"][0]["Max"] == 1.0


#: (kernel, call, dtype) that MindSpore 2.10's CPU backend lacks (docs/mindspore.md, "Kernels
#: MindSpore lacks on CPU"); the device path never calls them
_MISSING_ON_CPU = [
    ("LinalgVectorNorm", lambda t: mint.linalg.vector_norm(t), ms.float32),
    ("LinalgVectorNorm", lambda t: mint.linalg.vector_norm(t), ms.float64),
    ("ReduceMax", lambda t: ops.amax(t), ms.bfloat16),
    ("ReduceMax", lambda t: ops.amax(t), ms.bool_),
    ("ReduceMin", lambda t: ops.amin(t), ms.bfloat16),
    ("ReduceMin", lambda t: ops.amin(t), ms.bool_),
    ("Reduce (mint.max)", lambda t: mint.max(t), ms.bfloat16),
    ("Reduce (mint.sum)", lambda t: mint.sum(t), ms.bfloat16),
    ("UnsortedSegmentMax", lambda t: ops.unsorted_segment_max(t, Tensor(np.zeros(3, np.int32)), 1), ms.bfloat16),
    ("UnsortedSegmentMin", lambda t: ops.unsorted_segment_min(t, Tensor(np.zeros(3, np.int32)), 1), ms.bool_),
    ("UnsortedSegmentSum", lambda t: ops.unsorted_segment_sum(t, Tensor(np.zeros(3, np.int32)), 1), ms.bfloat16),
    ("Square", lambda t: ops.square(t), ms.bfloat16),
    ("Abs", lambda t: ops.abs(t), ms.bfloat16),
]


def _drain() -> None:
    """Let an error MindSpore reports late (at the next synchronisation) surface here."""
    for _ in range(2):
        try:
            (Tensor(np.ones(2, np.float32)) * 1).asnumpy()
        except (RuntimeError, TypeError):
            pass


@pytest.mark.parametrize("kernel,call,dtype", _MISSING_ON_CPU,
                         ids=[f"{k}-{d}" for k, _c, d in _MISSING_ON_CPU])
def test_cpu_backend_lacks_the_kernels_the_device_path_avoids(kernel, call, dtype):
    """The kernels docs/mindspore.md lists as missing on CPU are missing (if a MindSpore
    release adds one, this fails and the list is out of date)."""
    assert ms.get_context("device_target") == "CPU"
    t = Tensor(np.array([1.0, -2.0, 3.0], np.float32)).astype(dtype)
    try:
        with pytest.raises((RuntimeError, TypeError)):
            call(t).asnumpy()
    finally:
        _drain()


def test_device_path_measures_those_dtypes_without_the_missing_kernels(tmp_path, caplog):
    """bf16, bool, integers and complex take the device path on CPU (casts first), in one
    host transfer, with no fallback."""
    cases = {k: v for k, v in _cases().items() if k in ("bf16", "bool", "bool_all", "i8", "u8", "c64", "f16")}
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
        dbg.start()
        for t in cases.values():
            ops.reshape(t, (-1,))
        pending = dbg.recorder.device_stats.pending
        dbg.stop()
        transfers = dbg.recorder.device_stats.transfers
        dbg.step()
        dbg.close()
    assert pending == 2 * len(cases) and transfers == 1
    assert not any("device statistics failed" in r.getMessage() for r in caplog.records)
    data = load_dump(tmp_path / "d")[0]["data"]
    for i, (name, t) in enumerate(cases.items()):
        rec, ref = data[f"Functional.reshape.{i}.forward"]["input_args"][0], _reference(t)
        assert rec["Max"] == ref["Max"] and rec["Min"] == ref["Min"], name
        if "Norm" in ref and not name.startswith("bool"):
            assert rec["Norm"] == pytest.approx(ref["Norm"], rel=1e-12, abs=0), name


def test_missing_kernel_at_a_flush_falls_back_to_the_host(tmp_path, monkeypatch, caplog):
    """A flush whose device op fails (here: MindSpore's real CPU error for a bf16
    UnsortedSegmentMax) measures its tensors on the host from their copies."""
    real = device_stats.ops.unsorted_segment_max

    def bf16_segment_max(x, ids, k):  # a kernel the CPU backend lacks
        return real(ops.cast(x, ms.bfloat16), ids, k)

    monkeypatch.setattr(device_stats.ops, "unsorted_segment_max", bf16_segment_max)
    cases = {k: v for k, v in _cases().items() if k in ("f32", "f64", "bool", "nan_inf", "scalar", "i32")}
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        records = _record(tmp_path, cases)
    _drain()
    assert any("device statistics failed" in r.getMessage() and "TypeError" in r.getMessage()
               for r in caplog.records)
    for name, t in cases.items():
        host = array_stats(t.asnumpy())
        rec = records[name]
        for key, field in (("Max", "max"), ("Min", "min"), ("Mean", "mean"), ("Norm", "norm")):
            want = getattr(host, field)
            assert (want is None and rec[key] is None) or (math.isnan(want) and math.isnan(rec[key])) \
                or rec[key] == want, (name, key)


def test_training_gradients_and_loss_unchanged_by_device_copies(tmp_path):
    """The copies are made outside the gradient graph: losses equal an unrecorded run's bits."""
    x = make_input()
    plain = train_loop(make_net(), x, None, steps=2)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    recorded = train_loop(make_net(), x, dbg, steps=2)
    dbg.close()
    assert [np.asarray(v).tobytes() for v in plain] == [np.asarray(v).tobytes() for v in recorded]
    data = load_dump(tmp_path / "d")[0]["data"]
    grads = [rec for k, v in data.items() if k.endswith("parameters_grad") for recs in v.values() for rec in recs]
    assert len(grads) == 4 and all(rec["Norm"] > 0 and not rec.get("Max_except_inf_nan") for rec in grads)


def test_flush_at_the_memory_budget(tmp_path):
    rng = np.random.default_rng(5)
    xs = [Tensor(rng.standard_normal((2, 3)).astype(np.float32)) for _ in range(5)]
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.recorder.device_stats.budget = 48  # two float32 copies of 6 elements
    dbg.start()
    for x in xs:
        ops.neg(x)
    dbg.stop()
    transfers = dbg.recorder.device_stats.transfers
    dbg.step()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    assert [data[f"Functional.neg.{i}.forward"]["output"][0]["Min"] for i in range(5)] == [
        float((-x.asnumpy()).min()) for x in xs]
    assert transfers == 5  # one flush per call (input and output copies fill the budget)


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match="limit and budget must be positive"):
        device_stats.DeviceStats(limit=0)
    with pytest.raises(ValueError, match="limit and budget must be positive"):
        device_stats.DeviceStats(budget=-1)


def test_parameter_requires_grad_recorded_as_set(tmp_path):
    p = ms.Parameter(Tensor(np.array([1.0, -3.0], np.float32)), name="frozen", requires_grad=True)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    ops.abs(p)
    p.requires_grad = False
    ops.abs(p)
    dbg.stop()
    dbg.step()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    assert data["Functional.abs.0.forward"]["input_args"][0]["requires_grad"] is True
    assert data["Functional.abs.1.forward"]["input_args"][0]["requires_grad"] is False
    assert data["Functional.abs.1.forward"]["input_args"][0]["Min"] == -3.0
