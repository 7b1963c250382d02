"""What one CPU-specific acceleration saves per recorded step: the piece on vs off, interleaved.

Usage::

    python benchmarks/acceleration_ab.py --piece record_text_c --workload dispatch \
        --config l1_stats --steps 40 --processes 3

Pieces (each "off" is the plain code the piece replaces):

* ``record_text_c``: dump.json text by the C encoder ``store._record_text`` (off: the Python
  encoder of ``store.record_text``). Toggled per step in one process.
* ``direct_io``: payload and tensor files written with ``O_DIRECT`` by
  ``store.direct_io.DirectFileWriter`` (off: ``store.direct_io.write_buffered``, ordinary
  buffered writes). Toggled per step in one process.
* ``bg_fsync``: the step-end fsync of the log on ``store.bg_fsync``'s helper thread (off: the
  fsync in ``step()`` itself). Toggled per step in one process.
* ``step_columns``: the live export reads the Python columns the log writer built its
  batches from (``store.step_rows``; off: the writer keeps only the batches and the live
  export reads the step's Arrow rows, as ``msprobe export`` does). Toggled per step.
* ``arrow_pool``: ``msprobe.core.arrow_pool`` makes the system allocator Arrow's pool (off:
  pyarrow's default pool). Toggled per process (the pool is chosen once per process).

Per-step pieces run the steps of each process in the order on, off, off, on, ... (ABBA); a
per-process piece alternates the processes. Every step times ``start(model)``, the training
step, ``stop()`` and ``step()``, as ``benchmarks/overhead.py`` does. Prints the medians of
the on and off steps, their difference (ms saved per step by the piece) and that difference as
a share of the recorded step with the piece on, with the spread over processes.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PER_STEP = ("record_text_c", "direct_io", "bg_fsync", "step_columns")
PER_PROCESS = ("arrow_pool",)


def _toggles(piece):
    """A function ``set(on)`` switching ``piece`` on or off in this process."""
    if piece == "record_text_c":
        import store.record_text as rt

        native = rt._native
        if native is None:
            raise SystemExit("store._record_text is not built (python setup.py build_ext --inplace)")

        def set_on(on):
            rt._native = native if on else None
        return set_on
    if piece == "direct_io":
        import store.direct_io as dio

        write = dio.DirectFileWriter.write
        state = {"on": True}

        def patched(self, path, pieces):
            if state["on"]:
                return write(self, path, pieces)
            return dio.write_buffered(path, pieces)
        dio.DirectFileWriter.write = patched

        def set_on(on):
            state["on"] = on
        return set_on
    if piece == "bg_fsync":
        import store.log_writer as lw

        flush = lw.LogWriter.flush
        state = {"on": True}

        def patched(self, fsync=False, *, background=False):
            return flush(self, fsync, background=background and state["on"])
        lw.LogWriter.flush = patched

        def set_on(on):
            state["on"] = on
        return set_on
    if piece == "step_columns":
        import store.log_writer as lw
        import store.step_rows as sr

        make_part, take = lw.make_part, lw.LogWriter.take_step_rows
        state = {"on": True}

        def part(batch, nc, nl, ns, calls, leaves, steps=None):
            if state["on"]:
                return make_part(batch, nc, nl, ns, calls, leaves, steps)
            return sr.Part(batch, nc, nl, ns, None, None, steps)

        def take_rows(self, step=None, *, fsync=False):
            rows = take(self, step, fsync=fsync)
            return rows if state["on"] else rows.table()
        lw.make_part, lw.LogWriter.take_step_rows = part, take_rows

        def set_on(on):
            state["on"] = on
        return set_on
    raise SystemExit("unknown per-step piece %r" % piece)


def child(args):
    """Run the workload in this process; print one JSON line."""
    sys.path.insert(0, HERE)
    if args.piece == "arrow_pool" and not args.on:
        import msprobe.core.arrow_pool as pool

        pool.prefer_system_pool = lambda: False  # pyarrow keeps its default pool
    import torch
    import workloads

    torch.set_num_threads(args.threads)
    model, train_step = workloads.build_encoder(args.layers, size=args.workload)
    from msprobe.pytorch import PrecisionDebugger

    cfg = workloads.config_json(args.config, os.path.join(args.scratch, "dump"))
    config_path = os.path.join(args.scratch, "config.json")
    with open(config_path, "w") as f:
        json.dump(cfg, f)
    dbg = PrecisionDebugger(config_path=config_path, dump_path=cfg["dump_path"])
    set_on = _toggles(args.piece) if args.piece in PER_STEP else (lambda on: None)

    def one_step(on):
        set_on(on)
        t0 = time.perf_counter()
        dbg.start(model)
        train_step()
        dbg.stop()
        dbg.step()
        return time.perf_counter() - t0

    one_step(True)
    one_step(False)  # warm-up of both paths
    on, off = [], []
    for i in range(args.steps):
        state = (i % 4) in (0, 3) if args.piece in PER_STEP else args.on
        (on if state else off).append(one_step(state))
    import pyarrow

    print(json.dumps({"on": on, "off": off, "pool": pyarrow.default_memory_pool().backend_name,
                      "maxrss_kib": __import__("resource").getrusage(0).ru_maxrss}))


def run(args):
    results = []
    order = []
    for p in range(args.processes):
        if args.piece in PER_PROCESS:
            order += [True, False] if p % 2 == 0 else [False, True]
        else:
            order.append(True)
    for on in order:
        with tempfile.TemporaryDirectory(prefix="ab-", dir=args.scratch_root) as scratch:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--piece", args.piece,
                   "--workload", args.workload, "--config", args.config, "--steps", str(args.steps),
                   "--layers", str(args.layers), "--threads", str(args.threads), "--scratch", scratch]
            if on:
                cmd.append("--on")
            env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
            out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, check=True, timeout=args.timeout)
            res = json.loads(out.stdout.decode().strip().splitlines()[-1])
            res["process_on"] = on
            results.append(res)
    if args.piece in PER_PROCESS:
        on = [t for r in results if r["process_on"] for t in r["on"] + r["off"]]
        off = [t for r in results if not r["process_on"] for t in r["on"] + r["off"]]
        per = []
        ons = [r for r in results if r["process_on"]]
        offs = [r for r in results if not r["process_on"]]
        for a, b in zip(ons, offs):
            per.append(statistics.median(b["on"] + b["off"]) - statistics.median(a["on"] + a["off"]))
        rss = {"on": [r["maxrss_kib"] for r in ons], "off": [r["maxrss_kib"] for r in offs],
               "pools": sorted({r["pool"] for r in results})}
    else:
        on = [t for r in results for t in r["on"]]
        off = [t for r in results for t in r["off"]]
        per = [statistics.median(r["off"]) - statistics.median(r["on"]) for r in results]
        rss = None
    med_on, med_off = statistics.median(on), statistics.median(off)
    saved = med_off - med_on
    summary = {
        "piece": args.piece, "workload": args.workload, "config": args.config,
        "steps_on": len(on), "steps_off": len(off), "processes": len(results),
        "median_on_ms": round(med_on * 1e3, 2), "median_off_ms": round(med_off * 1e3, 2),
        "saved_ms": round(saved * 1e3, 2), "saved_pct": round(100 * saved / med_on, 1),
        "saved_ms_per_process": [round(x * 1e3, 2) for x in per],
    }
    if rss:
        summary["maxrss_kib"] = rss
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(summary) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--piece", required=True, choices=PER_STEP + PER_PROCESS)
    p.add_argument("--workload", default="dispatch", choices=("encoder", "dispatch"))
    p.add_argument("--config", default="l1_stats")
    p.add_argument("--steps", type=int, default=40, help="timed steps per process")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--processes", type=int, default=3,
                   help="processes (per-process pieces: pairs of processes, on and off)")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--scratch-root", default=None, help="directory for the dumps (default: system temp)")
    p.add_argument("--json", help="append the summary line to this file")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--on", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--scratch", help=argparse.SUPPRESS)
    args = p.parse_args()
    child(args) if args.child else run(args)


if __name__ == "__main__":
    main()
