"""Per-step CPU cost of the live export, by function, on the encoder workload.

Usage::

    ROOT=/path/to/checkout .venv/bin/python benchmarks/export_cost.py CONFIG [STEPS]

``ROOT`` is the checkout whose ``msprobe``/``store`` are imported (so two checkouts can be
compared run after run with the same script); ``CONFIG`` is a name of
``workloads.CONFIGS`` (``mix_stats``, ``l1_stats``, ...). Each listed function is wrapped
with ``time.perf_counter``; the report gives calls per step, exclusive ms per step (time
not spent in another listed function) and inclusive ms per step, averaged over ``STEPS``
recorded steps (default 8) after 2 warm-up steps, then the number of objects the cyclic
GC tracks and the full (generation 2) collections during the timed steps, and a digest of
the files of the last step (equal digests: byte-identical output; ``ROOT`` and this script's checkout in stack
frames replaced).
"""
import gc
import os
import sys

ROOT = os.environ["ROOT"]
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # step_profile, where ROOT lacks it
import torch  # noqa: E402

torch.set_num_threads(1)
from step_profile import FunctionTimers, json_digest, recorded_encoder  # noqa: E402

cfg = sys.argv[1] if len(sys.argv) > 1 else "mix_stats"
N = int(sys.argv[2]) if len(sys.argv) > 2 else 8
TARGETS = ["msprobe.core.session:Session._export", "store.entries:EntryBuilder.add", "store.export:_dump_text",
           "store.export:_items_text", "store.export:atomic_write_text", "store.log_writer:LogWriter.take_step",
           "store.export:StepExporter.add", "store.log_writer:LogWriter._flush_locked", "store.export:_write_step",
           "store.log_writer:LogWriter._build_batch"]
timers = FunctionTimers()
timers.wrap_targets(TARGETS)
excl, incl, cnt = timers.excl, timers.incl, timers.cnt
step, dbg, scratch = recorded_encoder(cfg)

for i in range(2):
    step()
timers.clear()
full0 = gc.get_stats()[2]["collections"]
for i in range(N):
    step()
full = gc.get_stats()[2]["collections"] - full0
for k, v in excl.most_common():
    print(f"{k:32s} n/step {cnt[k] / N:5.1f} excl ms/step {v / N * 1e3:7.2f} incl {incl[k] / N * 1e3:7.2f}")
print("sum excl", round(sum(excl.values()) / N * 1e3, 2))
print("add+dump_text", round((excl["EntryBuilder.add"] + excl["_dump_text"]) / N * 1e3, 2))
gc.collect()
print("gc tracked objects", len(gc.get_objects()), "full collections in timed steps", full)
last = os.path.join(scratch, "dump", f"step{N + 1}")
print("files digest", json_digest(last, (ROOT, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))), last)
