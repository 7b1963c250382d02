"""The deferred (device) statistics path: no host synchronisation per recorded tensor.

There is no accelerator on CI machines, so the recorder is told to send CPU tensors
through the device path (``defer_all``), which uses only tensor operations until the
flush point. The test counts, during one recorded step, every operation that forces a
device→host synchronisation — ``aten._local_scalar_dense`` (``.item()``, ``bool(t)``,
``float(t)``), ``Tensor.tolist``/``.numpy``/``.item`` and copies to the host — and asserts
that the count does not grow with the number of recorded tensors (2 vs 8 layers).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from pt_helpers import NONFINITE, ModuleOP, load_dump, tensor_records
from msprobe.pytorch import PrecisionDebugger


class SyncCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        if "_local_scalar_dense" in name:
            self.count += 1
        elif "_to_copy" in name and str(kwargs.get("device", "")) == "cpu":
            self.count += 1
        return func(*args, **kwargs)


def record_step(tmp_path, layers, device="cpu"):
    """Record one step of a ``layers``-deep MLP on ``device`` (CPU tensors are sent through
    the device path); returns (synchronising calls, device→host transfers, dump entries)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(layers)]).to(device)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / f"d{layers}{device}"), level="mix")
    dbg.recorder.leaves.defer_all = device == "cpu"
    x = torch.randn(4, 16).to(device)
    calls = {"tolist": 0, "numpy": 0, "item": 0}
    originals = {k: getattr(torch.Tensor, k) for k in calls}

    def counting(name):
        def f(self, *a, **k):
            calls[name] += 1
            return originals[name](self, *a, **k)
        return f

    for k in calls:
        setattr(torch.Tensor, k, counting(k))
    counter = SyncCounter()
    try:
        with counter:
            dbg.start(model)
            model(x).sum().backward()
            dbg.stop()
            dbg.step()
    finally:
        for k, v in originals.items():
            setattr(torch.Tensor, k, v)
    dbg.close()
    n_tensors = sum(1 for e in load_dump(tmp_path / f"d{layers}{device}")[0]["data"].values() for _ in [e])
    return counter.count + sum(calls.values()), dbg.recorder.deferred.transfers, n_tensors


def test_sync_count_does_not_grow(tmp_path):
    syncs2, transfers2, entries2 = record_step(tmp_path, 2)
    syncs8, transfers8, entries8 = record_step(tmp_path, 8)
    assert entries8 > 3 * entries2  # four times the layers: many more recorded tensors
    assert syncs8 == syncs2
    assert transfers8 == transfers2 and transfers2 <= 3  # one per flush point (stop, step)


def test_deferred_values_equal_host_values(tmp_path):
    def run(defer):
        torch.manual_seed(0)
        m = ModuleOP()
        dbg = PrecisionDebugger(dump_path=str(tmp_path / f"d{defer}"), level="mix")
        dbg.recorder.leaves.defer_all = defer
        dbg.start(m)
        x = torch.randn(10, 8)
        x[0, 0] = float("nan")  # NaN/Inf facts through the device path too
        x[1, 1] = float("inf")
        m(x).sum().backward()
        torch.tensor([True, False]).logical_not()
        dbg.stop()
        dbg.close()
        return dict(tensor_records(load_dump(tmp_path / f"d{defer}")[0]["data"]))

    host, dev = run(False), run(True)
    assert host.keys() == dev.keys() and len(host) > 20
    for k, h in host.items():
        d = dev[k]
        assert h.keys() == d.keys(), k
        for stat in ("Max", "Min", "Mean", "Norm", "Max_except_inf_nan", "Min_except_inf_nan"):
            if stat in h:
                a, b = h[stat], d[stat]
                if a is None or isinstance(a, bool):
                    assert b == a, (k, stat)
                elif isinstance(a, float) and math.isnan(a):
                    assert math.isnan(b), (k, stat)
                else:
                    assert b == pytest.approx(a, rel=1e-6, abs=1e-12), (k, stat, a, b)


@pytest.mark.parametrize("values", NONFINITE.values(), ids=NONFINITE.keys())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_device_path_nonfinite_facts_equal_host_path(values, dtype):
    """has_nan, has_inf and the except values of the device layout (gathered and filled on
    the host) equal the host path's (msprobe.pytorch.stats.tensor_stats)."""
    from msprobe.pytorch.deferred import _fill, gather, torch_parts
    from msprobe.pytorch.stats import tensor_stats
    from store import schema
    from store.records import Leaf

    x = torch.tensor(values, dtype=dtype)
    leaf = Leaf(io="output", path=(0,), leaf_kind=schema.LEAF_TENSOR, type="torch.Tensor", dtype=str(dtype),
                shape=tuple(x.shape), numel=x.numel())
    got = _fill(leaf, gather([torch_parts(x)])[0])
    want = tensor_stats(x)
    for field in ("max", "min", "has_nan", "has_inf", "max_finite", "min_finite"):
        a, b = getattr(got, field), getattr(want, field)
        assert a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)), \
            (field, a, b)
