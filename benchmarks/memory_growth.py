"""Does memory grow with the number of recorded steps? (issue 5: "memory does not grow with
the number of steps"). RSS and the number of objects the cyclic GC tracks, after N steps.

Usage::

    ROOT=/path/to/checkout .venv/bin/python benchmarks/memory_growth.py [CONFIG] [STEPS] [--plain]

Runs ``STEPS`` (default 4000) training steps of a small MLP (``Linear(8, 8)``, ReLU,
``Linear(8, 2)``, batch 4, SGD): each one ``start(model)``, forward, backward, optimizer
step, ``stop()``, ``step()`` with the checkout ``ROOT``'s ``PrecisionDebugger`` (level and
task of ``workloads.CONFIGS[CONFIG]``, default ``l1_stats``); ``--plain`` runs the same steps
without a debugger. After 200, 1000, 2000, 4000... steps it collects garbage and prints the
resident set (``/proc/self/statm``, MiB) and ``len(gc.get_objects())``. A tiny model keeps a
step short, so that thousands of steps show a leak of a few KiB per step: what the
recorder keeps per step is the same whatever the model's size, while a large model's
step would hide it in the time a run can take.

Session 18 (2026-12-01, l1_stats, 4000 steps): the checkout before the fix of
``LogWriter.drop_step_rows`` grew by 24 KiB and 13 tracked objects per step (one small Arrow
batch, the ``step_end`` marker's, kept per step); after it, flat from step 1000 on.
Linux only (``/proc``). Not a test: pytest collects nothing here.
"""
import gc
import json
import os
import shutil
import sys
import tempfile

ROOT = os.environ.get("ROOT", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import torch  # noqa: E402

torch.set_num_threads(1)
args = [a for a in sys.argv[1:] if not a.startswith("--")]
plain = "--plain" in sys.argv
cfg = args[0] if args else "l1_stats"
steps = int(args[1]) if len(args) > 1 else 4000


def rss_mib() -> float:
    """Resident set size of this process (MiB)."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, target = torch.randn(4, 8), torch.randn(4, 2)
scratch = tempfile.mkdtemp()
dbg = None
if not plain:
    from workloads import config_json  # noqa: E402
    from msprobe.pytorch import PrecisionDebugger  # noqa: E402

    import msprobe  # noqa: E402
    if not os.path.realpath(msprobe.__file__).startswith(os.path.realpath(ROOT) + os.sep):
        sys.exit(f"msprobe imported from {msprobe.__file__}, not from ROOT={ROOT}")
    path = os.path.join(scratch, "config.json")
    with open(path, "w") as handle:
        json.dump(config_json(cfg, os.path.join(scratch, "dump")), handle)
    dbg = PrecisionDebugger(config_path=path)

marks = {200, 1000} | {1000 * 2 ** k for k in range(1, 12)}
print(f"{'plain' if plain else cfg}, checkout {ROOT}: steps, RSS MiB, tracked objects")
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
            print(f"  {s:6d}  {rss_mib():8.1f}  {len(gc.get_objects()):9d}", flush=True)
finally:
    if dbg is not None:
        dbg.close()
    shutil.rmtree(scratch, ignore_errors=True)
