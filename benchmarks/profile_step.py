"""cProfile of recorded training steps of the encoder workload: where the recorder's host
time goes (top functions by own time). Not a test.

    python benchmarks/profile_step.py [--device cuda] [--config l1_stats] [--steps 3] [--top 30]
"""
from __future__ import annotations

import argparse
import atexit
import cProfile
import json
import os
import pstats
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from workloads import CONFIGS, build_encoder, config_json  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--config", default="l1_stats", choices=[c for c, v in CONFIGS.items() if v[3] == "record"])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--workload", default="encoder", choices=["encoder", "dispatch"])
    p.add_argument("--sort", default="tottime", help="pstats sort key (tottime, cumulative)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from msprobe.pytorch import PrecisionDebugger

    model, train_step = build_encoder(args.layers, device=args.device, size=args.workload)
    scratch = tempfile.mkdtemp(prefix="msprobe-profile-")
    atexit.register(shutil.rmtree, scratch, True)  # the dumps, at exit
    cfg_path = os.path.join(scratch, "config.json")
    with open(cfg_path, "w") as f:
        json.dump(config_json(args.config, os.path.join(scratch, "dump")), f)
    dbg = PrecisionDebugger(config_path=cfg_path)

    def step():
        dbg.start(model)
        train_step()
        dbg.stop()
        dbg.step()

    step()  # warm-up
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        step()
    prof.disable()
    dbg.close()
    pstats.Stats(prof).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
