"""Memory does not grow with the number of recorded steps. Counts the objects the
cyclic garbage collector tracks (after a full collection) over many steps of a tiny model:
anything the recorder kept per step (one small log batch is 13 tracked objects per step)
adds up; caches that fill and stop (torch's, msprobe's bounded ones) do not.
RSS over thousands of steps: ``benchmarks/memory_growth.py``."""
from __future__ import annotations

import gc

import pytest
import torch

from msprobe.pytorch import PrecisionDebugger


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_tracked_objects_do_not_grow_with_steps(tmp_path, level):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, target = torch.randn(4, 8), torch.randn(4, 2)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level=level)

    def steps(n: int) -> int:
        for _ in range(n):
            dbg.start(model)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), target).backward()
            opt.step()
            dbg.stop()
            dbg.step()
        gc.collect()
        return len(gc.get_objects())

    try:
        steps(60)  # caches that fill in the first steps (stack ids, names, torch's own)
        before = steps(40)
        after = steps(120)
    finally:
        dbg.close()
    assert dbg.session.step == 220
    # a leak of one tracked object per step would add 120; allow a few for the interpreter
    assert after - before <= 20, f"{after - before} more tracked objects after 120 more steps"
