"""Shared parts of the per-function profiles of recorded encoder steps
(``export_cost.py``, ``stop_step_cost.py``): timers wrapped around named functions, the
recorded encoder workload, and a digest of a step's JSON files.

Not a benchmark itself, and not a test module (no ``test_`` prefix).
"""
import atexit
import collections
import hashlib
import importlib
import json
import os
import shutil
import tempfile
import time


class FunctionTimers:
    """Inclusive and exclusive time and call counts of wrapped functions.

    Args:
        clock: a function returning seconds (``time.perf_counter`` for wall time,
            ``time.thread_time`` for the calling thread's CPU time).

    Attributes:
        incl, excl, cnt: ``collections.Counter`` by label: seconds including, and
            excluding, the time spent in other wrapped functions called meanwhile; calls.
    """

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.incl = collections.Counter()
        self.excl = collections.Counter()
        self.cnt = collections.Counter()
        self._stack = []

    def wrap(self, owner, attr, label):
        """Replace ``owner.attr`` by a timed wrapper counted under ``label``."""
        f = getattr(owner, attr)
        clock, stack = self.clock, self._stack
        excl, incl, cnt = self.excl, self.incl, self.cnt

        def w(*a, **k):
            t0 = clock()
            stack.append(0.0)
            try:
                return f(*a, **k)
            finally:
                el = clock() - t0
                child = stack.pop()
                excl[label] += el - child
                incl[label] += el
                cnt[label] += 1
                if stack:
                    stack[-1] += el
        setattr(owner, attr, w)

    def wrap_targets(self, targets):
        """Wrap each ``"module:Name"`` or ``"module:Class.method"`` of ``targets``, labelled
        by the part after the colon; a module or name the imported checkout lacks is
        skipped."""
        for target in targets:
            mod, _, qualname = target.partition(":")
            try:
                module = importlib.import_module(mod)
            except ImportError:
                continue
            parts = qualname.split(".")
            owner = module if len(parts) == 1 else getattr(module, parts[0], None)
            if owner is not None and hasattr(owner, parts[-1]):
                self.wrap(owner, parts[-1], qualname)

    def clear(self):
        """Forget the times and counts so far (after the warm-up steps)."""
        self.incl.clear()
        self.excl.clear()
        self.cnt.clear()


def recorded_encoder(config, layers=4):
    """``(step, debugger, scratch)``: ``workloads.build_encoder(layers)`` recorded by a
    ``PrecisionDebugger`` with ``workloads.config_json(config, ...)``, dumping into the new
    directory ``scratch`` (removed at exit); ``step()`` runs ``start(model)``, one training
    step, ``stop()`` and ``step()``."""
    from workloads import build_encoder, config_json
    from msprobe.pytorch import PrecisionDebugger

    model, train_step = build_encoder(layers)
    scratch = tempfile.mkdtemp()
    atexit.register(shutil.rmtree, scratch, True)  # the dumps, at exit
    path = os.path.join(scratch, "c.json")
    with open(path, "w") as handle:
        json.dump(config_json(config, os.path.join(scratch, "dump")), handle)
    debugger = PrecisionDebugger(config_path=path)

    def step():
        debugger.start(model)
        train_step()
        debugger.stop()
        debugger.step()

    return step, debugger, scratch


def json_digest(directory, roots):
    """The first 16 hex digits of a SHA-256 over the names and contents of the ``.json``
    files below ``directory`` (sorted), each path of ``roots`` in them replaced by
    ``ROOT`` (stack frames name the checkout): equal digests, byte-identical output."""
    digest = hashlib.sha256()
    for dirpath, _, files in sorted(os.walk(directory)):
        for f in sorted(files):
            if f.endswith(".json"):
                digest.update(f.encode())
                with open(os.path.join(dirpath, f), "rb") as handle:
                    text = handle.read()
                for root in roots:
                    text = text.replace(os.path.abspath(root).encode(), b"ROOT")
                digest.update(text)
    return digest.hexdigest()[:16]
