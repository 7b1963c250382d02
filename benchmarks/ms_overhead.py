#!/usr/bin/env python
"""Overhead of msprobe on MindSpore PyNative training (examples/ms_char_lm.py's model).

Prints seconds per training step (wall clock and process CPU time) and their ratios
against an uninstrumented run for: recording at level mix / L1 / L0 (task statistics),
and with the hooks installed but recording stopped (between ``stop()`` and the next
``start()``). The CPU-time ratio is the steadier one on a shared machine::

    python benchmarks/ms_overhead.py [--steps 20]
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _example():
    spec = importlib.util.spec_from_file_location("ms_char_lm", REPO / "examples" / "ms_char_lm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(steps: int, mode: str) -> tuple[float, float]:
    """``(wall seconds, process CPU seconds)`` per step; ``mode`` is ``off``, ``idle`` or a level."""
    import mindspore as ms
    from mindspore import Tensor, nn

    from msprobe.mindspore import PrecisionDebugger

    ex = _example()
    ms.set_device("CPU")
    vocab, batches = ex.make_batches(ex.load_text(), steps + 2)
    net = ex.build_model(vocab)
    opt = nn.Adam(net.trainable_params(), learning_rate=ex.LEARNING_RATE)
    loss_fn = nn.CrossEntropyLoss()
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    with tempfile.TemporaryDirectory() as d:
        dbg = None
        if mode != "off":
            dbg = PrecisionDebugger(dump_path=d, level="mix" if mode == "idle" else mode)
            if mode == "idle":
                dbg.start(net)
                dbg.stop()
        t0 = c0 = 0.0
        for i, (x, y) in enumerate(batches):
            if i == 2:
                t0, c0 = time.perf_counter(), time.process_time()
            if dbg is not None and mode != "idle":
                dbg.start(net)
            loss, grads = grad_fn(Tensor(x), Tensor(y))
            opt(grads)
            if dbg is not None and mode != "idle":
                dbg.stop()
                dbg.step()
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        if dbg is not None:
            dbg.close()
    return elapsed / steps, cpu / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    base, base_cpu = run(args.steps, "off")
    print(f"{'mode':<8} {'s/step':>9} {'ratio':>7} {'cpu s/step':>11} {'cpu ratio':>10}")
    print(f"{'off':<8} {base:9.4f} {1.0:7.2f} {base_cpu:11.4f} {1.0:10.2f}")
    for mode in ("idle", "L0", "L1", "mix"):
        t, c = run(args.steps, mode)
        print(f"{mode:<8} {t:9.4f} {t / base:7.2f} {c:11.4f} {c / base_cpu:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
