"""Does memory grow with the number of recorded steps? RSS and the number of objects the cyclic GC tracks after N steps,
recorded and uninstrumented.

Usage::

    ROOT=/path/to/checkout .venv/bin/python benchmarks/memory_growth.py [CONFIG] [STEPS]

Runs two fresh processes of ``STEPS`` (default 4000) training steps of a small MLP
(``Linear(8, 8)``, ReLU, ``Linear(8, 2)``, batch 4, SGD): one uninstrumented, one with each
step ``start(model)``, forward, backward, optimizer step, ``stop()``, ``step()`` of the
checkout ``ROOT``'s ``PrecisionDebugger`` (level and task of ``workloads.CONFIGS[CONFIG]``,
default ``l1_stats``). After 200, 1000, 2000, 4000... steps each collects garbage and
reports its resident set (``/proc/self/statm``, MiB) and ``len(gc.get_objects())``; the
table gives both, the ratio of the RSS, and the growth per step from step 1000 on (KiB and
objects per step: 0 for the uninstrumented run apart from allocator noise). A tiny model
keeps a step short, so that thousands of steps show a leak of a few KiB per step: what the
recorder keeps per step is the same whatever the model's size, while a large model's step
would hide it in the time a run can take.

What it catches (l1_stats, 4000 steps): one small Arrow batch kept per step shows as 24 KiB
and 13 tracked objects per step; the current code is flat from step 1000 on.
Linux only (``/proc``). Not a test: pytest collects nothing here.
"""
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.environ.get("ROOT", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rss_mib() -> float:
    """Resident set size of this process (MiB)."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(cfg: str, steps: int, plain: bool) -> None:
    """Run the steps; print one JSON line ``[steps, RSS MiB, tracked objects]`` per mark."""
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, target = torch.randn(4, 8), torch.randn(4, 2)
    scratch = tempfile.mkdtemp()
    dbg = None
    if not plain:
        import msprobe
        from msprobe.pytorch import PrecisionDebugger
        from workloads import config_json

        if not os.path.realpath(msprobe.__file__).startswith(os.path.realpath(ROOT) + os.sep):
            sys.exit(f"msprobe imported from {msprobe.__file__}, not from ROOT={ROOT}")
        path = os.path.join(scratch, "config.json")
        with open(path, "w") as handle:
            json.dump(config_json(cfg, os.path.join(scratch, "dump")), handle)
        dbg = PrecisionDebugger(config_path=path)
    marks = {200, 1000} | {1000 * 2 ** k for k in range(1, 12)}
    try:
        for s in range(1, steps + 1):
            if dbg is not None:
                dbg.start(model)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), target).backward()
            opt.step()
            if dbg is not None:
                dbg.stop()
                dbg.step()
            if s in marks or s == steps:
                gc.collect()
                print(json.dumps([s, rss_mib(), len(gc.get_objects())]), flush=True)
    finally:
        if dbg is not None:
            dbg.close()
        shutil.rmtree(scratch, ignore_errors=True)


def run(cfg: str, steps: int, plain: bool) -> list:
    """The marks of one child process (see :func:`child`)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", cfg, str(steps)] + (["--plain"] if plain else [])
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, ROOT=ROOT)).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("[")]


def growth(marks: list) -> tuple:
    """``(KiB, objects)`` gained per step from the mark at step 1000 (or the first) to the last."""
    first = next((m for m in marks if m[0] >= 1000), marks[0])
    last = marks[-1]
    n = max(last[0] - first[0], 1)
    return (last[1] - first[1]) * 1024 / n, (last[2] - first[2]) / n


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    cfg = args[0] if args else "l1_stats"
    steps = int(args[1]) if len(args) > 1 else 4000
    if "--child" in sys.argv:
        child(cfg, steps, "--plain" in sys.argv)
        return
    plain, recorded = run(cfg, steps, True), run(cfg, steps, False)
    print(f"{cfg}, checkout {ROOT}, {steps} steps of a tiny MLP")
    print("| steps | uninstrumented RSS MiB / objects | recorded RSS MiB / objects | RSS ratio |")
    print("|---|---|---|---|")
    for p, r in zip(plain, recorded):
        print(f"| {r[0]} | {p[1]:.1f} / {p[2]:,} | {r[1]:.1f} / {r[2]:,} | {r[1] / p[1]:.3f} |")
    (pk, po), (rk, ro) = growth(plain), growth(recorded)
    print(f"growth per step from step {next((m[0] for m in recorded if m[0] >= 1000), recorded[0][0])}: "
          f"uninstrumented {pk:.2f} KiB, {po:.3f} objects; recorded {rk:.2f} KiB, {ro:.3f} objects")


if __name__ == "__main__":
    main()
