"""Records the dumps of the report tests; run as a script, not collected by pytest.

Usage: ``record_worker.py OUT_DIR RANK WORLD_SIZE STEPS NAN_STEP``. A two-layer MLP
(``Module.fc1``, ``Module.act``, ``Module.fc2``) trains ``STEPS`` steps with SGD at
level mix into ``OUT_DIR/dump``; with ``WORLD_SIZE`` > 1 the ranks join a gloo group
(file rendezvous in ``OUT_DIR``) and all-reduce their gradients. Rank ``WORLD_SIZE - 1``
takes ``torch.log`` of a negative number in step ``NAN_STEP`` (-1: never), so that call
is the first whose inputs are finite and whose output is NaN. Each rank writes
``OUT_DIR/losses{RANK}.json`` with its losses.
"""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from msprobe.pytorch.debugger import PrecisionDebugger  # noqa: E402


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.Tanh()
        self.fc2 = nn.Linear(8, 1)

    def forward(self, x, poison: bool = False):
        h = self.act(self.fc1(x))
        if poison:
            h = h + torch.log(torch.tensor(-1.0))   # NaN from a finite input
        return self.fc2(h)


def main(out: str, rank: int, world: int, steps: int, nan_step: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"file://{os.path.join(out, 'rendezvous')}",
                                rank=rank, world_size=world)
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    config = os.path.join(out, f"config{rank}.json")
    with open(config, "w") as fh:
        json.dump({"task": "statistics", "dump_path": os.path.join(out, "dump"), "level": "mix"}, fh)
    dbg = PrecisionDebugger(config_path=config)
    losses = []
    for step in range(steps):
        x = torch.randn(16, 4, generator=torch.Generator().manual_seed(100 * rank + step))
        dbg.start(model)
        loss = model(x, poison=(step == nan_step and rank == world - 1)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        if world > 1:
            for p in model.parameters():
                dist.all_reduce(p.grad)
        opt.step()
        dbg.stop()
        dbg.step()
        losses.append(loss.item())
    dbg.close()
    with open(os.path.join(out, f"losses{rank}.json"), "w") as fh:
        json.dump(losses, fh)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:6]))
