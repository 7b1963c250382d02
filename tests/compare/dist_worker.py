"""Worker of ``test_compare_distributed.py``, launched by ``torchrun --nproc_per_node=2``
(gloo, CPU); not collected by pytest.

Usage: ``dist_worker.py OUT_DIR``. Each rank records one training step of a tiny model
twice, at level mix: ``OUT_DIR/base`` as is, then ``OUT_DIR/target`` where rank 1 (only)
has ``torch.tanh`` replaced by ``tanh · (1 + 1e-3)`` before the debugger starts (so the
replacement adds no entry). The tanh output is all-reduced (sum) before the second layer,
so rank 0 receives rank 1's divergence through ``Distributed.all_reduce.0.forward``.
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


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.fc2 = nn.Linear(6, 2)

    def forward(self, x):
        h = torch.tanh(self.fc1(x))
        dist.all_reduce(h)
        return self.fc2(h)


def run(out: str, name: str, rank: int) -> None:
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(10 + rank))
    cfg = os.path.join(out, f"config_{name}{rank}.json")
    with open(cfg, "w") as fh:
        json.dump({"task": "statistics", "dump_path": os.path.join(out, name), "level": "mix"}, fh)
    original = torch.tanh
    if name == "target" and rank == 1:
        torch.tanh = lambda t: original(t) * (1 + 1e-3)
    try:
        dbg = PrecisionDebugger(config_path=cfg)
        dbg.start(model=net)
        net(x).pow(2).mean().backward()
        dbg.stop()
        dbg.step()
        dbg.close()
    finally:
        torch.tanh = original


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for name in ("base", "target"):
        run(out, name, rank)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
