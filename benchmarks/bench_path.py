"""Cost of ``tensor.bench_path`` (task tensor, summary_mode md5) on a small MLP.

A seeded run is recorded as the baseline (task tensor, md5); then the same run is timed
uninstrumented, with task statistics + md5, with task tensor + md5 (every tensor saved)
and with ``bench_path`` pointing at the baseline (nothing differs, so no tensor is
saved). Prints each wall time (best of ``--repeat``) as a ratio against the
uninstrumented run, and the disk use of the two tensor-task dumps. Not collected by pytest.

Usage: ``python benchmarks/bench_path.py [--steps N] [--width W] [--repeat R]``
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
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width))])


def train(steps: int, width: int, cfg: dict | None, work: Path) -> float:
    """Seconds of ``steps`` training steps, recorded with ``cfg`` (None: not recorded)."""
    model = make_model(width)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(64, width, generator=g) for _ in range(steps)]
    dbg = None
    if cfg is not None:
        path = work / "config.json"
        path.write_text(json.dumps(cfg))
        dbg = PrecisionDebugger(config_path=str(path))
    t0 = time.perf_counter()
    for x in xs:
        if dbg is not None:
            dbg.start(model)
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        if dbg is not None:
            dbg.stop()
            dbg.step()
    seconds = time.perf_counter() - t0
    if dbg is not None:
        dbg.close()
    return seconds


def disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="msprobe_bench_path_"))
    try:
        baseline = work / "baseline"
        train(args.steps, args.width, {"task": "tensor", "dump_path": str(baseline), "level": "mix",
                                       "tensor": {"summary_mode": "md5"}}, work)
        runs = {
            "uninstrumented": None,
            "statistics, md5": {"task": "statistics", "level": "mix", "statistics": {"summary_mode": "md5"}},
            "tensor, md5 (all saved)": {"task": "tensor", "level": "mix", "tensor": {"summary_mode": "md5"}},
            "tensor, md5, bench_path (none saved)": {
                "task": "tensor", "level": "mix",
                "tensor": {"summary_mode": "md5", "bench_path": str(baseline), "diff_nums": -1}},
        }
        times, sizes = {}, {}
        for label, cfg in runs.items():
            best = None
            for i in range(args.repeat):
                dump = work / f"run{len(times)}"
                shutil.rmtree(dump, ignore_errors=True)
                full = None if cfg is None else {**cfg, "dump_path": str(dump)}
                t = train(args.steps, args.width, full, work)
                best = t if best is None else min(best, t)
            times[label] = best
            if cfg is not None and cfg["task"] == "tensor":
                sizes[label] = disk_bytes(dump)
        base = times["uninstrumented"]
        print(f"{args.steps} steps, 12 modules of width {args.width}, level mix, one thread (best of {args.repeat})")
        for label, t in times.items():
            extra = f"   dump {sizes[label] / 2**20:.1f} MiB" if label in sizes else ""
            print(f"  {label:40s} {t * 1e3:8.1f} ms  {t / base:5.2f}x{extra}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
