"""Wall time of stop() + step() (the live export) per recorded step, by part, on the encoder.

Usage::

    ROOT=/path/to/checkout .venv/bin/python benchmarks/stop_step_cost.py CONFIG [STEPS] [THREADS]

``ROOT``: the checkout whose ``msprobe``/``store`` are imported (two checkouts compared
with one script); ``CONFIG``: a name of ``workloads.CONFIGS`` (``l1_stats``, ``mix_stats``,
``l1_tensor``); ``STEPS`` recorded steps timed (default 15) after 2 warm-up steps, with
``torch.set_num_threads(THREADS)`` (default 2). Each step is ``start(model)``, one training
step, ``stop()``, ``step()`` of ``workloads.build_encoder(4)``.

Each listed function is wrapped with ``time.perf_counter`` (with ``CLOCK=cpu`` in the
environment: ``time.thread_time``, the calling thread's CPU time, which other processes on
the machine disturb far less than wall time, but which leaves out waits: a thread start, a
lock); the report gives, per step, the
calls, the inclusive ms and the exclusive ms (not spent in another listed function) of
each, with ``stop()`` and ``step()`` (``PrecisionDebugger.stop``/``step``) as the totals,
then a digest of the last step's JSON files (equal digests: byte-identical output; the
checkout path in stack frames replaced). Functions a checkout does not have are skipped.
A profile for finding where the time goes, not a timed test: compare runs of the same
machine and load only.
"""
import os
import sys
import time

ROOT = os.environ["ROOT"]
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

cfg = sys.argv[1] if len(sys.argv) > 1 else "l1_stats"
N = int(sys.argv[2]) if len(sys.argv) > 2 else 15
torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 2)
from step_profile import FunctionTimers, json_digest, recorded_encoder  # noqa: E402

TARGETS = [
    "msprobe.pytorch.debugger:PrecisionDebugger.stop",
    "msprobe.pytorch.debugger:PrecisionDebugger.step",
    "msprobe.core.session:Session._run_flush_hooks",
    "store.log_writer:LogWriter._build_batch",
    "store.log_writer:LogWriter._flush_locked",
    "store.log_writer:LogWriter.take_step",
    "store.log_writer:LogWriter.take_step_rows",
    "store.log_writer:LogWriter.flush",
    "store.export:StepExporter.add",
    "store.entries:EntryBuilder.add",
    "store.entries:EntryBuilder.add_columns",
    "store.log_writer:make_part",
    "store.step_rows:StepRows.take_columns",
    "store.entries:_rows_as_lists",
    "store.arrow_np:select",
    "store.export:StepExporter.write",
    "store.export:_dump_text",
    "store.export:_items_text",
    "store.export:atomic_write_text",
    "store.export:export_tensors",
    "store.export:StepExporter.rows",
    "threading:Thread.start",
]
clock = time.thread_time if os.environ.get("CLOCK") == "cpu" else time.perf_counter
timers = FunctionTimers(clock)
timers.wrap_targets(TARGETS)
excl, incl, cnt = timers.excl, timers.incl, timers.cnt
step, dbg, scratch = recorded_encoder(cfg)

for i in range(2):
    step()
timers.clear()
t0 = time.perf_counter()
for i in range(N):
    step()
wall = time.perf_counter() - t0
dbg.close()
print(f"{cfg}: {N} steps, {wall / N * 1e3:.1f} ms per step (wall); parts in {clock.__name__}")
for k in sorted(incl, key=lambda k: -incl[k]):
    print(f"  {k:34s} n/step {cnt[k] / N:5.1f}  incl ms/step {incl[k] / N * 1e3:7.2f}  excl {excl[k] / N * 1e3:7.2f}")
total = incl["PrecisionDebugger.stop"] + incl["PrecisionDebugger.step"]
print(f"  stop()+step() ms/step {total / N * 1e3:.2f}")
last = os.path.join(scratch, "dump", f"step{N + 1}")
print("  files digest", json_digest(last, (ROOT, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
