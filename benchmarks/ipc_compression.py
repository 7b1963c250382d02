"""What IPC buffer compression of the event log costs the training process, and what it saves.

Runs the dispatch workload of ``benchmarks/overhead.py`` (the encoder shrunk to d_model 32,
one thread: host time per call decides the step time; level mix, statistics) in fresh
processes, alternating the log writer's compression (``None``, ``"zstd"``) run by run, and
prints per setting the median step time, the median CPU time per step (process time: every
thread of the training process, where the log writer runs), and the bytes of log per step.

The setting is applied in the child before the workload starts by giving
:class:`store.log_writer.LogWriter` a different default ``compression`` (benchmark only;
the recorder has no switch for it).

Usage: ``python benchmarks/ipc_compression.py [--runs 6] [--steps 40] [--layers 4]``
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = """
import functools, runpy, sys
import store.log_writer as lw
mode = sys.argv[1]
if mode != "none":
    lw.LogWriter.__init__ = functools.partialmethod(lw.LogWriter.__init__, compression=mode)
sys.argv = [sys.argv[2]] + sys.argv[3:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def one_run(mode: str, work: Path, steps: int, layers: int) -> dict:
    dump = work / f"dump-{mode}"
    shutil.rmtree(dump, ignore_errors=True)
    result = work / f"result-{mode}.json"
    argv = [sys.executable, "-c", _CHILD, mode, str(ROOT / "benchmarks" / "workloads.py"),
            "--workload", "dispatch", "--layers", str(layers), "--config", "mix_stats", "--steps", str(steps),
            "--threads", "1", "--dump-path", str(dump), "--config-path", str(work / f"config-{mode}.json"),
            "--result", str(result)]
    subprocess.run(argv, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)
    data = json.loads(result.read_text())
    log_bytes = sum(f.stat().st_size for f in (dump / ".msprobe" / "log").glob("*.arrows"))
    shutil.rmtree(dump, ignore_errors=True)
    return {"step": statistics.median(data["step_times"]), "cpu": statistics.median(data["cpu_times"]),
            "log_per_step": log_bytes / (steps + 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6, help="processes per setting (alternating)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--modes", default="none,zstd")
    args = parser.parse_args()
    modes = args.modes.split(",")
    work = Path(tempfile.mkdtemp(prefix="msprobe-ipc-compression-"))
    found: dict[str, list] = {m: [] for m in modes}
    try:
        for _ in range(args.runs):
            for mode in modes:
                found[mode].append(one_run(mode, work, args.steps, args.layers))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = found[modes[0]]
    base_step = statistics.median(r["step"] for r in base)
    base_cpu = statistics.median(r["cpu"] for r in base)
    print(f"dispatch workload, mix statistics, {args.layers} layers, {args.steps} steps, {args.runs} runs each")
    print(f"{'compression':<12} {'step ms':>8} {'vs none':>8} {'cpu ms':>8} {'vs none':>8} {'log KB/step':>12}")
    for mode in modes:
        step = statistics.median(r["step"] for r in found[mode])
        cpu = statistics.median(r["cpu"] for r in found[mode])
        size = statistics.median(r["log_per_step"] for r in found[mode])
        print(f"{mode:<12} {step * 1e3:>8.2f} {100 * (step / base_step - 1):>+7.1f}% {cpu * 1e3:>8.2f} "
              f"{100 * (cpu / base_cpu - 1):>+7.1f}% {size / 1024:>12.1f}")


if __name__ == "__main__":
    main()
