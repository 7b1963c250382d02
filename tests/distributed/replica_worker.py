"""Worker of ``test_check_ranks_torchrun.py``, launched by ``torchrun --nproc_per_node=4``
(gloo, CPU); not collected by pytest.

Usage: ``replica_worker.py OUT_DIR`` (4 ranks) or ``replica_worker.py OUT_DIR data_parallel``
(3 ranks: :func:`main_data_parallel`). Each rank of the first records four runs of the same seeded
DDP ``Net`` (SGD, 3 steps, level mix; a ``Distributed.all_reduce`` of the loss per step):

``clean``  summary_mode md5, every rank gets the same batch.
``flip``   as clean, but before step 2's ``start()`` rank 2 flips bit ``FLIP_BIT`` of
           ``fc1.weight[0, 0]`` (outside recording: the flip itself is no entry).
``preset`` as flip, recorded with :data:`PRESET` (level L0, data_mode forward+input).
``batch``  summary_mode statistics; at step 1 rank 1 gets another batch.
``fsdp1`` / ``fsdp2``  ``FullyShardedDataParallel`` (forward and backward only, no
           optimizer step) and ``fully_shard`` (with SGD), md5, 2 steps, a different batch
           on every rank (data parallelism as trained).
"""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from msprobe.pytorch.debugger import PrecisionDebugger  # noqa: E402

FLIP_BIT = 20          # a mantissa bit of float32: changes the value by about 2**-3 relative
FLIP_RANK, FLIP_STEP = 2, 2
BATCH_RANK, BATCH_STEP = 1, 1
STEPS = 3


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def batch(step: int, rank: int = 0) -> torch.Tensor:
    """The batch of ``step`` (``rank`` 0: the one every rank shares)."""
    return torch.randn(6, 4, generator=torch.Generator().manual_seed(1000 * rank + step))


#: the replica-check configuration of docs/distributed.md (module inputs and parameters, md5)
PRESET = {"level": "L0", "statistics": {"summary_mode": "md5", "data_mode": ["forward", "input"]}}


def debugger(out: str, name: str, rank: int, summary_mode: str, **cfg) -> PrecisionDebugger:
    path = os.path.join(out, f"config_{name}{rank}.json")
    with open(path, "w") as fh:
        json.dump({"task": "statistics", "dump_path": os.path.join(out, name), "level": "mix",
                   "statistics": {"summary_mode": summary_mode}, **cfg}, fh)
    return PrecisionDebugger(config_path=path)


def flip_bit(t: torch.Tensor, bit: int) -> None:
    """Flip bit ``bit`` of ``t``'s first float32 element in place."""
    with torch.no_grad():
        t.view(-1)[:1].view(torch.int32).bitwise_xor_(1 << bit)


def train(model: nn.Module, dbg: PrecisionDebugger, rank: int, name: str, steps: int) -> None:
    # fsdp1: no optimizer step. With msprobe recording, FullyShardedDataParallel's flat
    # parameter keeps its unsharded gradient (SGD fails: "size of tensor a (15) must match
    # the size of tensor b (58)"); without msprobe the same script runs (a known issue,
    # docs/distributed.md)
    opt = None if name == "fsdp1" else torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        if name in ("flip", "preset") and step == FLIP_STEP and rank == FLIP_RANK:
            flip_bit(model.module.fc1.weight, FLIP_BIT)
        if name == "batch" and step == BATCH_STEP and rank == BATCH_RANK:
            x = batch(step, rank)
        elif name.startswith("fsdp"):
            x = batch(step, rank)
        else:
            x = batch(step)
        dbg.start(model)
        loss = model(x).square().mean()
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)          # replicated on every rank
        dbg.stop()
        dbg.step()
    dbg.close()


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for name, mode in (("clean", "md5"), ("flip", "md5"), ("batch", "statistics")):
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(Net())
        train(model, debugger(out, name, rank, mode), rank, name, STEPS)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Net())
    train(model, debugger(out, "preset", rank, "md5", **PRESET), rank, "preset", STEPS)
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

    torch.manual_seed(0)
    model = FullyShardedDataParallel(Net(), device_id=torch.device("cpu"))
    train(model, debugger(out, "fsdp1", rank, "md5"), rank, "fsdp1", 2)
    torch.manual_seed(0)
    model = Net()
    fully_shard(model.fc1)
    fully_shard(model.fc2)
    fully_shard(model)
    train(model, debugger(out, "fsdp2", rank, "md5"), rank, "fsdp2", 2)
    dist.destroy_process_group()


class TokenNet(nn.Module):
    """An embedding, a hidden layer and a head: the head runs last in the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.hidden = nn.Linear(8, 8)
        self.head = nn.Linear(8, VOCAB)

    def forward(self, tokens):
        return self.head(torch.relu(self.hidden(self.embed(tokens))))


VOCAB = 12
NUDGE_RANK, NUDGE_STEP, DP_STEPS = 2, 2, 4
NUDGE = 1e-3            # added to head.weight[0, 0] on NUDGE_RANK before step NUDGE_STEP


def tokens(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s own batch of ``step``: 6 input tokens and their 6 targets."""
    g = torch.Generator().manual_seed(100 * rank + step)
    t = torch.randint(0, VOCAB, (7,), generator=g)
    return t[:-1], t[1:]


def main_data_parallel(out: str) -> None:
    """``dp_nudge`` (3 ranks, md5, level mix): DDP on :class:`TokenNet`, every rank its own
    batch at every step, SGD; before step NUDGE_STEP's ``start()`` rank NUDGE_RANK adds
    NUDGE to ``head.weight[0, 0]`` (outside recording). ``dp_clean``: the same without it."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for name in ("dp_clean", "dp_nudge"):
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(TokenNet())
        dbg = debugger(out, name, rank, "md5")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(DP_STEPS):
            if name == "dp_nudge" and step == NUDGE_STEP and rank == NUDGE_RANK:
                with torch.no_grad():
                    model.module.head.weight[0, 0] += NUDGE
            x, y = tokens(step, rank)
            dbg.start(model)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            total = loss.detach().clone()
            dist.all_reduce(total)          # replicated on every rank
            dbg.stop()
            dbg.step()
        dbg.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[2:] == ["data_parallel"]:
        main_data_parallel(sys.argv[1])
    else:
        main(sys.argv[1])
