"""In-process A/B overhead: one model, recorded and uninstrumented steps alternating.

Fresh-process runs (benchmarks/overhead.py) are the reference; on a shared or noisy
machine their run medians spread by 30 %. This script removes process-to-process drift:
the same process alternates a plain step (no hook installed) and a recorded step
(start/train/stop/step of a fresh debugger whose hooks were installed outside the timer),
``--pairs`` times, and prints the process-CPU-time ratio of the fastest and of the median
steps. With ``--breakdown`` it also reports the time spent computing statistics.

    python benchmarks/ab_steps.py --config l1_stats --pairs 8 [--layers 4] [--breakdown]

Not collected by pytest.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="l1_stats", help="a configuration of benchmarks/workloads.py")
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--workload", default="encoder", choices=["encoder", "dispatch"],
                   help="the encoder's size (benchmarks/workloads.py, ENCODER_SIZES)")
    p.add_argument("--steps", type=int, default=1,
                   help="training steps per timed sample (several for the millisecond-long dispatch steps)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--breakdown", action="store_true", help="also time the statistics themselves")
    args = p.parse_args(argv)

    import torch._dynamo  # noqa: F401  (as overhead.py does)
    import torch

    from workloads import CONFIGS, build_encoder, config_json

    if args.config not in CONFIGS or CONFIGS[args.config][0] is None:
        raise SystemExit(f"--config: got {args.config!r}; allowed: "
                         + ", ".join(k for k, v in CONFIGS.items() if v[0] is not None))
    torch.set_num_threads(args.threads)
    stats_time = [0.0, 0]
    if args.breakdown:
        import msprobe.pytorch.leaves as leaves
        original = leaves.tensor_stats

        def timed(t):
            start = time.process_time()
            try:
                return original(t)
            finally:
                stats_time[0] += time.process_time() - start
                stats_time[1] += t.numel()

        leaves.tensor_stats = timed
    from msprobe.pytorch import PrecisionDebugger

    model, train_step = build_encoder(args.layers, size=args.workload)
    root = tempfile.mkdtemp(prefix="ab-steps-")
    stopped = CONFIGS[args.config][3] == "stopped"
    made = [0]

    def debugger():
        # a fresh debugger per recorded step, hooks installed (start/stop) outside the timer,
        # so that the plain steps run with no hook installed at all
        made[0] += 1
        dump = Path(root) / f"d{made[0]}"
        dump.mkdir()
        cfg_path = dump / "config.json"
        cfg_path.write_text(json.dumps(config_json(args.config, str(dump))))
        dbg = PrecisionDebugger(config_path=str(cfg_path), dump_path=str(dump))
        dbg.start(model)
        dbg.stop()
        return dbg

    def plain() -> float:
        t = time.process_time()
        for _ in range(args.steps):
            train_step()
        return (time.process_time() - t) / args.steps

    def recorded() -> float:
        dbg = debugger()
        t = time.process_time()
        for _ in range(args.steps):
            if stopped:
                train_step()
            else:
                dbg.start(model)
                train_step()
                dbg.stop()
                dbg.step()
        elapsed = (time.process_time() - t) / args.steps
        dbg.close()
        return elapsed

    try:
        plain(), recorded()  # warm-up
        stats_time[:] = [0.0, 0]
        base, rec = [], []
        for _ in range(args.pairs):
            base.append(plain())
            rec.append(recorded())
        print(f"{args.config} ({args.workload} {args.layers} layers, {args.pairs} pairs, CPU time): "
              f"plain min {min(base) * 1e3:.0f} ms median {statistics.median(base) * 1e3:.0f} ms | "
              f"recorded min {min(rec) * 1e3:.0f} ms median {statistics.median(rec) * 1e3:.0f} ms | "
              f"ratio of mins {min(rec) / min(base):.2f}, of medians {statistics.median(rec) / statistics.median(base):.2f}")
        # each recorded step against the plain steps just before and after it: drift of the
        # machine's speed over the run (shared VMs) cancels out of these ratios
        base.append(plain())
        pair = [rec[i] / ((base[i] + base[i + 1]) / 2) for i in range(args.pairs)]
        print(f"per-pair ratios (recorded / mean of the plain steps around it): median {statistics.median(pair):.2f}, "
              f"quartiles {statistics.quantiles(pair, n=4)[0]:.2f}-{statistics.quantiles(pair, n=4)[2]:.2f}")
        if args.breakdown:
            print(f"statistics: {stats_time[0] / args.pairs * 1e3:.1f} ms per recorded step over "
                  f"{stats_time[1] / args.pairs / 1e6:.1f} M elements")
    finally:
        shutil.rmtree(root, ignore_errors=True)  # the dumps of the recorded steps


if __name__ == "__main__":
    main()
