"""In-process A/B of the live export's entry building and dump.json encoding.

Usage::

    .venv/bin/python benchmarks/ab_export.py OLD_CHECKOUT NEW_CHECKOUT [--config mix_stats]
        [--rounds 40]

Records 3 steps of the encoder workload (4 layers, one thread) with this checkout and keeps
the row batches the last step's live exporter received (``StepExporter.add``). Then loads
``store`` from each checkout (two module sets in one process) and, alternating the order
every round, replays the step as the live exporter does it: ``EntryBuilder.add`` of the
first batch, ``_dump_text`` (all entries), ``add`` of the rest, ``_dump_text`` (touched
entries re-encoded), each builder made from the previous round's (its caches), as at a
step boundary. Prints min and median ms of ``add`` and ``_dump_text`` (sums over the
step) per checkout and the ratios; fails if the two dump texts differ.
"""
import argparse
import atexit
import importlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def capture(config):
    """The row tables of the third recorded step's StepExporter.add calls."""
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(HERE, "benchmarks"))
    import torch

    torch.set_num_threads(1)
    from workloads import build_encoder, config_json
    from msprobe.pytorch import PrecisionDebugger
    from store import export

    saved = []
    original = export.StepExporter.add

    def add(self, table):
        saved.append(table)
        return original(self, table)

    export.StepExporter.add = add
    model, train_step = build_encoder(4)
    scratch = tempfile.mkdtemp()
    atexit.register(shutil.rmtree, scratch, True)  # the dumps, at exit
    path = os.path.join(scratch, "config.json")
    with open(path, "w") as handle:
        json.dump(config_json(config, os.path.join(scratch, "dump")), handle)
    debugger = PrecisionDebugger(config_path=path)
    for _ in range(3):
        saved.clear()
        debugger.start(model)
        train_step()
        debugger.stop()
        debugger.step()
    export.StepExporter.add = original
    return [table for table in saved if table.num_rows]


def load_store(root):
    """``(store.entries, store.export)`` imported from ``root`` (a fresh module set)."""
    for name in [m for m in sys.modules if m == "store" or m.startswith("store.")]:
        del sys.modules[name]
    sys.path.insert(0, root)
    try:
        return importlib.import_module("store.entries"), importlib.import_module("store.export")
    finally:
        sys.path.remove(root)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--config", default="mix_stats")
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    tables = capture(args.config)
    level = "L1" if args.config.startswith("l1") else "mix"
    meta = {"task": "statistics", "level": level, "framework": "pytorch", "dump_data_dir": None,
            "rank_dir": "rank"}
    impls = [(root, *load_store(os.path.abspath(root))) for root in (args.old, args.new)]
    times = {root: ([], []) for root, _, _ in impls}
    previous = {root: None for root, _, _ in impls}
    texts = {}
    for round_ in range(args.rounds):
        for root, entries, export in (impls if round_ % 2 == 0 else impls[::-1]):
            builder = entries.EntryBuilder(previous[root])
            previous[root] = builder
            chunks = {}
            add_s = dump_s = 0.0
            for table in tables:
                t0 = time.perf_counter()
                touched = builder.add(table)
                t1 = time.perf_counter()
                for name in touched:
                    chunks.pop(name, None)
                t2 = time.perf_counter()
                text = export._dump_text(meta, level, builder.order(), builder.entries, chunks)
                t3 = time.perf_counter()
                add_s += t1 - t0
                dump_s += t3 - t2
            texts[root] = text
            times[root][0].append(add_s * 1e3)
            times[root][1].append(dump_s * 1e3)
    if len(set(texts.values())) != 1:
        raise SystemExit("the two checkouts wrote different dump.json texts")
    print(f"{args.config}: {len(tables)} row batches, {sum(t.num_rows for t in tables)} rows, "
          f"{args.rounds} rounds; ms per step, min / median")
    sums = {}
    for root, (adds, dumps) in times.items():
        both = [a + d for a, d in zip(adds, dumps)]
        sums[root] = both
        print(f"  {root}: add {min(adds):.2f} / {statistics.median(adds):.2f}, _dump_text "
              f"{min(dumps):.2f} / {statistics.median(dumps):.2f}, both {min(both):.2f} / "
              f"{statistics.median(both):.2f}")
    old, new = (sums[root] for root, _, _ in impls)
    pairs = [b / a for a, b in zip(old, new)]
    print(f"  new/old: ratio of minima {min(new) / min(old):.3f}, of medians "
          f"{statistics.median(new) / statistics.median(old):.3f}, per-round median {statistics.median(pairs):.3f}")


if __name__ == "__main__":
    main()
