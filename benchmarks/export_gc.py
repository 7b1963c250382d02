"""Containers the cyclic GC tracks in the live exporter's state after ``stop()``.

Usage::

    ROOT=/path/to/checkout .venv/bin/python benchmarks/export_gc.py [CONFIG]

Records 3 steps of the encoder workload (4 layers, one thread, ``CONFIG`` of
``workloads.CONFIGS``, default ``mix_stats``) with the checkout ``ROOT``; after the third
``stop()`` it allocates 30,000 short-lived lists (young collections only, as a training
step does: no full collection, which would untrack what a young one may not have reached
yet) and walks everything reachable from the exporter's entries, seq index and text cache,
counting the objects ``gc.is_tracked`` reports, by type. Each of them that outlives the
young generations is promoted to the old one and counts toward the next full collection.
"""
import atexit
import gc
import json
import os
import shutil
import sys
import tempfile

ROOT = os.environ["ROOT"]
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import torch  # noqa: E402

torch.set_num_threads(1)
from workloads import build_encoder, config_json  # noqa: E402
from msprobe.pytorch import PrecisionDebugger  # noqa: E402

cfg = sys.argv[1] if len(sys.argv) > 1 else "mix_stats"
model, train_step = build_encoder(4)
scratch = tempfile.mkdtemp()
atexit.register(shutil.rmtree, scratch, True)  # the dumps, at exit
path = os.path.join(scratch, "c.json")
with open(path, "w") as handle:
    json.dump(config_json(cfg, os.path.join(scratch, "dump")), handle)
dbg = PrecisionDebugger(config_path=path)
for step in range(3):
    dbg.start(model)
    train_step()
    dbg.stop()
    if step == 2:
        garbage = [[] for _ in range(30000)]
        del garbage
        exporter = dbg.session._step_export
        kinds = {}
        seen = set()
        stack = [exporter._builder.entries, exporter._builder._entry_of_seq, exporter._chunks]
        while stack:
            obj = stack.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if gc.is_tracked(obj):
                kinds[type(obj).__name__] = kinds.get(type(obj).__name__, 0) + 1
                stack.extend(r for r in gc.get_referents(obj) if not isinstance(r, type))
        print(f"{cfg}: {len(seen)} objects reached, {sum(kinds.values())} tracked by the GC: {kinds}")
    dbg.step()
