"""async_dump: the same dump.json (statistics, md5) and tensor files as the synchronous
path, written at stop()/step(); task tensor requires a list (spec 5.1, 5.3; fix 14)."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from pt_helpers import ModuleOP, load_dump
from msprobe.core.errors import ConfigError
from msprobe.pytorch import PrecisionDebugger


def run(tmp_path, name, *, async_dump, task="statistics", summary_mode="statistics", names=None, steps=2):
    cfg = {"task": task, "dump_path": str(tmp_path / name), "level": "mix", "async_dump": async_dump,
           task: {"list": names or []}}
    if task == "statistics":
        cfg[task]["summary_mode"] = summary_mode
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    torch.manual_seed(0)
    module = ModuleOP()
    dbg = PrecisionDebugger(config_path=str(path))
    for i in range(steps):
        dbg.start(model=module)
        x = torch.randn(10, 8)
        out = module(x)
        odd = torch.tensor([1.0, float("nan"), float("inf"), -2.0]) * (i + 1)
        torch.neg(odd)
        torch.logical_not(torch.tensor([True, False]))
        torch.abs(torch.complex(torch.randn(3), torch.randn(3)))
        torch.neg(torch.tensor(-3.5))
        torch.neg(torch.empty(0))
        out.sum().backward()
        dbg.stop()
        dbg.step()
    dbg.close()
    return tmp_path / name


def assert_same(a, b, where="data"):
    """Equal JSON values; Mean and Norm to 1e-6 relative (the device path accumulates the
    Norm with other precisions and orders than the host path), NaN equal to NaN."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for k in a:
            if k in ("Mean", "Norm") and isinstance(a[k], float):
                assert b[k] == pytest.approx(a[k], rel=1e-6, nan_ok=True), f"{where}.{k}"
            else:
                assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}.{i}")
    elif isinstance(a, float) and a != a:
        assert isinstance(b, float) and b != b, where
    else:
        assert a == b, (where, a, b)


def dumps(path, steps=2):
    return [load_dump(path, s) for s in range(steps)]


@pytest.mark.parametrize("summary_mode", ["statistics", "md5"])
def test_async_equals_sync(tmp_path, summary_mode):
    sync = run(tmp_path, "sync", async_dump=False, summary_mode=summary_mode)
    asyn = run(tmp_path, "async", async_dump=True, summary_mode=summary_mode)
    a, b = dumps(sync), dumps(asyn)
    for (d1, s1, c1), (d2, s2, c2) in zip(a, b):
        assert_same(d1["data"], d2["data"])   # same entries, order and values
        assert c1 == c2 and set(s1) == set(s2)
        assert all(s1[k][0] == s2[k][0] for k in s1)  # deeper frames differ: run() called from two lines
    rec = a[0][0]["data"]["Torch.neg.0.forward"]["input_args"][0]
    assert rec["Max_except_inf_nan"] == 1.0 and rec["Min_except_inf_nan"] == -2.0
    if summary_mode == "md5":
        assert "md5" in b[0][0]["data"]["Functional.linear.0.forward"]["input_args"][0]


def test_async_tensor_files_equal_sync(tmp_path):
    sync = run(tmp_path, "sync", async_dump=False, task="tensor", names=["linear", "neg"])
    asyn = run(tmp_path, "async", async_dump=True, task="tensor", names=["linear", "neg"])
    for step in range(2):
        d1, d2 = load_dump(sync, step)[0], load_dump(asyn, step)[0]
        assert_same(d1["data"], d2["data"])
        t1 = sync / f"step{step}" / "rank" / "dump_tensor_data"
        t2 = asyn / f"step{step}" / "rank" / "dump_tensor_data"
        names = sorted(p.name for p in t1.iterdir())
        assert names == sorted(p.name for p in t2.iterdir()) and len(names) > 10
        for n in names:
            x, y = torch.load(t1 / n, weights_only=True), torch.load(t2 / n, weights_only=True)
            assert x.dtype == y.dtype and torch.equal(x.view(-1).view(torch.uint8), y.view(-1).view(torch.uint8))


def test_async_tensor_requires_list(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"task": "tensor", "dump_path": str(tmp_path), "async_dump": True}))
    with pytest.raises(ConfigError, match=r"`tensor.list`"):
        PrecisionDebugger(config_path=str(path))


def test_async_nothing_written_before_stop(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "d"), "level": "L1",
                                "async_dump": True}))
    dbg = PrecisionDebugger(config_path=str(path))
    dbg.start()
    torch.neg(torch.ones(3))
    assert dbg.recorder.gatherer is not None and len(dbg.recorder.gatherer._calls) == 1
    dbg.stop()
    dump, _, _ = load_dump(tmp_path / "d")
    assert dump["data"]["Torch.neg.0.forward"]["output"][0]["Max"] == -1.0
    dbg.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_async_no_device_sync_during_step(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "d"), "level": "mix",
                                "async_dump": True}))
    module = ModuleOP().cuda()
    dbg = PrecisionDebugger(config_path=str(path))
    x = torch.randn(10, 8, device="cuda")
    torch.cuda.synchronize()
    dbg.start(model=module)
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = module(x)
        F.relu(out).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    dbg.stop()
    dbg.close()
    dump, _, _ = load_dump(tmp_path / "d")
    rec = dump["data"]["Functional.relu.1.forward"]["input_args"][0]
    assert rec["Max"] == float(out.max().cpu())


def test_async_same_tensor_twice_backward(tmp_path):
    """One tensor passed twice: both backward output slots resolved (async placeholders)."""
    outs = []
    for mode in (False, True):
        path = tmp_path / f"c{mode}.json"
        path.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / f"d{mode}"),
                                    "level": "L1", "async_dump": mode}))
        dbg = PrecisionDebugger(config_path=str(path))
        a = torch.tensor([1.0, -2.0], requires_grad=True)
        dbg.start()
        torch.mul(a, a).sum().backward()
        dbg.stop()
        dbg.close()
        outs.append(load_dump(tmp_path / f"d{mode}")[0]["data"])
    assert_same(outs[0], outs[1])
    grads = outs[1]["Torch.mul.0.backward"]["output"]
    # one view for both slots: each holds the whole gradient 2a = [2, -4]
    assert [g["Max"] for g in grads] == [2.0, 2.0] and [g["Min"] for g in grads] == [-4.0, -4.0]
