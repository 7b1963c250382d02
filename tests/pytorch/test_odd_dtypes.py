"""Quantized tensors and dtypes PyTorch stores but cannot compute with (sub-byte integers,
``bits*``, packed float4) are recorded without stopping the recording: quantized tensors by
the statistics of their dequantized values, the others by dtype and shape with null
statistics; md5 hashes the stored bytes; task tensor writes a ``.pt`` where ``torch.save``
can."""
from __future__ import annotations

import json
import warnings
import zlib

import numpy as np
import pytest
import torch

from pt_helpers import load_dump
from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch.leaves import LeafBuilder
from msprobe.pytorch.stats import OPAQUE_DTYPES, crc32_hex, tensor_stats

warnings.filterwarnings("ignore", message=".*quantize.*deprecated", category=UserWarning)


def _quantized():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 5, generator=g) * 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            "qint8": torch.quantize_per_tensor(x, 0.05, 3, torch.qint8),
            "quint8": torch.quantize_per_tensor(x, 0.1, 128, torch.quint8),
            "qint32": torch.quantize_per_tensor(x, 0.001, -7, torch.qint32),
            "per_channel": torch.quantize_per_channel(
                x, torch.tensor([0.1, 0.02, 0.3, 0.04, 0.5, 0.06], dtype=torch.float64),
                torch.tensor([0, 1, -2, 3, 0, 5]), 0, torch.qint8),
        }


def _dequantized_np(q: torch.Tensor) -> np.ndarray:
    """(codes - zero point) * scale, from the integer codes with numpy, rounded to float32
    as PyTorch stores dequantized values."""
    codes = q.int_repr().numpy().astype(np.float64)
    if q.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        scale, zero = np.float32(q.q_scale()), q.q_zero_point()
        values = (codes - zero) * scale
    else:
        axis = q.q_per_channel_axis()
        shape = [1] * q.dim()
        shape[axis] = -1
        scale = q.q_per_channel_scales().numpy().astype(np.float32).astype(np.float64).reshape(shape)
        zero = q.q_per_channel_zero_points().numpy().reshape(shape)
        values = (codes - zero) * scale
    return values.astype(np.float32).astype(np.float64)


@pytest.mark.parametrize("name", ["qint8", "quint8", "qint32", "per_channel"])
def test_quantized_statistics_are_those_of_the_dequantized_values(name):
    q = _quantized()[name]
    a = _dequantized_np(q)
    s = tensor_stats(q)
    assert (s.max, s.min) == (a.max(), a.min())
    assert s.mean == pytest.approx(a.mean(), rel=1e-6)
    assert s.norm == pytest.approx(np.sqrt((a * a).sum()), rel=1e-6)
    assert s.has_nan is False and s.has_inf is False


def _opaque(dtype: torch.dtype) -> torch.Tensor:
    raw = torch.arange(12, dtype=torch.uint8).reshape(3, 4) * 7
    return raw.view(dtype) if dtype.itemsize == 1 else raw.view(torch.int16).view(dtype)


@pytest.mark.parametrize("dtype", sorted(OPAQUE_DTYPES, key=str), ids=str)
def test_opaque_dtypes_have_null_statistics_and_a_crc_of_their_bytes(dtype):
    t = _opaque(dtype)
    s = tensor_stats(t)
    assert (s.max, s.min, s.mean, s.norm) == (None, None, None, None)
    raw = (torch.arange(12, dtype=torch.uint8) * 7).numpy().tobytes()
    assert crc32_hex(t) == format(zlib.crc32(raw), "08x")
    assert crc32_hex(t.t()) is None  # not in C order: no copy kernel for these dtypes


def test_quantized_crc_is_of_the_integer_codes():
    q = _quantized()["qint8"]
    assert crc32_hex(q) == format(zlib.crc32(q.int_repr().numpy().tobytes()), "08x")


@pytest.mark.parametrize("defer_all", [False, True])
def test_leaf_builder_on_both_statistics_paths(defer_all):
    """The host path and the deferred (device) path give the dequantized statistics; an
    opaque tensor is never deferred (no kernel could reduce it)."""
    from msprobe.pytorch.deferred import DeferredStats, PendingLeaf
    from store.records import Call

    lb = LeafBuilder(md5=False, defer_all=defer_all)
    q = _quantized()["per_channel"]
    a = _dequantized_np(q)
    leaves = [lb.tensor_leaf("input", (0,), q), lb.tensor_leaf("input", (1,), _opaque(torch.uint4))]
    assert isinstance(leaves[0], PendingLeaf) is defer_all
    assert not isinstance(leaves[1], PendingLeaf)
    if defer_all:
        queue = DeferredStats()
        queue.add(Call(step=0, kind="api_forward", name="x", api_type="Torch", leaves=()), leaves)
        leaves = list(queue.resolve()[0].leaves)
    leaf, opaque = leaves
    assert (leaf.max, leaf.min) == (a.max(), a.min())
    assert leaf.mean == pytest.approx(a.mean(), rel=1e-6)
    assert leaf.dtype == "torch.qint8" and leaf.shape == (6, 5)
    assert opaque.dtype == "torch.uint4" and opaque.shape == (3, 4)
    assert (opaque.max, opaque.min, opaque.mean, opaque.norm) == (None, None, None, None)


def _record(tmp_path, task, summary_mode="statistics", async_dump=False):
    cfg = {"task": task, "level": "L1", "dump_path": str(tmp_path / "d"), "async_dump": async_dump}
    if task == "statistics":
        cfg["statistics"] = {"summary_mode": summary_mode}
    elif async_dump:  # async_dump with task tensor needs a list (spec)
        cfg["tensor"] = {"list": ["flatten", "add", "dequantize"]}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    dbg = PrecisionDebugger(config_path=str(tmp_path / "c.json"))
    q = _quantized()["qint8"]
    x = torch.linspace(-1, 1, 8)
    dbg.start()
    torch.dequantize(q)
    for dtype in (torch.uint4, torch.bits8, torch.float4_e2m1fn_x2):
        torch.flatten(_opaque(dtype))
    y = torch.add(x, 1)  # recorded after the odd ones: recording went on
    dbg.stop()
    dbg.step()
    dbg.close()
    return load_dump(tmp_path / "d")[0]["data"], q, x, y


@pytest.mark.parametrize("async_dump", [False, True])
@pytest.mark.parametrize("summary_mode", ["statistics", "md5"])
def test_recording_goes_on_after_odd_dtypes(tmp_path, summary_mode, async_dump):
    data, q, x, y = _record(tmp_path, "statistics", summary_mode, async_dump)
    a = _dequantized_np(q)
    rec = data["Torch.dequantize.0.forward"]["input_args"][0]
    assert rec["dtype"] == "torch.qint8" and rec["shape"] == [6, 5]
    assert (rec["Max"], rec["Min"]) == (a.max(), a.min())
    for i, dtype in enumerate(("torch.uint4", "torch.bits8", "torch.float4_e2m1fn_x2")):
        rec = data[f"Torch.flatten.{i}.forward"]["input_args"][0]
        assert rec["dtype"] == dtype and rec["shape"] == [3, 4]
        assert (rec["Max"], rec["Min"], rec["Mean"], rec["Norm"]) == (None, None, None, None)
        if summary_mode == "md5":
            raw = (torch.arange(12, dtype=torch.uint8) * 7).numpy().tobytes()
            assert rec["md5"] == format(zlib.crc32(raw), "08x")
    out = data["Torch.add.0.forward"]["output"][0]
    assert out["Max"] == float(y.max()) and out["Min"] == float(y.min())


@pytest.mark.parametrize("async_dump", [False, True])
def test_tensor_task_writes_what_torch_save_can(tmp_path, async_dump):
    data, q, x, y = _record(tmp_path, "tensor", async_dump=async_dump)
    tensors = tmp_path / "d" / "step0" / "rank" / "dump_tensor_data"
    uint4 = data["Torch.flatten.0.forward"]["input_args"][0]
    assert "data_name" not in uint4  # torch.save rejects torch.uint4: no file, recording goes on
    for i, dtype in ((1, torch.bits8), (2, torch.float4_e2m1fn_x2)):
        rec = data[f"Torch.flatten.{i}.forward"]["input_args"][0]
        loaded = torch.load(tensors / rec["data_name"], weights_only=True)
        assert loaded.dtype == dtype and loaded.shape == (3, 4)
        assert loaded.view(torch.uint8).numpy().tobytes() == (torch.arange(12, dtype=torch.uint8) * 7).numpy().tobytes()
    out = data["Torch.add.0.forward"]["output"][0]
    assert torch.equal(torch.load(tensors / out["data_name"], weights_only=True), y)


def test_zero_dim_opaque_tensor_of_two_bytes():
    # a 0-dim tensor cannot be viewed as bytes of another element size (bits16 -> uint8):
    # crc32_hex raised, and md5 or async_dump stopped the recording
    t = torch.tensor(0x1234, dtype=torch.int16).view(torch.bits16)
    assert t.dim() == 0
    assert crc32_hex(t) == format(zlib.crc32(np.array(0x1234, dtype="<i2").tobytes()), "08x")
    assert (tensor_stats(t).max, tensor_stats(t).norm) == (None, None)


def _flatten_record(tmp_path, cfg: dict, t: torch.Tensor) -> dict:
    """Record ``torch.flatten(t)`` then ``torch.add`` (the recording must go on) with ``cfg``;
    the input record of the flatten call, after asserting the add was recorded."""
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    dbg = PrecisionDebugger(config_path=str(tmp_path / "c.json"))
    dbg.start()
    torch.flatten(t)
    torch.add(torch.ones(2), 1)
    dbg.stop()
    dbg.step()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    assert data["Torch.add.0.forward"]["output"][0]["Max"] == 2.0  # recording went on
    return data["Torch.flatten.0.forward"]["input_args"][0]


@pytest.mark.parametrize("async_dump", [False, True])
@pytest.mark.parametrize("task", ["md5", "tensor"])
def test_zero_dim_opaque_tensor_is_recorded(tmp_path, task, async_dump):
    cfg = {"task": "tensor" if task == "tensor" else "statistics", "level": "L1",
           "dump_path": str(tmp_path / "d"), "async_dump": async_dump}
    if task == "md5":
        cfg["statistics"] = {"summary_mode": "md5"}
    elif async_dump:
        cfg["tensor"] = {"list": ["flatten", "add"]}
    rec = _flatten_record(tmp_path, cfg, torch.tensor(0x1234, dtype=torch.int16).view(torch.bits16))
    assert rec["dtype"] == "torch.bits16" and rec["shape"] == []
    if task == "md5":
        assert rec["md5"] == format(zlib.crc32(np.array(0x1234, dtype="<i2").tobytes()), "08x")
    else:
        loaded = torch.load(tmp_path / "d" / "step0" / "rank" / "dump_tensor_data" / rec["data_name"],
                            weights_only=True)
        assert loaded.dtype == torch.bits16 and loaded.shape == ()
        assert loaded.view(-1).view(torch.uint8).tolist() == [0x34, 0x12]


def _sub_byte_quantized_views():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.quantize_per_tensor(torch.linspace(0, 1.4, 24).reshape(4, 6), 0.1, 1, torch.quint4x2)
    # PyTorch has no copy kernel for quint4x2: a view that is not contiguous cannot be
    # dequantized (NotImplementedError, which stopped the recording); a contiguous view
    # with a storage offset dequantizes values of other rows (q[1:3] gives rows 2 and 3),
    # and int_repr() of any view gives packed bytes of other values
    return q, {"t": q.t(), "slice": q[:, ::2], "expand": q[:1].expand(3, 6), "rows": q[1:3]}


@pytest.mark.parametrize("view", ["t", "slice", "expand", "rows"])
def test_views_of_packed_quantized_tensors_get_null_statistics(view):
    from msprobe.pytorch.deferred import PendingLeaf

    q, views = _sub_byte_quantized_views()
    v = views[view]
    s = tensor_stats(v)
    assert (s.max, s.min, s.mean, s.norm) == (None, None, None, None)
    assert crc32_hex(v) is None
    assert not isinstance(LeafBuilder(md5=False, defer_all=True).tensor_leaf("input", (0,), v), PendingLeaf)
    # the whole tensor: its dequantized values, and the CRC-32 of its packed bytes
    a = q.dequantize().double().numpy()
    whole = tensor_stats(q)
    assert (whole.max, whole.min) == (a.max(), a.min()) and whole.mean == pytest.approx(a.mean(), rel=1e-6)
    assert crc32_hex(q) == format(zlib.crc32(q.int_repr().numpy().tobytes()), "08x")


@pytest.mark.parametrize("async_dump", [False, True])
@pytest.mark.parametrize("summary_mode", ["statistics", "md5"])
def test_view_of_a_packed_quantized_tensor_is_recorded(tmp_path, summary_mode, async_dump):
    cfg = {"task": "statistics", "level": "L1", "dump_path": str(tmp_path / "d"), "async_dump": async_dump,
           "statistics": {"summary_mode": summary_mode}}
    q, views = _sub_byte_quantized_views()
    rec = _flatten_record(tmp_path, cfg, views["t"][0])  # a view of the view: no copy needed by PyTorch
    assert rec["dtype"] == "torch.quint4x2" and rec["shape"] == [4]
    assert (rec["Max"], rec["Min"], rec["Mean"], rec["Norm"]) == (None, None, None, None)
    if summary_mode == "md5":
        assert rec.get("md5") is None  # no CRC-32 of bytes that are not its own


def test_memo_keeps_a_packed_view_and_its_tensor_apart():
    # q.t() is dense over q's memory: without md5 both had the same memo key, so whichever
    # came first gave its statistics (null, or q's) to the other in the same call
    q, views = _sub_byte_quantized_views()
    a = q.dequantize().double().numpy()
    for first, second in ((views["t"], q), (q, views["t"])):
        builder = LeafBuilder(md5=False)
        leaves = {id(t): builder.tensor_leaf("input", (i,), t) for i, t in enumerate((first, second))}
        assert leaves[id(q)].max == a.max() and leaves[id(views["t"])].max is None


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"])
def test_float8_md5_is_the_crc_of_its_float32_values(name):
    """No numpy dtype holds float8: like bf16 (spec 3.5) it is widened to float32 (exact)
    and the C-order bytes of that are hashed (views too)."""
    dtype = getattr(torch, name)
    if name == "float8_e8m0fnu":  # powers of two only: build it from its bit patterns
        x = (torch.arange(12, dtype=torch.uint8) * 9).view(dtype).reshape(4, 3)
    else:
        x = (torch.linspace(-3, 3, 12).reshape(4, 3)).to(dtype)
    for t in (x, x.t(), x[1:, ::2]):
        values = np.array([[float(v) for v in row] for row in t.float().tolist()], dtype=np.float32)
        assert crc32_hex(t) == format(zlib.crc32(np.ascontiguousarray(values).tobytes()), "08x")
