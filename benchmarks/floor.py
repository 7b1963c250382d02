"""The least any Python-level recorder costs on a workload: msprobe's own hooks with bodies
that do only what every entry needs. Not a test.

    python benchmarks/floor.py [--workload dispatch] [--config l1_stats] [--steps 40] [--rounds 5]

The real ``PrecisionDebugger`` installs its hooks (the API wrappers of
``support_wrap_ops.yaml``, at L0/mix the three forward hooks per module and a
post-accumulate-grad hook per parameter); then the bodies the hooks call
(``Recorder.record_api``, ``module_pre``, ``module_done``, ``module_post``,
``parameter_grad``) are replaced by minimal ones. A minimal body per API call or module
forward: one counter per entry name, the native statistics of each tensor argument and
of a tensor output (``NATIVE.small_leaf``, the C pass msprobe uses for tensors up to 16 KiB;
nested containers and non-tensor arguments are skipped), one autograd post-hook on the
output's node whose body takes the native statistics of each gradient, and one tuple
appended to a list. Parameter gradients: the statistics of ``param.grad``. Nothing is
written: the log, the files, the stack, the filters, names of nested arguments, in-place
safety and the backward attribution of msprobe's entries are all left out, so the floor is
a lower bound on the host time of any recorder built on these hooks.

A third variant runs msprobe's recorder as it is but writes nothing (``Session.emit`` and
the export are no-ops): what the recorder costs before its log and files.

Printed: median step time of the uninstrumented step, the minimal recorder's and
msprobe's (a fresh process each, ``--rounds`` rounds of the three in turn, ``--steps``
steps each after 3 warm-up steps; medians over the rounds of each process's median), for
the training step alone (wall and thread CPU) and with ``start()``/``stop()``/``step()``
(where msprobe writes its files; the minimal recorder writes none), and their ratios.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


def _install_floor() -> list:
    """Replace the recorder's hook bodies by minimal ones (before a debugger installs its
    hooks: the hooks look the bodies up then); returns the list the bodies append rows to."""
    import torch

    from msprobe.pytorch import recorder as recorder_mod
    from msprobe.pytorch.leaves import MEMO_MIN_BYTES, _small_leaf, _small_table

    rows: list = []
    table = _small_table(MEMO_MIN_BYTES)
    tensor = torch.Tensor
    counts: dict = {}
    frames: list = []

    def stats(t, io, path):
        return _small_leaf(t, io, path, table) if _small_leaf is not None else None

    def grad_hook(name, grad_inputs, grad_outputs):
        rows.append((name, [stats(g, "input", (i,)) for i, g in enumerate(grad_outputs) if isinstance(g, tensor)]))

    def outputs(name, out, leaves):
        if isinstance(out, tensor):
            leaves.append(stats(out, "output", (0,)))
            node = out.grad_fn
            if node is not None:
                node.register_hook(partial(grad_hook, name + ".backward"))

    def record_api(self, original, family, key, args, kwargs):
        tls = self.session._tls
        tls.busy = True
        try:
            n = counts.get(key, 0)
            counts[key] = n + 1
            name = f"{key}.{n}"
            leaves = [stats(a, "input", (i,)) for i, a in enumerate(args) if isinstance(a, tensor)]
            out = original(*args, **kwargs)
            outputs(name, out, leaves)
            rows.append((name, leaves))
            return out
        finally:
            tls.busy = False

    def module_pre(self, module, prefix, args, kwargs):
        n = counts.get(prefix, 0)
        counts[prefix] = n + 1
        frames.append((f"{prefix}.{n}", [stats(a, "input", (i,)) for i, a in enumerate(args) if isinstance(a, tensor)]))

    def module_done(self, module):
        return None

    def module_post(self, module, output):
        name, leaves = frames.pop()
        outputs(name, output, leaves)
        rows.append((name, leaves))

    def parameter_grad(self, prefix, pname, names, param):
        rows.append((prefix, [stats(param.grad, pname, ())]))

    rec = recorder_mod.Recorder
    for fn in (record_api, module_pre, module_done, module_post, parameter_grad):
        setattr(rec, fn.__name__, fn)
    return rows


def child(args) -> None:
    import torch

    from workloads import build_encoder, config_json

    torch.set_num_threads(args.threads)
    model, train_step = build_encoder(args.layers, size=args.workload)
    dbg = None
    if args.mode != "none":
        from msprobe.pytorch import PrecisionDebugger

        scratch = tempfile.mkdtemp(prefix="msprobe-floor-")
        atexit.register(shutil.rmtree, scratch, True)  # the dumps, at exit
        cfg = os.path.join(scratch, "config.json")
        with open(cfg, "w") as f:
            json.dump(config_json(args.config, os.path.join(scratch, "dump")), f)
        rows = None
        if args.mode == "floor":
            # the bodies are looked up when the hooks are installed (bound methods): replace
            # them on the class first
            rows = _install_floor()
        if args.mode == "nolog":
            # msprobe's recorder as it is, but its entries go nowhere: no log rows, no
            # Arrow batches, no step files (start()/stop()/step() still run)
            from msprobe.core.session import Session

            Session.emit = lambda self, call: None
            Session._export = lambda self: None
        dbg = PrecisionDebugger(config_path=cfg)

    def one_step():
        t0 = time.perf_counter()
        if dbg is not None:
            dbg.start(model)
        t1, c1 = time.perf_counter(), time.thread_time()
        train_step()
        t2, c2 = time.perf_counter(), time.thread_time()
        if dbg is not None:
            dbg.stop()
            dbg.step()
            if args.mode == "floor":
                rows.clear()
        return t2 - t1, c2 - c1, time.perf_counter() - t0

    for _ in range(3):
        one_step()
    times = [one_step() for _ in range(args.steps)]
    print(json.dumps({key: statistics.median(t[i] for t in times) * 1e3
                      for i, key in enumerate(("wall_ms", "cpu_ms", "whole_ms"))}))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="dispatch", choices=["dispatch", "encoder"])
    p.add_argument("--config", default="l1_stats", help="workloads.CONFIGS name of a recording configuration")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--mode", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.mode is not None:
        child(args)
        return
    results: dict = {"none": [], "floor": [], "nolog": [], "msprobe": []}
    for _ in range(args.rounds):
        for mode in results:
            cmd = [sys.executable, __file__, "--mode", mode, "--workload", args.workload, "--config", args.config,
                   "--layers", str(args.layers), "--steps", str(args.steps), "--threads", str(args.threads)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            results[mode].append(json.loads(out.strip().splitlines()[-1]))
    base_w = statistics.median(r["wall_ms"] for r in results["none"])
    base_c = statistics.median(r["cpu_ms"] for r in results["none"])
    print(f"{args.workload}, {args.config}, {args.layers} layers, torch threads {args.threads}, "
          f"{args.rounds} rounds x {args.steps} steps; medians")
    base_whole = statistics.median(r["whole_ms"] for r in results["none"])
    print("| recorder | training step ms (wall) | ratio | training step ms (thread CPU) | ratio "
          "| with start/stop/step ms (wall) | ratio |")
    print("|---|---|---|---|---|---|---|")
    for mode, label in (("none", "uninstrumented"), ("floor", "minimal bodies on msprobe's hooks"),
                        ("nolog", "msprobe, entries not written (no log, no files)"), ("msprobe", "msprobe")):
        w = statistics.median(r["wall_ms"] for r in results[mode])
        c = statistics.median(r["cpu_ms"] for r in results[mode])
        h = statistics.median(r["whole_ms"] for r in results[mode])
        print(f"| {label} | {w:.2f} | {w / base_w:.2f} | {c:.2f} | {c / base_c:.2f} | {h:.2f} | {h / base_whole:.2f} |")


if __name__ == "__main__":
    main()
