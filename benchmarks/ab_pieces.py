"""In-process A/B of one recorder acceleration: recorded steps with the piece on and off,
interleaved in one process (ABBA order), wall-clock time per recorded step.

    python benchmarks/ab_pieces.py --piece ptfile --workload encoder --threads 2 --config l1_tensor

Pieces:

* ``ptfile``: task tensor, the ``.pt`` files written by
  :func:`msprobe.pytorch.payload.write_pt` (the hand-written writer) or by
  ``torch.save`` of the tensor rebuilt from the payload.

Each sample is a fresh debugger (hooks installed outside the timer) running ``--steps``
recorded steps; its ``close()`` (the writer threads' remaining work) is inside the timer
unless ``--no-close``.
Prints the medians, the quartiles of the per-pair differences and the plain step time.
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
    p.add_argument("--piece", required=True, choices=["ptfile"])
    p.add_argument("--config", default="l1_stats")
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--workload", default="encoder", choices=["encoder", "dispatch"])
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--root", default=None, help="directory for the dumps (default: the temporary directory)")
    p.add_argument("--no-close", action="store_true",
                   help="time the steps only, close() outside the timer (statistics configurations)")
    args = p.parse_args(argv)

    import torch._dynamo  # noqa: F401  (as overhead.py does)
    import torch

    from workloads import build_encoder, config_json
    import msprobe.pytorch.debugger as debugger
    from msprobe.pytorch.payload import torch_dtype
    from msprobe.pytorch import PrecisionDebugger

    torch.set_num_threads(args.threads)
    model, train_step = build_encoder(args.layers, size=args.workload)
    root = tempfile.mkdtemp(prefix="ab-pieces-", dir=args.root)
    made = [0]
    writer = debugger.write_pt

    def torch_save(path, payload):
        # the tensor is built through torch._C entry points, which the recorder's API hooks
        # do not wrap: the writer thread must not record its own calls
        data = payload.data if isinstance(payload.data, bytearray) else bytearray(payload.data)
        t = torch._C._VariableFunctions.frombuffer(data, dtype=torch.uint8) if data else \
            torch._C._VariableFunctions.empty((0,), dtype=torch.uint8)
        t = torch._C.TensorBase.reshape(torch._C.TensorBase.view(t, torch_dtype(payload.dtype)),
                                        tuple(payload.shape))
        torch.save(t, path)

    def switch(on: bool) -> None:
        debugger.write_pt = writer if on else torch_save

    def plain() -> float:
        t = time.perf_counter()
        for _ in range(args.steps):
            train_step()
        return (time.perf_counter() - t) / args.steps

    def recorded(on: bool) -> float:
        made[0] += 1
        dump = Path(root) / f"d{made[0]}"
        dump.mkdir()
        cfg_path = dump / "config.json"
        cfg_path.write_text(json.dumps(config_json(args.config, str(dump))))
        dbg = PrecisionDebugger(config_path=str(cfg_path), dump_path=str(dump))
        dbg.start(model)
        dbg.stop()
        switch(on)
        t = time.perf_counter()
        for _ in range(args.steps):
            dbg.start(model)
            train_step()
            dbg.stop()
            dbg.step()
        if not args.no_close:
            dbg.close()
        elapsed = (time.perf_counter() - t) / args.steps
        dbg.close()
        shutil.rmtree(dump, ignore_errors=True)
        return elapsed

    try:
        plain(), recorded(True), recorded(False)  # warm-up
        on, off, base = [], [], []
        for i in range(args.pairs):
            base.append(plain())
            order = (True, False) if i % 2 == 0 else (False, True)
            for flag in order:
                (on if flag else off).append(recorded(flag))
        diff = sorted((b - a) * 1e3 for a, b in zip(on, off))
        q = statistics.quantiles(diff, n=4)
        med_on, med_off, med_plain = (statistics.median(x) * 1e3 for x in (on, off, base))
        print(f"{args.piece} {args.workload} {args.layers} layers {args.config} threads {args.threads} "
              f"steps/sample {args.steps} pairs {args.pairs}: plain {med_plain:.1f} ms | "
              f"on {med_on:.1f} ms | off {med_off:.1f} ms | saved per step (off - on, per pair) "
              f"median {statistics.median(diff):.2f} ms, quartiles {q[0]:.2f}..{q[2]:.2f} ms "
              f"= {statistics.median(diff) / med_off * 100:.1f} % of the recorded step")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
