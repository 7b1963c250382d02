"""msprobe.pytorch.dist_hooks in one process: a gloo group of world size 1 (torchrun-free).

The fixture destroys the group afterwards, so later tests see a non-distributed process.
"""
from __future__ import annotations

import hashlib
import json
import logging

import numpy as np
import pytest
import torch
import torch.distributed as dist

from msprobe.pytorch.debugger import PrecisionDebugger
from msprobe.pytorch.dist_hooks import DistributedWrapper, RecordingWork, distributed_value
from msprobe.pytorch.leaves import LeafBuilder, local_shard

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is needed")


@pytest.fixture
def world1():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def make_debugger(tmp_path, **cfg) -> PrecisionDebugger:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "d"), "level": "L1", **cfg}))
    return PrecisionDebugger(config_path=str(path))


def load(tmp_path, rank_dir="rank0", step=0) -> dict:
    return json.loads((tmp_path / "d" / f"step{step}" / rank_dir / "dump.json").read_text())["data"]


def test_values_of_reduce_op_and_group(world1):
    assert distributed_value(dist.ReduceOp.SUM) == {"type": "torch.distributed.ReduceOp", "value": "RedOpType.SUM"}
    assert distributed_value(dist.ReduceOp.MIN) == {"type": "torch.distributed.ReduceOp", "value": "RedOpType.MIN"}
    assert distributed_value(dist.group.WORLD) == {
        "type": "torch.distributed.ProcessGroup", "value": [0], "group_ranks": [0],
        "group_id": hashlib.md5(b"[0]").hexdigest()}
    assert distributed_value(3) is None and distributed_value("x") is None


def test_wrapper_equals_original_and_p2p_op_accepts_it(world1, tmp_path):
    original = dist.isend
    dbg = make_debugger(tmp_path)
    dbg.start()
    try:
        wrapper = dist.isend
        assert isinstance(wrapper, DistributedWrapper)
        assert wrapper == original and original == wrapper and hash(wrapper) == hash(original)
        assert wrapper != dist.irecv and wrapper.__name__ == "isend"
        op = dist.P2POp(wrapper, torch.ones(2), 0)       # torch checks op in [isend, irecv]
        assert op.op is wrapper
        op2 = dist.P2POp(original, torch.ones(2), 0)     # a function taken before hooking
        assert op2.op is original
    finally:
        dbg.stop()
        dbg.close()
    assert dist.isend is original and dist.all_reduce.__module__ == "torch.distributed.distributed_c10d"


def test_all_reduce_records_before_and_after(world1, tmp_path):
    dbg = make_debugger(tmp_path)
    t = torch.tensor([1.0, -2.0, 3.0])
    dbg.start()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    work = dist.all_reduce(t, async_op=True)
    assert type(work) is dist.Work                     # the backend's own handle: still async
    work.wait()
    dist.broadcast(t, 0)
    dbg.stop()
    dbg.step()
    dbg.close()
    data = load(tmp_path)
    assert list(data) == ["Distributed.all_reduce.0.forward", "Distributed.all_reduce.1.forward",
                          "Distributed.broadcast.0.forward"]
    e = data["Distributed.all_reduce.0.forward"]
    a = np.array([1.0, -2.0, 3.0])
    expected = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [3], "Max": 3.0, "Min": -2.0,
                "Mean": pytest.approx(a.mean()), "Norm": pytest.approx(np.sqrt((a * a).sum())),
                "requires_grad": False}
    assert e["input_args"] == [expected]
    assert e["output"] == [expected, {"type": "torch.distributed.ReduceOp", "value": "RedOpType.SUM"}]
    assert e["input_kwargs"] == {"op": {"type": "torch.distributed.ReduceOp", "value": "RedOpType.SUM"}}
    assert data["Distributed.all_reduce.1.forward"]["output"] == [expected, {"type": "bool", "value": True}]
    assert data["Distributed.broadcast.0.forward"]["output"] == [expected, {"type": "int", "value": 0}]


class FutureLessWork(dist.Work):
    """A backend work without a future (as gloo's isend/irecv), completed by ``wait()``."""

    def __init__(self, buf: torch.Tensor) -> None:
        super().__init__()
        self.buf = buf
        self.waits = 0

    def wait(self, timeout=None):
        self.waits += 1
        self.buf.fill_(7.0)          # the "received" data arrives
        return True

    def get_future(self):
        raise RuntimeError("Work::getFuture not implemented.")


def test_future_less_work_records_output_at_wait_unless_step_finished(world1, tmp_path):
    dbg = make_debugger(tmp_path)
    dbg.start()
    calls = dist.irecv._record.__self__            # the debugger's DistributedCalls
    bufs = [torch.zeros(2), torch.zeros(2)]
    inner = [FutureLessWork(b) for b in bufs]
    works = [calls.record(lambda b, src, w=w: w, "Distributed", "Distributed.irecv", (b,), {"src": 0})
             for b, w in zip(bufs, inner)]
    assert all(isinstance(w, RecordingWork) and isinstance(w, dist.Work) for w in works)
    assert inner[0].waits == 0                     # recording never waits by itself
    assert works[0].wait() is True and inner[0].waits == 1
    dbg.stop()
    dbg.step()                                     # step 0 finished before the second wait
    works[1].wait()
    dbg.close()
    data = load(tmp_path)
    first, second = data["Distributed.irecv.0.forward"], data["Distributed.irecv.1.forward"]
    assert first["input_args"][0]["Max"] == 0.0 and first["output"][0]["Max"] == 7.0
    assert first["output"][1] == {"type": "int", "value": 0}
    assert list(second) == ["input_args", "input_kwargs", "is_recompute"]   # completed too late


def test_nothing_recorded_without_start_and_no_rank_dir_for_other_rank(world1, tmp_path):
    dbg = make_debugger(tmp_path, rank=[1])
    original = dist.all_reduce
    dbg.start()
    assert dist.all_reduce is original                  # unselected rank: no hooks installed
    dist.all_reduce(torch.ones(2))
    dbg.stop()
    dbg.step()
    dbg.close()
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())


def test_dtensor_leaf_is_its_local_shard(world1):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    d = distribute_tensor(torch.tensor([[1.0, 2.0], [3.0, -4.0]]), mesh, [Shard(0)])
    assert local_shard(d).tolist() == [[1.0, 2.0], [3.0, -4.0]] and type(local_shard(d)) is torch.Tensor
    leaf = LeafBuilder(md5=False).tensor_leaf("input_args", (0,), d)
    assert (leaf.max, leaf.min, leaf.mean, leaf.shape) == (3.0, -4.0, 0.5, (2, 2))
    assert leaf.norm == pytest.approx(np.sqrt(30.0))


def test_rank_filter_on_non_distributed_run_warns(tmp_path, caplog):
    assert not dist.is_initialized()
    dbg = make_debugger(tmp_path, rank=[1])
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        dbg.start()
        torch.add(torch.ones(1), 1)
        dbg.stop()
        dbg.start()
    dbg.close()
    warnings = [r.getMessage() for r in caplog.records if "rank" in r.getMessage()]
    assert len(warnings) == 1 and "rank 0" in warnings[0] and "[1]" in warnings[0]
    assert not (tmp_path / "d" / "step0").exists()


def _write_behind_torch(t: torch.Tensor, factor: float) -> None:
    """Scale ``t``'s memory in place the way DDP's C++ reducer writes a gradient bucket:
    no Python API call, no version-counter bump."""
    import ctypes

    assert t.is_contiguous() and t.dtype == torch.float32
    buf = (ctypes.c_float * t.numel()).from_address(t.data_ptr())
    arr = np.frombuffer(buf, dtype=np.float32)
    arr *= factor


def test_gradients_written_behind_torch_during_backward_are_seen(tmp_path, world1):
    """Under torch.distributed, gradients recorded during backward (parameters_grad at mix)
    and written afterwards by C++ code within the backward pass (as DDP's allreduce does)
    are recorded again by the optimizer with their new values."""
    import math

    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, foreach=False)
    for p in net.parameters():  # runs after parameters_grad is recorded (hooks run in order)
        p.register_post_accumulate_grad_hook(lambda q: _write_behind_torch(q.grad, 3.0))
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix", model=net)
    dbg.start()
    net(torch.randn(4, 8)).square().mean().backward()
    grads = [p.grad.clone() for p in net.parameters()]
    opt.step()
    dbg.stop()
    dbg.close()
    data = json.loads(next((tmp_path / "d").glob("step0/*/dump.json")).read_text())["data"]
    for i, g in enumerate(grads):
        rec = data[f"Tensor.add_.{i}.forward"]["input_args"][1]
        a = g.double().numpy()
        assert (rec["Max"], rec["Min"]) == (a.max(), a.min())
        assert rec["Norm"] == pytest.approx(math.sqrt(float((a * a).sum())), rel=1e-6)
