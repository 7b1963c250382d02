"""Task tensor on the device path: each recorded tensor's host copy is queued at record time
(pinned memory, ``non_blocking=True`` on CUDA) and stored at the flush point, with one wait
per device there instead of one synchronous copy per tensor. Forced through that path on the
CPU (``defer_all``), a recorded step writes the same tensor files, bit for bit, and the same
dump.json records as the host path, and a tensor changed in place after its call keeps the
values it had at the call."""
from __future__ import annotations

import math

import torch

from msprobe.pytorch import PrecisionDebugger
from pt_helpers import ModuleOP, device_ops, load_dump, tensor_records



def _run(tmp_path, defer):
    torch.manual_seed(0)
    m = ModuleOP()
    path = tmp_path / f"d{defer}"
    dbg = PrecisionDebugger(dump_path=str(path), level="mix", task="tensor")
    dbg.recorder.leaves.defer_all = defer
    dbg.start(m)
    x = torch.randn(10, 8)
    x[0, 0] = float("nan")
    out = m(x)
    out.sum().backward()
    y = torch.arange(6, dtype=torch.int32).reshape(2, 3).t().add(1)  # a transposed view's C-order values
    y.mul_(100)  # changed after its call: the file holds the values at the call
    torch.tensor([1.5, -2.0], dtype=torch.bfloat16).neg()
    dbg.stop()
    dbg.close()
    dump = load_dump(path)[0]
    tdir = path / "step0" / "rank" / "dump_tensor_data"
    files = {k: torch.load(tdir / v["data_name"], weights_only=True) for k, v in tensor_records(dump["data"])}
    return dict(tensor_records(dump["data"])), files


def test_device_path_tensor_files_equal_host_path(tmp_path):
    host_recs, host_files = _run(tmp_path, False)
    dev_recs, dev_files = _run(tmp_path, True)
    assert host_recs.keys() == dev_recs.keys() and len(host_files) > 20
    for k, a in host_files.items():
        b = dev_files[k]
        assert a.dtype == b.dtype and a.shape == b.shape, k
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), k
        for stat in ("Max", "Min", "data_name"):
            x, y = host_recs[k].get(stat), dev_recs[k].get(stat)
            assert x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)), (k, stat, x, y)
    add = [f for k, f in dev_files.items() if k.startswith("Tensor.add") and k.endswith("output.0")]
    assert add and torch.equal(add[0], torch.tensor([[1, 4], [2, 5], [3, 6]], dtype=torch.int32))


def test_tensor_task_syncs_per_flush(tmp_path):
    ops = device_ops()
    small = ops.count_mode("tensor", layers=1, work=str(tmp_path / "l1"))
    large = ops.count_mode("tensor", layers=3, work=str(tmp_path / "l3"))
    assert large["tensors"] > 2 * small["tensors"] > 0
    for r in (small, large):
        # statistics copy, host buffer and host copy per tensor; one read-back per flush
        assert r["syncs"] <= r["flushes"] and r["ops_per_tensor"] <= 3.5, r
    assert small["syncs"] == large["syncs"]
