"""In-process A/B of msprobe's Python recording path alone (statistics left out).

``ab_steps.py`` times the issue-5 encoder, whose recorded step is dominated by the
statistics and by the model's own compute; on a shared machine their noise hides changes of
a few milliseconds in the per-call Python code (wrappers, leaves, backward taps, stack
capture, log rows). This script runs the same architecture (embedding, ``--layers``
TransformerEncoder layers, linear head, SGD) at toy sizes (d_model 16, batch 2, sequence 8),
so that a plain step costs a few milliseconds, and replaces ``tensor_stats`` by a constant
(``--real-stats`` keeps it). It alternates plain and recorded steps (a fresh debugger per
recorded step, hooks installed outside the timer, as ab_steps does; the garbage collector
off inside the timed region) and prints the process CPU time of each phase of the recorded
step: ``start()``, the training step, ``stop()`` (flush and export of the forward
entries), ``step()`` (backward entries, export). ``--no-export`` also replaces the file
writing of the export (rows are still taken from the log and turned into entries).

    python benchmarks/ab_python_path.py --pairs 40 [--layers 4] [--no-export] [--real-stats]

Read the minimum (least disturbed by other processes) of ``train`` minus that of ``plain``:
the cost of recording the step's ~110 API calls and their backward. Not collected by pytest.
"""
from __future__ import annotations

import argparse
import atexit
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def build_toy_encoder(layers: int, seed: int = 0):
    """``workloads.build_encoder``'s model and training step at toy sizes."""
    import torch
    import torch.nn as nn

    torch.manual_seed(seed)
    vocab, d_model = 50, 16

    class ToyEncoderLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d_model)
            layer = nn.TransformerEncoderLayer(d_model=d_model, nhead=4, dim_feedforward=32, dropout=0.0,
                                               batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
            self.head = nn.Linear(d_model, vocab)

        def forward(self, tokens):
            return self.head(self.encoder(self.embed(tokens)))

    model = ToyEncoderLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, vocab, (2, 8), generator=gen)
    targets = torch.randint(0, vocab, (2, 8), generator=gen)

    def train_step():
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(tokens).reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    return model, train_step


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=40)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--real-stats", action="store_true", help="compute the statistics (default: a constant)")
    p.add_argument("--no-export", action="store_true", help="skip writing the exported files")
    args = p.parse_args(argv)

    import torch._dynamo  # noqa: F401  (as overhead.py does)
    import torch

    from workloads import config_json

    torch.set_num_threads(1)
    if not args.real_stats:
        import msprobe.pytorch.leaves as leaves
        from msprobe.core.statistics import TensorStats

        constant = TensorStats()
        constant.max = constant.min = constant.mean = constant.norm = 1.0
        constant.has_nan = constant.has_inf = False
        leaves.tensor_stats = lambda t: constant
    if args.no_export:
        from msprobe.core.session import Session

        Session._export_step = lambda self, step_export: None
    from msprobe.pytorch import PrecisionDebugger

    model, train_step = build_toy_encoder(args.layers)
    root = Path(tempfile.mkdtemp(prefix="ab-python-path-"))
    atexit.register(shutil.rmtree, root, True)  # the dumps, at exit
    made = [0]

    def debugger():
        made[0] += 1
        dump = root / f"d{made[0]}"
        dump.mkdir()
        cfg_path = dump / "config.json"
        cfg_path.write_text(json.dumps(config_json("l1_stats", str(dump))))
        dbg = PrecisionDebugger(config_path=str(cfg_path), dump_path=str(dump))
        dbg.start(model)
        dbg.stop()
        return dbg

    clock = time.process_time
    phases: dict[str, list[float]] = {"plain": [], "start": [], "train": [], "stop": [], "step": []}

    def pair(keep: bool) -> None:
        gc.collect()
        gc.disable()
        try:
            t0 = clock()
            train_step()
            plain = clock() - t0
        finally:
            gc.enable()
        dbg = debugger()
        gc.collect()
        gc.disable()
        try:
            t0 = clock()
            dbg.start(model)
            t1 = clock()
            train_step()
            t2 = clock()
            dbg.stop()
            t3 = clock()
            dbg.step()
            t4 = clock()
        finally:
            gc.enable()
        dbg.close()
        if keep:
            for key, value in zip(phases, (plain, t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                value = value * 1e3
                phases[key].append(value)

    pair(False)  # warm-up
    for _ in range(args.pairs):
        pair(True)
    print(f"toy encoder {args.layers} layers, {args.pairs} pairs, CPU ms "
          f"({'real' if args.real_stats else 'constant'} statistics{', no export files' if args.no_export else ''}): "
          + " | ".join(f"{k} min {min(v):.2f} med {statistics.median(v):.2f}" for k, v in phases.items()))
    print(f"recording the training step: {min(phases['train']) - min(phases['plain']):.2f} ms (min - min); "
          f"whole recorded step over plain: {min(map(sum, zip(*list(phases.values())[1:]))) - min(phases['plain']):.2f} ms")


if __name__ == "__main__":
    main()
