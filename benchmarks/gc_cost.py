"""What the cyclic garbage collector costs in recorded training steps.

Usage::

    ROOT=/path/to/checkout .venv/bin/python benchmarks/gc_cost.py [CONFIG] [STEPS] [THREADS] [WORKLOAD]

Two fresh processes run ``STEPS`` (default 40) timed steps of the ``WORKLOAD`` (default
``encoder``; ``dispatch``: the workload's own training step)
(``workloads.build_encoder(4, size=WORKLOAD)``, SGD, ``torch.set_num_threads(THREADS)``, default 2) after 3
warm-up steps: one uninstrumented, one recorded with the checkout ``ROOT``'s
``PrecisionDebugger`` at ``workloads.CONFIGS[CONFIG]`` (default ``l1_stats``), each step
``start(model)``, the training step, ``stop()``, ``step()``. ``gc.callbacks`` time every
collection. Printed per process: collections of each generation per step, ms each and ms
per step, and the objects each generation-1 collection promoted to the oldest generation,
per step (a full collection comes when those reach a quarter of the objects the last one
left: this number sets how often the slow full collections come). Young collections are
counted in every step; a full collection (generation 2) walks every tracked object of the
process (~320,000 here, most of them torch's and the model's), so it shows as a rare long
pause that medians of step times leave out and means do not.

Measured (l1_stats, 30 steps; log in benchmarks/RESULTS.md): recorded 2.9 young collections per step at 0.38
ms each and 0.27 generation-1 collections at 0.84 ms (~1.3 ms per step), one full collection
(168 ms) in 30 steps, ~760 objects promoted per step; uninstrumented: no collection.
Not a test: pytest collects nothing here.
"""
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.environ.get("ROOT", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def child(cfg: str, steps: int, threads: int, plain: bool, workload: str = "encoder") -> dict:
    """Run the steps in this process; the collector's numbers (see the module docstring)."""
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import torch
    import torch.nn as nn

    torch.set_num_threads(threads)
    from workloads import build_encoder, config_json

    model, train_step = build_encoder(4, size=workload)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tokens = torch.randint(0, 1000, (8, 128))
    targets = torch.randint(0, 1000, (8, 128))
    dbg = None
    if not plain:
        from msprobe.pytorch import PrecisionDebugger

        scratch = tempfile.mkdtemp()
        path = os.path.join(scratch, "config.json")
        with open(path, "w") as handle:
            json.dump(config_json(cfg, os.path.join(scratch, "dump")), handle)
        dbg = PrecisionDebugger(config_path=path)
    seconds = [0.0, 0.0, 0.0]
    count = [0, 0, 0]
    promoted = [0]
    state = {}

    def on_collect(phase: str, info: dict) -> None:
        now = time.perf_counter()
        generation = info["generation"]
        if phase == "start":
            if generation == 1:  # counted before the clock starts: listing takes ~30 ms
                state["old"] = len(gc.get_objects(generation=2))
            state["t"] = time.perf_counter()
            return
        seconds[generation] += now - state["t"]
        count[generation] += 1
        if generation == 1:  # objects now in the oldest generation that were not before
            promoted[0] += max(len(gc.get_objects(generation=2)) - state["old"], 0)

    def one_step() -> None:
        if dbg is not None:
            dbg.start(model)
        if workload == "encoder":
            opt.zero_grad()
            nn.functional.cross_entropy(model(tokens).reshape(-1, 1000), targets.reshape(-1)).backward()
            opt.step()
        else:  # the workload's own step (workloads.build_encoder)
            train_step()
        if dbg is not None:
            dbg.stop()
            dbg.step()

    for _ in range(3):
        one_step()
    gc.callbacks.append(on_collect)
    for _ in range(steps):
        one_step()
    gc.callbacks.remove(on_collect)
    if dbg is not None:
        dbg.close()
    return {"count": count, "seconds": seconds, "promoted": promoted[0], "steps": steps,
            "tracked": len(gc.get_objects())}


def report(label: str, r: dict) -> str:
    n = r["steps"]
    parts = []
    for g in range(3):
        c, s = r["count"][g], r["seconds"][g]
        each = f"{s / c * 1e3:.2f} ms each" if c else "-"
        parts.append(f"gen{g} {c / n:.2f}/step ({each}, {s / n * 1e3:.2f} ms/step)")
    total = sum(r["seconds"]) / n * 1e3
    return (f"  {label:15s} " + "; ".join(parts)
            + f"; all {total:.2f} ms/step; promoted {r['promoted'] / n:.0f}/step; tracked {r['tracked']:,}")


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    cfg = args[0] if args else "l1_stats"
    steps = int(args[1]) if len(args) > 1 else 40
    threads = int(args[2]) if len(args) > 2 else 2
    workload = args[3] if len(args) > 3 else "encoder"
    if "--child" in sys.argv:
        print(json.dumps(child(cfg, steps, threads, "--plain" in sys.argv, workload)))
        return
    results = {}
    for label, extra in (("uninstrumented", ["--plain"]), (cfg, [])):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", cfg, str(steps), str(threads), workload] + extra
        out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, env=dict(os.environ, ROOT=ROOT))
        results[label] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"garbage collector, {workload} (4 layers), {steps} steps, {threads} threads, checkout {ROOT}")
    for label, r in results.items():
        print(report(label, r))


if __name__ == "__main__":
    main()
