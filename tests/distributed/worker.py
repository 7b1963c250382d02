"""Worker script of the distributed tests, launched by ``torchrun --nproc_per_node=2`` (or
as two plain processes for the kill test); not collected by pytest.

Usage: ``worker.py MODE OUT_DIR`` with MODE one of:

``ddp``
    phase A: a DDP model at level mix, task statistics, into ``OUT_DIR/a``; step 0 feeds
    both ranks the same batch and then runs the Distributed calls below; step 1 puts a NaN
    into rank 1's batch. Phase B: a debugger with ``rank: [1]`` into ``OUT_DIR/b``.
    Each rank writes ``OUT_DIR/report{rank}.json`` with what the test checks on the side.
``kill``
    both ranks record step 0 (with an all_reduce); rank 1 then records step 1 up to a
    ``stop()``, starts again and loops recording ``torch.add`` until the test SIGKILLs it
    (it writes ``OUT_DIR/ready1`` first); rank 0 records steps 1 and 2 without
    collectives and exits normally.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from msprobe.pytorch.debugger import PrecisionDebugger  # noqa: E402


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 3)
        self.fc2 = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def rank_tensor(seed: int, n: int = 6) -> torch.Tensor:
    """The tensor the tests recompute independently: ``randn(n)`` from ``seed``."""
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def debugger(out: str, name: str, who: int, **cfg) -> PrecisionDebugger:
    path = os.path.join(out, f"config_{name}{who}.json")
    with open(path, "w") as fh:
        json.dump({"task": "statistics", "dump_path": os.path.join(out, name), "level": "mix", **cfg}, fh)
    return PrecisionDebugger(config_path=path)


def collectives(rank: int, report: dict) -> None:
    """The Distributed calls of step 0 (both ranks make the same calls)."""
    t = rank_tensor(100 + rank)
    dist.all_reduce(t)                                                   # all_reduce.0: sum
    m = rank_tensor(200 + rank)
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=dist.group.WORLD)     # all_reduce.1: kwargs
    a = rank_tensor(300 + rank)
    work = dist.all_reduce(a, async_op=True)                             # all_reduce.2: async
    report["async_is_work"] = isinstance(work, dist.Work)
    work.wait()
    b = rank_tensor(400) if rank == 0 else torch.zeros(6)
    dist.broadcast(b, src=0)                                             # broadcast.0
    gathered = [torch.zeros(6) for _ in range(2)]
    dist.all_gather(gathered, rank_tensor(500 + rank))                   # all_gather.0
    peer = 1 - rank
    sent = dist.isend(rank_tensor(600 + rank), dst=peer)                 # isend.0
    received = torch.zeros(6)
    got = dist.irecv(received, src=peer)                                 # irecv.0
    sent.wait()
    got.wait()
    report["irecv_sum"] = float(received.double().sum())
    ops = [dist.P2POp(dist.isend, rank_tensor(700 + rank), peer), dist.P2POp(dist.irecv, torch.zeros(6), peer)]
    for w in dist.batch_isend_irecv(ops):                                # batch_isend_irecv.0
        w.wait()
    dist.barrier()                                                       # barrier.0


def run_ddp(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    report: dict = {"rank": rank}
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Net())
    dbg = debugger(out, "a", rank)
    for step in range(2):
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(step))  # same batch on every rank
        if step == 1 and rank == 1:
            x[0, 0] = float("nan")
        dbg.start(model)
        model(x).sum().backward()
        if step == 0:
            collectives(rank, report)
        dbg.stop()
        dbg.step()
    dbg.close()
    original = dist.all_reduce
    dbg_b = debugger(out, "b", rank, rank=[1])
    dbg_b.start(model)
    report["b_hooked"] = dist.all_reduce is not original
    model(torch.ones(5, 4)).sum().backward()
    t = torch.ones(3) * (rank + 1)
    dist.all_reduce(t)
    dbg_b.stop()
    dbg_b.step()
    dbg_b.close()
    run_fsdp(out, rank)
    with open(os.path.join(out, f"report{rank}.json"), "w") as fh:
        json.dump(report, fh)
    dist.destroy_process_group()


def fsdp_batch() -> torch.Tensor:
    return torch.randn(5, 4, generator=torch.Generator().manual_seed(7))


def run_fsdp(out: str, rank: int) -> None:
    """Phase C: one step of FSDP (``fsdp1``) and of FSDP2 ``fully_shard`` (``fsdp2``), the
    same seeded ``Net`` and batch on both ranks."""
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

    torch.manual_seed(0)
    model = FullyShardedDataParallel(Net(), device_id=torch.device("cpu"))
    dbg = debugger(out, "fsdp1", rank)
    dbg.start(model)
    model(fsdp_batch()).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    torch.manual_seed(0)
    model = Net()
    fully_shard(model.fc1)
    fully_shard(model.fc2)
    fully_shard(model)
    dbg = debugger(out, "fsdp2", rank)
    dbg.start(model)
    model(fsdp_batch()).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()


def run_kill(out: str) -> None:
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(out, 'rendezvous')}", rank=rank, world_size=2)
    dbg = debugger(out, "k", rank, level="L1")
    dbg.start()
    t = rank_tensor(100 + rank)
    dist.all_reduce(t)
    torch.add(t, 1)
    dbg.stop()
    dbg.step()
    if rank == 1:
        dbg.start()
        x = torch.arange(4.0)
        x = torch.add(x, 1)
        dbg.stop()                      # step 1 so far is exported and in the log
        dbg.start()
        k = 0
        while True:
            x = torch.add(x, 1)
            k += 1
            if k == 50:
                with open(os.path.join(out, "ready1"), "w") as fh:
                    fh.write("1")
            time.sleep(0.001)
    for step in (1, 2):
        dbg.start()
        torch.mul(torch.arange(3.0), step)
        dbg.stop()
        dbg.step()
    dbg.close()
    with open(os.path.join(out, "done0"), "w") as fh:
        fh.write("1")
    os._exit(0)  # rank 1 is gone: skip the process-group teardown


if __name__ == "__main__":
    mode, out_dir = sys.argv[1], sys.argv[2]
    {"ddp": run_ddp, "kill": run_kill}[mode](out_dir)
