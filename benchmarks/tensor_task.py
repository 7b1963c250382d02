"""Task ``tensor`` cost and deduplication on a small MLP training loop.

Prints wall-time ratios against an uninstrumented run (task statistics, task tensor,
task tensor with async_dump), and for task tensor the bytes referenced by records, the
unique bytes stored in payload shards, and the disk use of dump_tensor_data with and
without hard links. Not collected by pytest.

Usage: ``python benchmarks/tensor_task.py [--steps N] [--width W]``
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn

from msprobe.pytorch import PrecisionDebugger


def make_model(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width),
                         nn.Linear(width, width), nn.GELU(), nn.Linear(width, 10))


def train(steps: int, width: int, dump: Path | None, **cfg) -> tuple[float, PrecisionDebugger | None]:
    model = make_model(width)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, width), torch.randint(0, 10, (64,))
    dbg = None
    if dump is not None:
        path = dump.with_suffix(".json")
        path.write_text(json.dumps({"dump_path": str(dump), "level": "mix", **cfg}))
        dbg = PrecisionDebugger(config_path=str(path))
    t0 = time.perf_counter()
    for _ in range(steps):
        if dbg:
            dbg.start(model)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if dbg:
            dbg.stop()
            dbg.step()
    elapsed = time.perf_counter() - t0
    if dbg:
        dbg.close()
    return elapsed, dbg


def disk_use(directory: Path) -> tuple[int, int]:
    """(apparent bytes of all files, bytes of distinct inodes)."""
    apparent, seen, unique = 0, set(), 0
    for p in directory.rglob("*.pt"):
        st = p.stat()
        apparent += st.st_size
        if st.st_ino not in seen:
            seen.add(st.st_ino)
            unique += st.st_size
    return apparent, unique


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="msprobe-bench-"))
    try:
        base, _ = train(args.steps, args.width, None)
        stats, _ = train(args.steps, args.width, root / "stats", task="statistics")
        tensor, dbg = train(args.steps, args.width, root / "tensor", task="tensor")
        asyn, _ = train(args.steps, args.width, root / "async", task="tensor", async_dump=True,
                        tensor={"list": ["Module", "Functional", "Tensor", "Torch"]})
        print(f"steps {args.steps}, width {args.width}; uninstrumented {base:.3f} s")
        print(f"statistics      {stats / base:6.1f}x")
        print(f"tensor          {tensor / base:6.1f}x")
        print(f"tensor, async   {asyn / base:6.1f}x")
        shards = sum(p.stat().st_size for p in (root / "tensor" / ".msprobe" / "payload").iterdir())
        apparent, unique = disk_use(root / "tensor")
        print(f"payload shards on disk: {shards / 2**20:.2f} MiB")
        print(f"dump_tensor_data: {apparent / 2**20:.2f} MiB of files, {unique / 2**20:.2f} MiB on disk "
              f"({1 - unique / apparent:.0%} saved by hard links)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
