"""Cost of the Distributed family per torch.distributed call (one process, gloo, world 1).

Usage: ``python benchmarks/dist_overhead.py [N]``. Prints the time per ``all_reduce`` of a
16-element tensor and its ratio to the uninstrumented call, for: no debugger; a debugger
whose rank filter excludes this process (no hook installed); hooks installed but recording
stopped (after ``stop()``); recording at task statistics.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from msprobe.pytorch.debugger import PrecisionDebugger  # noqa: E402


def per_call(n: int) -> float:
    t = torch.ones(16)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(n):
            dist.all_reduce(t)
        best = min(best, (time.perf_counter() - start) / n)
    return best


def debugger(tmp: str, name: str, **cfg) -> PrecisionDebugger:
    path = os.path.join(tmp, f"{name}.json")
    with open(path, "w") as fh:
        json.dump({"task": "statistics", "level": "L1", "dump_path": os.path.join(tmp, name), **cfg}, fh)
    return PrecisionDebugger(config_path=path)


def main(n: int) -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    with tempfile.TemporaryDirectory() as tmp:
        base = per_call(n)
        rows = [("no debugger", base)]
        d = debugger(tmp, "excluded", rank=[1])
        d.start()
        rows.append(("rank not selected (no hooks)", per_call(n)))
        d.close()
        d = debugger(tmp, "stopped")
        d.start()
        d.stop()
        rows.append(("hooks installed, stopped", per_call(n)))
        d.start()
        rows.append(("recording statistics", per_call(max(n // 10, 1))))
        d.stop()
        d.close()
    for label, sec in rows:
        print(f"{label:32s} {sec * 1e6:9.2f} us/call  x{sec / base:6.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
