#!/usr/bin/env python
"""Where the recorder's host time goes, per recorded entry: the recorder's functions timed
one by one (thread CPU time, exclusive of the other timed functions they call), over
recorded steps of an encoder workload, with each function's time per step and per
recorded entry (the step's dump.json keys) and per recorded tensor. Not a test.

    python benchmarks/host_cost.py [--workload dispatch] [--config l1_stats] [--steps 40]

The timers themselves cost about a microsecond per timed call (it lands in "untimed
remainder" and in the wrapped functions); the per-step total of recorded − plain is measured
without timers, in the same process, alternating plain and recorded steps.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

#: component -> targets ("module:Name" or "module:Class.method") whose inclusive time it
#: sums (a call of a target made inside another target of the same component is not counted
#: twice). Components nest (a tensor leaf is built inside the argument walk and inside the
#: backward hooks): each is timed in its own pass.
COMPONENTS = collections.OrderedDict([
    ("recorded API call (record_api, all inside)", ["msprobe.pytorch.recorder:Recorder.record_api"]),
    ("  plan: names, counters, parent, stack, filters", ["msprobe.core.naming:CallCounter.next",
                                                         "msprobe.core.stack:StackInterner.capture",
                                                         "msprobe.core.recorder:RecorderCore.wanted",
                                                         "msprobe.core.recorder:RecorderCore.parent",
                                                         "msprobe.pytorch.recorder:in_recompute"]),
    ("  write rule and memo release", ["msprobe.pytorch.recorder:Recorder._writes",
                                       "msprobe.pytorch.recorder:_forget"]),
    ("  argument walk (leaves of inputs and outputs, all inside)", ["msprobe.pytorch.leaves:LeafBuilder.sequence",
                                                                     "msprobe.pytorch.leaves:LeafBuilder.mapping"]),
    ("tensor leaves, all (forward, backward, parameter gradients)", ["msprobe.pytorch.leaves:LeafBuilder.tensor_leaf"]),
    ("  statistics memo (get_at, put_at)", ["msprobe.pytorch.stats_memo:StatsMemo.get_at",
                                            "msprobe.pytorch.stats_memo:StatsMemo.put_at"]),
    ("  statistics: native pass (reduction; with md5 the fused reduction + CRC-32)", ["NATIVE.reduce_at", "msprobe.pytorch.stats:fused_stats_crc"]),
    ("  statistics: TensorStats from the reduction", ["msprobe.pytorch.leaves:native_stats"]),
    ("  leaf tuple", ["msprobe.pytorch.leaves:_stats_leaf"]),
    ("emit: Session.emit, log row append, Arrow batches", ["msprobe.pytorch.recorder:Recorder.emit"]),
    ("  Arrow batch building in this process (task tensor, MSPROBE_WRITER=inprocess)",
     ["store.log_writer:LogWriter._flush_locked"]),
    ("hand-over to the writer process (plain tuples; one pickle and pipe write per frame: 512 rows, "
     "stop(), step())", ["store.writer_client:WriterClient.append", "store.writer_client:WriterClient._send"]),
    ("backward taps at call time (tap_inputs, tap_outputs)", ["msprobe.pytorch.backward:BackwardTaps.tap_inputs",
                                                             "msprobe.pytorch.backward:BackwardTaps.tap_outputs"]),
    ("backward node hooks (all inside: gradient leaves, emit)", ["msprobe.pytorch.backward:_NodeHook.__call__",
                                                                  "msprobe.pytorch.backward:_LeafHook.__call__"]),
    ("parameter-gradient hooks", ["msprobe.pytorch.recorder:Recorder.parameter_grad"]),
    ("start()", ["msprobe.pytorch.debugger:PrecisionDebugger.start"]),
    ("stop()", ["msprobe.pytorch.debugger:PrecisionDebugger.stop"]),
    ("step()", ["msprobe.pytorch.debugger:PrecisionDebugger.step"]),
])


class Timers:
    """Inclusive thread-CPU time and call counts of wrapped functions, per group; only the
    group in :attr:`on` is timed (the others call straight through), and a call nested in
    another call of the same group is not counted again."""

    def __init__(self, clock):
        self.clock = clock
        self.on = None
        self.sec = collections.Counter()
        self.cnt = collections.Counter()
        self._depth = collections.Counter()

    def wrap(self, owner, attr, group):
        f = getattr(owner, attr)
        clock, sec, cnt, depth = self.clock, self.sec, self.cnt, self._depth
        timers = self

        def w(*a, **k):
            if timers.on != group or depth[group]:
                return f(*a, **k)
            depth[group] = 1
            t0 = clock()
            try:
                return f(*a, **k)
            finally:
                sec[group] += clock() - t0
                cnt[group] += 1
                depth[group] = 0
        w.__wrapped__ = f
        setattr(owner, attr, w)

    def wrap_target(self, target, group):
        import importlib
        if target.startswith("NATIVE."):
            from msprobe.pytorch import leaves
            self.wrap(leaves.NATIVE, target.split(".", 1)[1], group)
            return
        mod, _, qualname = target.partition(":")
        module = importlib.import_module(mod)
        parts = qualname.split(".")
        owner = module if len(parts) == 1 else getattr(module, parts[0])
        self.wrap(owner, parts[-1], group)


def calibrate(timers, clock, n=20000):
    """Seconds one timed call adds (the wrapper and two clock reads)."""
    class Box:
        def f(self):
            return None
    timers.wrap(Box, "f", "_calibrate")
    b = Box()
    timers.on = None
    t = clock()
    for _ in range(n):
        b.f()
    off = clock() - t
    timers.on = "_calibrate"
    t = clock()
    for _ in range(n):
        b.f()
    on = clock() - t
    timers.on = None
    return max(0.0, (on - off) / n)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="dispatch", choices=["encoder", "dispatch"])
    p.add_argument("--config", default="l1_stats")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)

    import torch._dynamo  # noqa: F401  (as overhead.py does)
    import torch
    torch.set_num_threads(args.threads)
    from workloads import build_encoder, config_json
    from msprobe.pytorch import PrecisionDebugger
    import tempfile, shutil
    model, train_step = build_encoder(args.layers, size=args.workload)
    scratch = tempfile.mkdtemp(prefix="host-cost-")
    try:
        cfg_path = os.path.join(scratch, "c.json")
        with open(cfg_path, "w") as f:
            json.dump(config_json(args.config, os.path.join(scratch, "dump")), f)
        clock = time.thread_time
        timers = Timers(clock)
        overhead = calibrate(timers, clock)
        for comp, targets in COMPONENTS.items():
            for target in targets:
                timers.wrap_target(target, comp)
        dbg = PrecisionDebugger(config_path=cfg_path)


        def recorded():
            t = clock()
            dbg.start(model)
            train_step()
            dbg.stop()
            dbg.step()
            return clock() - t

        def plain():
            t = clock()
            train_step()
            return clock() - t

        # the untimed difference first: plain and recorded steps alternating
        plain(), recorded()
        base, rec = [], []
        for _ in range(args.steps):
            base.append(plain())
            rec.append(recorded())
        diff = statistics.median(rec) - statistics.median(base)

        dbg.wait_files()  # the writer process writes the step files after step() returns
        last = max(int(d[4:]) for d in os.listdir(os.path.join(scratch, "dump")) if d.startswith("step"))
        with open(os.path.join(scratch, "dump", "step%d" % last, "rank", "dump.json")) as f:
            data = json.load(f)["data"]
        from overhead import count_tensors
        entries, tensors = len(data), count_tensors(data)
        print("%s, %s, %d layers, torch threads %d: plain %.2f ms, recorded %.2f ms (CPU time, medians of %d "
              "alternating steps), recorded - plain %.2f ms; %d entries, %d tensor records per step" % (
                  args.workload, args.config, args.layers, args.threads, statistics.median(base) * 1e3,
                  statistics.median(rec) * 1e3, args.steps, diff * 1e3, entries, tensors))
        print("recorder host time: %.1f µs per entry, %.1f µs per tensor record" % (
            diff * 1e6 / entries, diff * 1e6 / tensors))
        print()
        print("| component | calls per step | ms per step | µs per entry | µs per tensor |")
        print("|---|---|---|---|---|")
        for comp in COMPONENTS:
            timers.on = comp
            recorded()
            timers.sec.clear()
            timers.cnt.clear()
            for _ in range(args.steps):
                recorded()
            timers.on = None
            calls = timers.cnt[comp] / args.steps
            ms = max(0.0, timers.sec[comp] / args.steps - calls * overhead)
            print("| %s | %.0f | %.2f | %.1f | %.1f |" % (comp, calls, ms * 1e3, ms * 1e6 / entries,
                                                        ms * 1e6 / tensors))
        print("(inclusive times, less %.2f µs of timer cost per timed call; indented rows are parts of the "
              "row above them)" % (overhead * 1e6))
        dbg.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
