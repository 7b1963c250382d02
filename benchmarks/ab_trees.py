#!/usr/bin/env python
"""A/B overhead of two source trees of msprobe, interleaved, on the encoder workload.

Runs ``benchmarks/workloads.py`` of each tree in fresh processes with that tree on
PYTHONPATH, alternating trees and configurations run by run (so that load on a shared
machine hits both alike), and prints per (tree, configuration) the median over runs of
each run's median step wall time and process CPU time (all threads), their ratios to the
uninstrumented run (run with the first tree), and the peak RSS.

    python benchmarks/ab_trees.py --trees base=/tmp/base,new=. --configs none,l1_tensor --runs 3

A script, not a test: pytest does not collect it.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", required=True, help="NAME=PATH,NAME=PATH: source trees (repository roots)")
    p.add_argument("--configs", default="none,l1_tensor", help="configurations of benchmarks/workloads.py")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    trees = dict(item.split("=", 1) for item in args.trees.split(","))
    configs = args.configs.split(",")
    first = next(iter(trees))
    results = {}
    for _ in range(args.runs):
        for name, root in trees.items():
            for cfg in configs:
                if cfg == "none" and name != first:
                    continue
                scratch = tempfile.mkdtemp(prefix="msprobe-ab-")
                try:
                    env = dict(os.environ, PYTHONPATH=os.path.abspath(root), PYTHONDONTWRITEBYTECODE="1")
                    cmd = [sys.executable, os.path.join(root, "benchmarks", "workloads.py"), "--workload", "encoder",
                           "--config", cfg, "--steps", str(args.steps), "--threads", str(args.threads),
                           "--dump-path", os.path.join(scratch, "dump"),
                           "--config-path", os.path.join(scratch, "config.json"),
                           "--result", os.path.join(scratch, "result.json")]
                    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                    if proc.returncode:
                        raise SystemExit(f"{name} {cfg} failed:\n{proc.stderr[-3000:]}")
                    with open(os.path.join(scratch, "result.json")) as fh:
                        r = json.load(fh)
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)
                key = ("-" if cfg == "none" else name, cfg)
                row = (statistics.median(r["step_times"]), statistics.median(r["cpu_times"]), r["vm_hwm_kib"] / 1024)
                results.setdefault(key, []).append(row)
                print(f"{key[0]:>8} {cfg:<10} wall {row[0] * 1000:6.0f} ms  cpu {row[1] * 1000:6.0f} ms  "
                      f"rss {row[2]:5.0f} MiB", flush=True)
    base = results[("-", "none")]
    base_wall = statistics.median(x[0] for x in base)
    base_cpu = statistics.median(x[1] for x in base)
    print("\n| tree | configuration | step ms | ratio | CPU ms | CPU ratio | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    for (name, cfg), rows in results.items():
        wall = statistics.median(x[0] for x in rows)
        cpu = statistics.median(x[1] for x in rows)
        print(f"| {name} | {cfg} | {wall * 1000:.0f} | {wall / base_wall:.2f} | {cpu * 1000:.0f} | "
              f"{cpu / base_cpu:.2f} | {max(x[2] for x in rows):.0f} |")


if __name__ == "__main__":
    main()
