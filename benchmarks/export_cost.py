"""Per-step CPU cost of the live export (issue 5), by function, on the encoder workload.

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
import atexit
import collections
import gc
import hashlib
import importlib
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.environ["ROOT"]
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import torch  # noqa: E402

torch.set_num_threads(1)
from workloads import build_encoder, config_json  # noqa: E402
from msprobe.pytorch import PrecisionDebugger  # noqa: E402

cfg = sys.argv[1] if len(sys.argv) > 1 else "mix_stats"
N = int(sys.argv[2]) if len(sys.argv) > 2 else 8
TARGETS = ["msprobe.core.session:Session._export", "store.entries:EntryBuilder.add", "store.export:_dump_text",
           "store.export:_items_text", "store.export:atomic_write_text", "store.log_writer:LogWriter.take_step",
           "store.export:StepExporter.add", "store.log_writer:LogWriter._flush_locked", "store.export:_write_step",
           "store.log_writer:LogWriter._build_batch"]
excl = collections.Counter()
incl = collections.Counter()
cnt = collections.Counter()
stack = []


def wrap(owner, attr, label):
    f = getattr(owner, attr)

    def w(*a, **k):
        t0 = time.perf_counter()
        stack.append(0.0)
        try:
            return f(*a, **k)
        finally:
            el = time.perf_counter() - t0
            child = stack.pop()
            excl[label] += el - child
            incl[label] += el
            cnt[label] += 1
            if stack:
                stack[-1] += el
    setattr(owner, attr, w)


for t in TARGETS:
    mod, _, q = t.partition(":")
    m = importlib.import_module(mod)
    parts = q.split(".")
    owner = m if len(parts) == 1 else getattr(m, parts[0])
    if hasattr(owner, parts[-1]):
        wrap(owner, parts[-1], q)
model, train_step = build_encoder(4)
scratch = tempfile.mkdtemp()
atexit.register(shutil.rmtree, scratch, True)  # the dumps, at exit
p = os.path.join(scratch, "c.json")
json.dump(config_json(cfg, os.path.join(scratch, "dump")), open(p, "w"))
dbg = PrecisionDebugger(config_path=p)


def step():
    dbg.start(model)
    train_step()
    dbg.stop()
    dbg.step()


for i in range(2):
    step()
excl.clear()
incl.clear()
cnt.clear()
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
digest = hashlib.sha256()
last = os.path.join(scratch, "dump", f"step{N + 1}")
for dirpath, _, files in sorted(os.walk(last)):
    for f in sorted(files):
        if f.endswith(".json"):
            digest.update(f.encode())
            text = open(os.path.join(dirpath, f), "rb").read()
            for root in (ROOT, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))):
                text = text.replace(os.path.abspath(root).encode(), b"ROOT")  # stack frames
            digest.update(text)
print("files digest", digest.hexdigest()[:16], last)
