"""How the store's readers scale with the size of a run: wall time, CPU time and peak RSS
per command at N ranks x S steps.

1. Records one real step of a small model (``benchmarks/workloads.py``, the encoder,
   level mix, summary_mode md5) in a child process.
2. Replays that step's entries through the project's own :class:`store.log_writer.LogWriter`
   (one log file per rank, as a distributed run writes them) for every rank and step of
   each size: the same entries, ``step`` and ranks changed, statistics scaled a little per
   step; one tensor of rank N/2 at step S/2 holds NaN (for the first-NaN queries).
3. Runs each command in a fresh interpreter (``python -m msprobe.cli ...`` wrapped so that
   the child reports its own peak RSS and CPU time; wall time is the whole child's,
   interpreter start included) and prints one table row per command:
   ``compact``, point/aggregate/first-NaN queries (over the parts and with ``--rank/--step``),
   ``check-ranks``, ``export --step``, ``compare --step``, ``report``, and ``compare`` of
   every step (summary only, and with its Parquet tables).

Usage::

    python benchmarks/store_scale.py --sizes 16x10,64x20,256x20 [--layers 4] [--out DIR] [--keep]
        [--skip report,compare] [--only compact,compare] [--roots main=/path/to/main,this=.] [--repeat 3]

``--roots`` runs every command with each msprobe source tree in turn (same dump, same
load; the rows are labelled by name), ``--repeat`` runs each command that many times.

Each size's dump is deleted after its commands ran (``--keep`` keeps them). Disk: about
the log (``size`` column) plus its Parquet copy (~1/8 of it) per size.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from store import schema as S  # noqa: E402
from store.log_reader import read_log  # noqa: E402
from store.log_writer import LogWriter  # noqa: E402
from store.records import Call, Marker, Stack, make_leaf, LEAF_FIELDS  # noqa: E402

# the child: runs msprobe's CLI in-process, then prints its own peak RSS and CPU time
_CHILD = """
import json, resource, sys, time
from msprobe.cli import main
t = time.perf_counter()
rc = main(sys.argv[1:])
wall = time.perf_counter() - t
u = resource.getrusage(resource.RUSAGE_SELF)
sys.stdout.flush()
print("@@" + json.dumps({"rc": rc, "wall": wall, "cpu": u.ru_utime + u.ru_stime, "rss_kib": u.ru_maxrss}),
      file=sys.stderr)
"""


def record_template(work: Path, layers: int) -> Path:
    """One recorded step of the encoder (mix, md5) under ``work/rec``; returns the dump path."""
    dump = work / "rec"
    shutil.rmtree(dump, ignore_errors=True)      # a second run's log beside the first would double the template
    cmd = [sys.executable, str(ROOT / "benchmarks" / "workloads.py"), "--workload", "encoder", "--layers",
           str(layers), "--config", "mix_md5", "--steps", "1", "--dump-path", str(dump),
           "--config-path", str(work / "config.json"), "--result", str(work / "result.json")]
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)
    return dump


def template_step(dump: Path):
    """(calls of step 0 as (Call fields, leaf tuples), stacks, meta) of the recording."""
    contents = read_log(dump)
    rows = contents.table.filter(contents.table[S.STEP].to_numpy() == 0).sort_by([(S.SEQ, "ascending")])
    meta = None
    calls: dict[int, dict] = {}
    order: list[int] = []
    for r in rows.to_pylist():
        if r[S.ROW] == S.ROW_MARKER and meta is None and r[S.META]:
            meta = json.loads(r[S.META])
        elif r[S.ROW] == S.ROW_CALL:
            calls[r[S.SEQ]] = dict(kind=r[S.KIND], name=r[S.NAME], api_type=r[S.API_TYPE], parent=r[S.PARENT],
                                   stack_id=r[S.STACK_ID], is_recompute=r[S.IS_RECOMPUTE],
                                   keys=tuple(json.loads(r[S.KEYS] or "[]")), leaves=[])
            order.append(r[S.SEQ])
        elif r[S.ROW] == S.ROW_LEAF and r[S.SEQ] in calls:
            values = dict(r)
            values["path"] = tuple(json.loads(r[S.PATH] or "[]"))
            values["shape"] = tuple(r[S.SHAPE]) if r[S.SHAPE] is not None else None
            calls[r[S.SEQ]]["leaves"].append(values)
    return [calls[s] for s in order], contents.stacks, meta or {}


def write_run(dump: Path, ranks: int, steps: int, template) -> None:
    """The template step replayed for ``ranks`` x ``steps`` through LogWriter."""
    calls, stacks, meta = template
    nan_at = (ranks // 2, steps // 2)
    for rank in range(ranks):
        rank_meta = {**meta, "rank_dir": f"rank{rank}", "world_size": ranks}
        with LogWriter(dump, rank, flush_rows=4096, flush_interval_s=3600) as writer:
            writer.append_marker(Marker(step=0, kind=S.MARKER_START, meta=rank_meta))
            for sid, frames in stacks.items():
                writer.append_stack(Stack(stack_id=sid, frames=frames))
            for step in range(steps):
                scale = 1.0 + 1e-3 * step
                for i, call in enumerate(calls):
                    leaves = []
                    for values in call["leaves"]:
                        v = dict(values)
                        for c in (S.MAX, S.MIN, S.MEAN, S.NORM, S.MAX_FINITE, S.MIN_FINITE):
                            if isinstance(v[c], float):
                                v[c] = v[c] * scale
                        if (rank, step) == nan_at and i == len(calls) // 2 and v[S.LEAF_KIND] == S.LEAF_TENSOR:
                            v[S.NORM], v[S.HAS_NAN] = math.nan, True
                        leaves.append(make_leaf(tuple(v[f] for f in LEAF_FIELDS)))
                    writer.append(Call(step=step, kind=call["kind"], name=call["name"], api_type=call["api_type"],
                                       parent=call["parent"], stack_id=call["stack_id"],
                                       is_recompute=call["is_recompute"], keys=call["keys"], leaves=tuple(leaves)))
                writer.append_marker(Marker(step=step, kind=S.MARKER_STEP_END, meta=rank_meta))


def run(args: list[str], root: Path = ROOT) -> dict:
    """One CLI command in a fresh interpreter running msprobe from the source tree ``root``:
    rc, wall/cpu seconds, peak RSS (KiB)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    t = time.perf_counter()
    # cwd=root: ``python -c`` puts the working directory first on sys.path
    proc = subprocess.run([sys.executable, "-c", _CHILD, *args], env=env, capture_output=True, text=True,
                          cwd=str(root))
    elapsed = time.perf_counter() - t
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("@@")]
    if not lines:
        raise RuntimeError(f"{args}: no result (exit {proc.returncode}): {proc.stderr[-2000:]}")
    result = json.loads(lines[-1][2:])
    result["wall"] = elapsed          # the whole child, interpreter start and imports included
    result["out"] = proc.stdout
    return result


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def commands(dump: Path, ranks: int, steps: int, work: Path, skip: set) -> list[tuple[str, list[str]]]:
    mid_rank, mid_step = ranks // 2, steps // 2
    point = (f"SELECT name, io, arg, max, norm FROM tensors WHERE rank = {mid_rank} AND step = {mid_step} "
             f"AND name LIKE 'Module.%' ORDER BY seq LIMIT 5")
    out = [
        ("compact", ["compact", str(dump)]),
        ("query point", ["query", str(dump), point]),
        ("query point --rank --step", ["query", str(dump), point, "--rank", str(mid_rank), "--step", str(mid_step)]),
        ("query aggregate", ["query", str(dump), "SELECT step, count(*), max(norm) FILTER (WHERE isfinite(norm)) "
                                                 "FROM tensors GROUP BY step ORDER BY step"]),
        ("query first NaN (tensors)", ["query", str(dump), "SELECT rank, arg_min(name, seq) FROM tensors "
                                                           "WHERE has_nan GROUP BY rank"]),
        ("query first NaN (summary)", ["query", str(dump), "SELECT rank, arg_min(first_nan_name, step) "
                                                           "FROM summary WHERE nan_tensors > 0 GROUP BY rank"]),
        ("check-ranks", ["check-ranks", str(dump)]),
        ("export --step", ["export", str(dump), "-o", str(work / "export"), "--step", str(mid_step)]),
        ("compare --step", ["compare", str(dump), str(dump), "-o", str(work / "cmp"), "--step", str(mid_step),
                            "--format", "summary"]),
        ("report", ["report", str(dump), "-o", str(work / "report.html")]),
    ]
    # without --step: one step of both sides at a time (msprobe.compare.stepwise)
    out.append(("compare (all steps)", ["compare", str(dump), str(dump), "-o", str(work / "cmp"),
                                        "--format", "summary"]))
    out.append(("compare (all steps) --format parquet", ["compare", str(dump), str(dump), "-o", str(work / "cmp"),
                                                         "--format", "summary,parquet"]))
    return [(n, a) for n, a in out if n.split()[0] not in skip]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16x10,64x20,256x20", help="RANKSxSTEPS, comma separated")
    parser.add_argument("--layers", type=int, default=4, help="encoder layers of the recorded template step")
    parser.add_argument("--out", default=None, help="work directory (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep each size's dump")
    parser.add_argument("--skip", default="", help="commands to leave out, e.g. report,compare")
    parser.add_argument("--verbose", action="store_true", help="print each command's output")
    parser.add_argument("--only", default="",
                        help="run only these commands (first word or whole name), e.g. compact,compare")
    parser.add_argument("--roots", default="", help="NAME=DIR,...: msprobe source trees to run each command with "
                                                    "(default: this one)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each command (per source tree)")
    parser.add_argument("--uncompacted", action="store_true",
                        help="also run the queries before compaction (the whole log is read)")
    args = parser.parse_args()
    work = Path(args.out or tempfile.mkdtemp(prefix="msprobe-store-scale-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    roots = [(n, Path(d).resolve()) for n, d in (r.split("=", 1) for r in args.roots.split(",") if r.strip())] \
        or [("", ROOT)]
    template = template_step(record_template(work, args.layers))
    n_tensors = sum(1 for c in template[0] for v in c["leaves"] if v[S.LEAF_KIND] == S.LEAF_TENSOR)
    print(f"template step: {len(template[0])} entries, {n_tensors} tensors (encoder, {args.layers} layers, mix, md5)")
    print(f"{'rank-steps':>10} {'ranks x steps':>13} {'log':>9} {'command':<48} {'wall s':>7} {'cpu s':>7} "
          f"{'peak RSS':>9}  notes")
    for size in args.sizes.split(","):
        ranks, steps = (int(x) for x in size.lower().split("x"))
        dump = work / f"dump{ranks}x{steps}"
        shutil.rmtree(dump, ignore_errors=True)
        t = time.perf_counter()
        write_run(dump, ranks, steps, template)
        written = time.perf_counter() - t
        log_bytes = du(dump / S.STORE_DIR / S.LOG_DIR)
        head = f"{ranks * steps:>10} {f'{ranks}x{steps}':>13} {log_bytes / 2**20:>7.0f}MB"
        print(f"{head} {'(write log)':<48} {written:>7.1f}", flush=True)
        plan = commands(dump, ranks, steps, work, skip)
        if only:
            plan = [(n, a) for n, a in plan if n.split()[0] in only or n in only]
        if args.uncompacted:
            plan = [(f"{n} (log only)", a) for n, a in plan if n.startswith("query")] + plan
        runs = [(f"{name} [{label}]" if label else name, argv, root)
                for name, argv in plan for _ in range(args.repeat if name != "compact" else 1)
                for label, root in (roots if name != "compact" else roots[-1:])]
        for name, argv, root in runs:
            res = run(argv, root)
            note = ""
            if name.startswith("compact"):
                note = f"parquet {du(dump / S.STORE_DIR / 'parquet') / 2**20:.0f}MB"
            elif name.startswith("report") and (work / "report.html").exists():
                note = f"page {(work / 'report.html').stat().st_size / 2**20:.1f}MB"
            if res["rc"] not in (0, 1):
                note += f" exit {res['rc']}"
            if args.verbose:
                print(res["out"].rstrip()[-1500:])
            print(f"{head} {name:<48} {res['wall']:>7.1f} {res['cpu']:>7.1f} {res['rss_kib'] / 2**20:>7.2f}GB  {note}",
                  flush=True)
        for extra in ("export", "cmp"):
            shutil.rmtree(work / extra, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(dump, ignore_errors=True)
    if args.out is None and not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
