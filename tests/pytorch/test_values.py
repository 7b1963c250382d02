"""Recorded values equal independent computations (numpy float64 statistics, zlib CRC-32,
gradients from torch.autograd.grad)."""
from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pt_helpers import ModuleOP, assert_record, load_dump
from msprobe.pytorch import PrecisionDebugger


def record_quickstart(tmp_path, level="mix", **kw):
    torch.manual_seed(0)
    module = ModuleOP()
    x = torch.randn(10, 8)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level=level, **kw)
    dbg.start(model=module)
    out = module(x)
    out.sum().backward()
    dbg.stop()
    dbg.close()
    return module, x, load_dump(tmp_path / "d")[0]["data"]


def independent(module, x):
    """Forward and gradients recomputed without the recorder."""
    w1, b1 = module.linear_1.weight.detach().clone().requires_grad_(), module.linear_1.bias.detach().clone().requires_grad_()
    w2, b2 = module.linear_2.weight.detach().clone().requires_grad_(), module.linear_2.bias.detach().clone().requires_grad_()
    y1 = F.linear(x, w1, b1)
    y2 = F.linear(y1, w2, b2)
    r = F.relu(y2)
    loss = r.sum()
    g = dict(zip(("y1", "y2", "r", "w1", "b1", "w2", "b2"),
                 torch.autograd.grad(loss, (y1, y2, r, w1, b1, w2, b2))))
    return dict(y1=y1.detach(), y2=y2.detach(), r=r.detach(), loss=loss.detach(),
                w1=w1.detach(), b1=b1.detach(), w2=w2.detach(), b2=b2.detach()), g


def test_forward_statistics(tmp_path):
    module, x, data = record_quickstart(tmp_path)
    v, _ = independent(module, x)
    e = data["Functional.linear.0.forward"]
    assert_record(e["input_args"][0], x)
    assert_record(e["input_args"][1], v["w1"])
    assert_record(e["input_args"][2], v["b1"])
    assert e["input_args"][1]["requires_grad"] is True and e["input_args"][0]["requires_grad"] is False
    assert_record(e["output"][0], v["y1"])
    assert e["input_kwargs"] == {}
    assert e["is_recompute"] is False
    assert_record(data["Functional.linear.1.forward"]["output"][0], v["y2"])
    assert_record(data["Functional.relu.0.forward"]["output"][0], v["r"])
    assert_record(data["Tensor.sum.0.forward"]["output"][0], v["loss"])
    m = data["Module.linear_2.Linear.forward.0"]
    assert_record(m["input_args"][0], v["y1"])
    assert_record(m["output"][0], v["y2"])
    assert_record(m["parameters"]["weight"], v["w2"])
    assert_record(m["parameters"]["bias"], v["b2"])


def test_backward_equals_autograd(tmp_path):
    module, x, data = record_quickstart(tmp_path)
    _, g = independent(module, x)
    relu_b = data["Functional.relu.0.backward"]
    assert_record(relu_b["input"][0], g["r"])
    assert_record(relu_b["output"][0], g["y2"])
    lin1 = data["Functional.linear.1.backward"]
    assert_record(lin1["input"][0], g["y2"])
    # output[i] is the gradient w.r.t. input_args[i] (spec 9 fix 3)
    assert_record(lin1["output"][0], g["y1"])
    assert_record(lin1["output"][1], g["w2"])
    assert_record(lin1["output"][2], g["b2"])
    lin0 = data["Functional.linear.0.backward"]
    assert lin0["output"][0] is None  # x does not require grad
    assert_record(lin0["output"][1], g["w1"])
    mod2 = data["Module.linear_2.Linear.backward.0"]
    assert_record(mod2["input"][0], g["y2"])
    assert_record(mod2["output"][0], g["y1"])
    pg = data["Module.linear_1.Linear.parameters_grad"]
    assert_record(pg["weight"][0], g["w1"])
    assert_record(pg["bias"][0], g["b1"])
    assert_record(data["Module.linear_2.Linear.parameters_grad"]["weight"][0], g["w2"])


def test_md5_is_crc32_of_bytes(tmp_path):
    module, x, data = record_quickstart(tmp_path, level="L1")
    # default summary_mode has no md5
    assert "md5" not in data["Functional.linear.0.forward"]["input_args"][0]
    cfg = tmp_path / "c.json"
    cfg.write_text('{"task": "statistics", "dump_path": "%s", "level": "L1", '
                   '"statistics": {"summary_mode": "md5"}}' % (tmp_path / "m"))
    torch.manual_seed(0)
    module = ModuleOP()
    x = torch.randn(10, 8)
    dbg = PrecisionDebugger(config_path=str(cfg))
    dbg.start()
    module(x).sum().backward()
    dbg.stop()
    dbg.close()
    data = load_dump(tmp_path / "m")[0]["data"]
    rec = data["Functional.linear.0.forward"]["input_args"][0]
    assert rec["md5"] == format(zlib.crc32(x.numpy().tobytes()), "08x")
    w = module.linear_1.weight.detach()
    assert data["Functional.linear.0.forward"]["input_args"][1]["md5"] == format(zlib.crc32(w.numpy().tobytes()), "08x")


def test_spec_crc_example():
    # spec 3.5: torch.randn(4,5) under seed 0 -> 8e0be875, its bf16 cast -> 2fc54fc6
    from msprobe.pytorch.stats import crc32_hex
    torch.manual_seed(0)
    t = torch.randn(4, 5)
    assert crc32_hex(t) == "8e0be875"
    assert crc32_hex(t.bfloat16()) == "2fc54fc6"
    assert crc32_hex(torch.empty(0)) == "00000000"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                   torch.int32, torch.int64, torch.uint8])
def test_tensor_stats_dtypes(dtype):
    from msprobe.pytorch.stats import tensor_stats
    torch.manual_seed(1)
    t = (torch.randn(257, 33) * 50).to(dtype)
    s = tensor_stats(t)
    a = t.to(torch.float64).numpy()
    assert s.max == a.max() and s.min == a.min()
    if dtype in (torch.float64, torch.int32, torch.int64, torch.uint8):
        assert s.mean == pytest.approx(a.mean(), rel=1e-9)
    else:  # float32 accumulation (spec 9): error below eps32 * log2(n) * sum(|x|)
        bound = float(np.finfo(np.float32).eps) * math.log2(a.size) * float(np.abs(a).sum())
        assert abs(s.mean * a.size - a.sum()) <= bound
    assert s.norm == pytest.approx(np.sqrt((a * a).sum()), rel=1e-6)
    assert s.has_nan is False and s.has_inf is False


def test_tensor_stats_special():
    from msprobe.pytorch.stats import tensor_stats
    s = tensor_stats(torch.tensor([1.0, float("nan"), float("inf"), -2.0]))
    assert math.isnan(s.max) and s.has_nan and s.has_inf
    assert (s.max_finite, s.min_finite) == (1.0, -2.0)
    s = tensor_stats(torch.tensor(-8.5))
    assert (s.max, s.min, s.mean, s.norm) == (-8.5, -8.5, -8.5, 8.5)  # 0-dim Norm = |x| (fix 10)
    s = tensor_stats(torch.tensor([True, False]))
    assert (s.max, s.min, s.mean, s.norm) == (1.0, 0.0, None, None)
    s = tensor_stats(torch.empty(0, 3))
    assert (s.max, s.min, s.mean, s.norm) == (None, None, None, None)
    s = tensor_stats(torch.tensor([3 + 4j, 0 + 1j], dtype=torch.complex64))
    assert (s.max, s.min) == (5.0, 1.0) and s.mean == pytest.approx(3.0) and s.norm == pytest.approx(math.sqrt(26))
    big = torch.full((1000,), 60000.0, dtype=torch.float16)  # Norm overflows fp16, fits fp32
    s = tensor_stats(big)
    assert s.norm == pytest.approx(60000.0 * math.sqrt(1000), rel=1e-6)
    s = tensor_stats(torch.empty(3, device="meta"))
    assert s.max is None


def test_non_tensor_records(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    x = torch.arange(12.0).reshape(3, 4)
    dbg.start()
    x[0:2, ...]
    torch.sum(x, dim=1, keepdim=True, dtype=torch.float64)
    x.to(torch.float16)  # not in the API list: not recorded
    torch.cat([x, x], dim=0)
    dbg.stop()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    gi = data["Tensor.__getitem__.0.forward"]["input_args"]
    assert gi[1] == [{"type": "slice", "value": [0, 2, None]}, {"type": "ellipsis", "value": "..."}]
    s = data["Torch.sum.0.forward"]
    assert s["input_kwargs"]["dim"] == {"type": "int", "value": 1}
    assert s["input_kwargs"]["keepdim"] == {"type": "bool", "value": True}
    assert s["input_kwargs"]["dtype"] == {"type": "torch.dtype", "value": "torch.float64"}
    assert s["output"][0]["dtype"] == "torch.float64"
    assert not any(k.startswith("Tensor.to.") for k in data)
    c = data["Torch.cat.0.forward"]["input_args"]
    assert len(c[0]) == 2 and c[0][0]["shape"] == [3, 4]


def test_recording_leaves_storages_resizable(tmp_path):
    """Tensor.numpy() would pin storages for ever; FSDP frees storages by resizing them."""
    cfg = tmp_path / "c.json"
    cfg.write_text('{"task": "statistics", "dump_path": "%s", "level": "L1", '
                   '"statistics": {"summary_mode": "md5"}}' % (tmp_path / "d"))
    dbg = PrecisionDebugger(config_path=str(cfg))
    x = torch.randn(16)
    dbg.start()
    y = torch.tanh(x)
    dbg.stop()
    dbg.close()
    x.untyped_storage().resize_(0)
    y.untyped_storage().resize_(0)
