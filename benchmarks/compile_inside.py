"""Cost of ``compiled_regions: "inside"``: compile time and step time of a small compiled
transformer, per backend, unrecorded / recorded with ``root`` / recorded with ``inside``
(backend ``none``: the model not compiled, recorded the usual way, for reference).

Each (backend, mode) runs in its own process with an empty inductor cache (so compile time
is a cold compile), one torch thread and inductor compiling in-process. Per process: the
first step (Dynamo + AOTAutograd + backend compile, forward and backward) is timed as
"first step", then ``--steps`` steps are timed and their median reported. Times are CPU
seconds of the process (``time.process_time``) and the children it waited for (the C++
compiler): on a machine
shared with other work they move far less than wall-clock times. Level mix, task
statistics, every step recorded.

    .venv/bin/python benchmarks/compile_inside.py --backends none,eager,aot_eager,inductor --steps 20
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("none", "root", "inside")


def child(backend: str, mode: str, steps: int) -> dict:
    """One configuration, in this process; returns the timings (seconds)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
            att = F.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)
            x = x + self.proj(att @ v)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class LM(nn.Module):
        def __init__(self, vocab: int = 64, d: int = 64, layers: int = 2) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList([Block(d) for _ in range(layers)])
            self.head = nn.Linear(d, vocab)

        def forward(self, idx):
            h = self.emb(idx)
            for blk in self.blocks:
                h = blk(h)
            return self.head(h)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = LM()
    run = model if backend == "none" else torch.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dbg = None
    if mode != "none":
        from msprobe.pytorch import PrecisionDebugger
        tmp = tempfile.mkdtemp(prefix="msprobe_ci_")
        cfg = os.path.join(tmp, "config.json")
        with open(cfg, "w") as f:
            json.dump({"dump_path": os.path.join(tmp, "dump"), "level": "mix", "task": "statistics",
                       "compiled_regions": mode}, f)
        dbg = PrecisionDebugger(config_path=cfg, model=run)
    idx = torch.randint(0, 64, (8, 32))

    def cpu() -> float:  # this process (high resolution) and the children it waited for
        t = os.times()
        return time.process_time() + t.children_user + t.children_system

    def step() -> float:
        t0 = cpu()
        if dbg:
            dbg.start()
        loss = F.cross_entropy(run(idx).flatten(0, 1), idx.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        if dbg:
            dbg.stop()
            dbg.step()
        return cpu() - t0

    first = step()
    times = [step() for _ in range(steps)]
    if dbg:
        assert not dbg.session.failed
        dbg.close()
    return {"first_step_s": first, "step_ms": 1e3 * statistics.median(times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backends", default="none,eager,aot_eager,inductor")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--child", nargs=2, metavar=("BACKEND", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.steps)))
        return
    print(f"{'backend':10} {'mode':7} {'first step (CPU s)':>19} {'step (CPU ms)':>14}")
    for backend in args.backends.split(","):
        for mode in (MODES[:2] if backend == "none" else MODES):
            env = dict(os.environ, PYTHONPATH=ROOT, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="ind_"),
                       TORCHINDUCTOR_COMPILE_THREADS="1", OMP_NUM_THREADS="1")
            out = subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--child", backend, mode],
                                 env=env, capture_output=True, text=True, check=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            print(f"{backend:10} {mode:7} {r['first_step_s']:19.2f} {r['step_ms']:14.1f}", flush=True)


if __name__ == "__main__":
    main()
