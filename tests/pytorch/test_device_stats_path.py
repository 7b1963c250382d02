"""The device (sync-free) statistics path agrees with the host path
(:func:`msprobe.pytorch.stats.tensor_stats`) and with numpy float64, and never breaks the
process. CPU tensors are sent through the device functions directly (``stats_vector`` ->
``gather`` -> ``_fill``), as the recorder does at a flush point."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch.deferred import _fill, gather, stats_vector
from msprobe.pytorch.stats import crc32_hex
from store import schema
from store.records import Leaf


def device_leaf(t: torch.Tensor) -> Leaf:
    leaf = Leaf(io="x", path=(), leaf_kind=schema.LEAF_TENSOR, dtype=str(t.dtype),
                shape=tuple(t.shape), numel=t.numel())
    return _fill(leaf, gather([stats_vector(t)])[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("value", [1e19, 1e-25, 1e-40])
def test_norm_does_not_overflow_or_underflow(dtype, value):
    # squares of these values overflow (1e38) or underflow float32, while the true Norm
    # (sqrt(1000) * value) fits float32 (fp16 cannot hold them: use its own extremes)
    if dtype == torch.float16:
        value = {1e19: 60000.0, 1e-25: 1e-7, 1e-40: 6e-8}[value]
    t = torch.full((1000,), value, dtype=dtype)
    a = t.double().numpy()
    leaf = device_leaf(t)
    assert leaf.norm == pytest.approx(math.sqrt(float(np.dot(a, a))), rel=1e-6, abs=0)
    assert leaf.mean == pytest.approx(float(a.mean()), rel=1e-6, abs=0)


@pytest.mark.parametrize("dtype", [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2")
                                   if hasattr(torch, n)])
def test_float8(dtype):
    t = torch.tensor([[1.0, -2.0], [3.0, 0.5]]).to(dtype)
    a = t.double().numpy()
    leaf = device_leaf(t)
    assert (leaf.max, leaf.min) == (3.0, -2.0)
    assert leaf.mean == pytest.approx(a.mean()) and leaf.norm == pytest.approx(np.sqrt((a * a).sum()))
    assert leaf.has_nan is False and leaf.has_inf is False


def test_crc32_of_freed_storage_is_null():
    t = torch.randn(4)
    t.untyped_storage().resize_(0)  # as FSDP frees unsharded parameters
    assert crc32_hex(t) is None
    assert crc32_hex(torch.empty(0)) == "00000000"


@pytest.mark.parametrize("mode", [{"task": "statistics", "summary_mode": "md5"}, {"task": "tensor"}])
def test_async_dump_freed_storage(tmp_path, mode):
    # async_dump cloned every recorded tensor for md5/tensor, a freed one too: a segfault
    # before the user's call (which itself raises a RuntimeError here)
    task = mode["task"]
    cfg = {"task": task, "dump_path": str(tmp_path / "d"), "level": "L1", "async_dump": True,
           task: {"list": ["unsqueeze", "neg"], **({"summary_mode": mode["summary_mode"]} if "summary_mode" in mode else {})}}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    dbg = PrecisionDebugger(config_path=str(tmp_path / "c.json"))
    dbg.start()
    t = torch.randn(4)
    t.untyped_storage().resize_(0)
    with pytest.raises(RuntimeError, match="out of bounds"):
        t.unsqueeze(0)
    torch.neg(torch.tensor([1.0, -2.0]))
    dbg.stop()
    dbg.step()
    dbg.close()
    data = {}
    for f in (tmp_path / "d").rglob("dump.json"):
        data.update(json.loads(f.read_text())["data"])
    neg = data["Torch.neg.0.forward"]["output"][0]
    assert (neg["Max"], neg["Min"], neg["Mean"]) == (2.0, -1.0, 0.5)


def test_triton_path_refuses_negative_views(monkeypatch):
    # the fused kernel reads raw memory: a contiguous lazy negation (a 1-element or 0-d
    # ``z.conj().imag``, ``torch._neg_view``) gave the statistics of the un-negated values
    from msprobe.pytorch import triton_stats

    monkeypatch.setattr(triton_stats, "kernels", lambda: object())  # as if Triton loaded
    x = torch.tensor([1.0, -5.0, 3.0])
    assert triton_stats.usable(x, any_device=True)
    imag = torch.tensor([1 + 2j]).conj().imag
    assert imag.is_contiguous() and imag.is_neg()
    assert not triton_stats.usable(imag, any_device=True)
    if hasattr(torch, "_neg_view"):
        assert not triton_stats.usable(torch._neg_view(x), any_device=True)
    leaf = device_leaf(imag)
    assert (leaf.max, leaf.min, leaf.norm) == (-2.0, -2.0, 2.0)


def test_triton_launch_on_the_tensors_gpu(monkeypatch):
    # Triton launches on the current device (and its stream): a tensor on cuda:1 while
    # cuda:0 is current could not be read ("cannot be accessed from Triton", which stopped
    # the recording) or was read on the wrong stream; the launch now makes its device current
    from msprobe.pytorch import triton_stats

    entered = []

    class Guard:
        def __init__(self, device):
            entered.append(torch.device(device))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", Guard)
    with triton_stats._on_device(torch.device("cuda", 1)):
        pass
    with triton_stats._on_device(torch.device("cuda", 0)), triton_stats._on_device(torch.device("cpu")):
        pass
    assert entered == [torch.device("cuda", 1)]
