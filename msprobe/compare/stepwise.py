"""``msprobe compare`` of two of our stores, one step at a time.

Each (rank, step) is aligned and judged on its own (:mod:`msprobe.compare.align`,
:mod:`msprobe.compare.verdicts`; collectives are attributed among the ranks of one step),
so a comparison of many steps can load one step of both sides at a time: per step, the
call and leaf rows of that step (the parts' row groups of that step plus the log tail's
rows, :func:`msprobe.compare.load.load_log_steps`) go through the same pipeline as a
comparison of every step at once (:func:`msprobe.compare.engine.measure`, on one DuckDB
connection kept for every step), the step's ``tensors``, ``calls`` and ``alignment`` are
appended to the output files (:class:`msprobe.compare.outputs.TableSink`), and only small
aggregates are kept for ``summary.json`` (:class:`msprobe.compare.engine.Tally`: counts per
rank and verdict, each rank's first origin and first diverged call). Memory: one group of
steps of both sides (:data:`GROUP_ROWS`), its results, the sides' stacks and the log tail
not yet compacted (the whole log, memory-mapped, when ``msprobe compact`` never ran).

Consecutive steps are taken together while they hold at most :data:`GROUP_ROWS` rows (a
larger step alone): small steps then cost no more than at once (each pass has a fixed cost
in DuckDB), and memory stays bounded by that budget or by the largest step.

The results equal those of the comparison of every step at once (the same rows, summary,
notes and exit status). One thing differs: the rows of the output tables come group of
steps by group of steps, each group in the whole-run order (rank, step, ord); with one step
per group that is (step, rank, ord) instead of (rank, step, ord). Within one (rank, step)
the rows and their order are the same.

Used when both sides are our dump paths (an ``.msprobe`` log or compacted parts) holding two
steps or more; the comparison of every step at once is kept for: upstream ``dump.json``
layouts and MindSpore kernel dumps (their importers read whole files), ``--mapping`` and
sides of different frameworks (a mapping's renames and unmatched names are worked out over
every step), ``--rank-map``, and ``--first-only`` (its cut needs each rank's first origin
before anything is written). Mode ``auto`` is decided on the first group of steps both
sides hold (the whole-run comparison decides it on every step at once; the two differ only
for runs whose steps were recorded with different tasks or summary modes).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Optional, Union

import duckdb

from msprobe.compare.engine import (CompareResult, Tally, _choose_mode, _common_kinds, _finish, measure,
                                    one_side_text, register_sides, side_notices)
from msprobe.compare.errors import CompareInputError
from msprobe.compare.options import CompareOptions
from store import schema as S

__all__ = ["GROUP_ROWS", "plan", "run_stepwise"]

#: consecutive steps are compared together while their rows (call rows and tensor leaves
#: of both sides, as the compaction's summary and the log tail count them) stay within
#: this many; a step larger than that alone. About 1 KB of memory per row at the peak.
GROUP_ROWS = 400_000


class _Plan:
    """Both sides' readers, stacks and meta, and the groups of steps to compare; ``groups``
    None: compare every step at once, with these ``readers`` (not read again)."""

    def __init__(self, readers, stacks=None, metas=None, groups=None) -> None:
        self.readers, self.stacks, self.metas, self.groups = readers, stacks, metas, groups
        self.tails = [None, None]


def _step_rows(reader) -> dict:
    """``{step: rows}`` of a :class:`store.select.StoreReader`'s selection: its call rows
    and tensor leaves, in the parts (from the compaction's summary; no part is read) and in
    the tail."""
    import numpy as np
    import pyarrow.parquet as pq

    from store.manifest import SUMMARY_NAME

    rows: dict = {}
    summary = reader.directory / SUMMARY_NAME
    if reader.manifest.parts and summary.exists():
        table = pq.read_table(summary, columns=[S.RANK, S.STEP, "call_rows", "tensors"])
        keep = np.ones(table.num_rows, bool) if reader.ranks is None else \
            np.isin(table[S.RANK].to_numpy(), list(reader.ranks))
        counts = table["call_rows"].to_numpy()[keep] + table["tensors"].to_numpy()[keep]
        for step, n in zip(table[S.STEP].to_numpy()[keep].tolist(), counts.tolist()):
            rows[step] = rows.get(step, 0) + n
    if reader.tail.num_rows:
        row = reader.tail[S.ROW].to_numpy(zero_copy_only=False)
        kind = reader.tail[S.LEAF_KIND].to_numpy(zero_copy_only=False)
        data = (row == S.ROW_CALL) | ((row == S.ROW_LEAF) & (kind == S.LEAF_TENSOR))
        steps, counts = np.unique(reader.tail[S.STEP].to_numpy()[data], return_counts=True)
        for step, n in zip(steps.tolist(), counts.tolist()):
            rows[step] = rows.get(step, 0) + n
    return rows


def _groups(steps: list, rows: dict, budget: int) -> list:
    """``steps`` (sorted) cut into runs of consecutive steps whose ``rows`` add up to at
    most ``budget`` (a step over it alone)."""
    groups: list = []
    total = 0
    for step in steps:
        n = rows.get(step, 0)
        if groups and total + n <= budget:
            groups[-1].append(step)
            total += n
        else:
            groups.append([step])
            total = n
    return groups


def _ours(path: Path) -> bool:
    return path.is_dir() and ((path / S.STORE_DIR / S.LOG_DIR).is_dir() or (path / S.STORE_DIR / "parquet").is_dir())


def plan(target: Union[str, os.PathLike], baseline: Union[str, os.PathLike], opts: CompareOptions) -> Optional[_Plan]:
    """The plan of a comparison one step at a time; None where it is compared whole
    without opening the sides here (a side not our store, an unreadable store,
    ``--mapping``, ``--rank-map``, ``--first-only``), or a plan without ``groups`` whose
    ``readers`` the whole-run comparison reuses (frameworks that differ, fewer than two
    steps, a side without calls in the selection; it then reports what is wrong). Reads
    each side's log tail once, and its stacks and markers."""
    from store.errors import LogNotFoundError
    from store.manifest import ManifestError
    from store.select import StoreReader

    from msprobe.compare.load import TailSteps, log_meta, log_stacks

    if opts.mapping is not None or opts.rank_map or opts.first_only:
        return None
    paths = (Path(target), Path(baseline))
    if not all(_ours(p) for p in paths):
        return None
    try:
        readers = [StoreReader(p, ranks=opts.ranks, steps=opts.steps) for p in paths]
    except (LogNotFoundError, ManifestError):
        return None
    metas = [log_meta(r) for r in readers]
    frameworks = [m.get("framework") for m in metas]
    if frameworks[0] and frameworks[1] and frameworks[0] != frameworks[1]:
        return _Plan(readers)
    per_side = [set(r.step_values()) for r in readers]
    steps = sorted(per_side[0] | per_side[1])
    if len(steps) < 2 or not per_side[0] or not per_side[1]:
        return _Plan(readers)
    rows: dict = {}
    for reader in readers:
        for step, n in _step_rows(reader).items():
            rows[step] = rows.get(step, 0) + n
    out = _Plan(readers, [log_stacks(r) for r in readers], metas, _groups(steps, rows, GROUP_ROWS))
    out.tails = [TailSteps(r) if r.tail.num_rows else None for r in readers]
    return out


def _run_notices(plan_: _Plan, opts: CompareOptions, incomplete: list, log_skipped: list, notices: list) -> dict:
    """What the sides' readers say about the whole selection (skipped log parts, ranks
    without a readable log, unfinished and unverified files), in the words of the
    whole-run comparison; returns ``{side: [unverified paths]}``."""
    unverified = {}
    for label, reader in zip(("TARGET", "BASELINE"), plan_.readers):
        from store.log_reader import expected_ranks

        expected = expected_ranks(reader.markers())
        missing = tuple(sorted(r for r in expected - set(reader.rank_values())
                               if opts.ranks is None or r in opts.ranks))
        side_notices(label, tuple(reader.skipped), tuple(reader.unverified), missing, tuple(reader.unfinished),
                     opts, incomplete, log_skipped, notices)
        if reader.unverified:
            unverified[label] = list(reader.unverified)
    return unverified


def _merge_notes(notes: list, step_notes: list, skipped: dict, step_skipped: dict, at: list) -> None:
    """Add one step's notes to the run's: each line once, except the lines counting
    skipped leaves, whose counts are summed into ``skipped`` (their place in ``notes`` is
    kept in ``at[0]``; :func:`_skip_notes` writes them at the end)."""
    from msprobe.compare.producers import skip_notes

    own = set(skip_notes(step_skipped))
    for line in step_notes:
        if line in own:
            if at[0] is None:
                at[0] = len(notes)
        elif line not in notes:
            notes.append(line)
    for reason, counts in step_skipped.items():
        total = skipped.setdefault(reason, {"TARGET": 0, "BASELINE": 0, "why": counts["why"]})
        total["TARGET"] += counts["TARGET"]
        total["BASELINE"] += counts["BASELINE"]


def run_stepwise(plan_: _Plan, opts: CompareOptions, out=None, progress=None,
                 keep_tables: bool = True) -> CompareResult:
    """Compare the steps of ``plan_`` one at a time (module docstring), appending the
    tables to a :class:`msprobe.compare.outputs.TableSink` for ``out`` (None: a temporary
    directory backing the result's views; with ``keep_tables`` False, nowhere). Returns the :class:`CompareResult` whose
    ``con`` holds views ``tensors``, ``calls``, ``alignment`` over the Parquet files and
    table ``t_stacks``; :func:`msprobe.compare.outputs.write_outputs` moves the files
    into place.

    Raises:
        CompareInputError: no (rank, step) on both sides, or a mode that one step does not
            support (as the whole-run comparison).
    """
    from concurrent.futures import ThreadPoolExecutor

    from msprobe.compare.load import load_log_steps
    from msprobe.compare.outputs import TableSink
    from msprobe.compare.producers import noise_profiles, reconcile, skip_notes

    notes: list[str] = []
    incomplete: list[str] = []
    log_skipped: list[dict] = []
    notices: list[str] = []
    timings: dict[str, float] = {}
    stats: dict[str, int] = {}
    skipped: dict = {}
    skip_at = [None]
    unverified = _run_notices(plan_, opts, incomplete, log_skipped, notices)
    t_keys: set = set()
    b_keys: set = set()
    mode: Optional[str] = None
    tally: Optional[Tally] = None
    producers = {"TARGET": None, "BASELINE": None}
    clock = [time.perf_counter()]

    def lap(stage: str) -> None:
        now = time.perf_counter()
        timings[stage] = round(timings.get(stage, 0.0) + now - clock[0], 3)
        clock[0] = now

    sink = TableSink(out, opts, keep=keep_tables)
    con = duckdb.connect(":memory:")
    try:
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="msprobe-compare-load") as pool:
            for steps in plan_.groups:
                # the two sides' steps load in parallel (Arrow and DuckDB release the GIL)
                t, b = (f.result() for f in [pool.submit(load_log_steps, reader, steps, stacks, meta, tail)
                                             for reader, stacks, meta, tail in zip(plan_.readers, plan_.stacks,
                                                                                   plan_.metas, plan_.tails)])
                producers = {"TARGET": t.producer, "BASELINE": b.producer}
                step_notes: list[str] = []
                if t.calls.num_rows == 0 or b.calls.num_rows == 0:
                    for side, keys in ((t, t_keys), (b, b_keys)):
                        keys |= set(zip(side.calls["rank"].to_pylist(), side.calls["step"].to_pylist()))
                    lap("load")
                    continue
                if t.level and b.level and t.level != b.level:
                    _common_kinds(t, b, step_notes)
                step_skipped = reconcile(t, b, step_notes)
                noise = noise_profiles(t.producer, b.producer)
                if mode is None:
                    mode = _choose_mode(opts, t, b, step_notes)
                    tally = Tally(mode)
                _merge_notes(notes, step_notes, skipped, step_skipped, skip_at)
                lap("load")
                keys = register_sides(con, t, b)
                t_keys |= keys[0]
                b_keys |= keys[1]
                common = sorted(keys[0] & keys[1])
                lap("tables")
                if common:
                    step_stats: dict = {}
                    tensors = measure(con, t, b, common, mode, opts, step_stats, noise=noise, lap=lap)
                    for key, n in step_stats.items():
                        stats[key] = stats.get(key, 0) + n
                    tally.add(con, {})
                    sink.append("tensors", tensors)
                    del tensors
                    for name in ("calls", "alignment"):
                        rel = con.table(name)
                        sink.append(name, rel.to_arrow_table())
                        con.execute(f"DROP TABLE {name}")
                    con.unregister("tensors")
                    lap("write")
                for name in ("t_calls", "b_calls", "b_stacks") + (() if common else ("t_leaves", "b_leaves")):
                    con.unregister(name)
                del t, b
                if progress is not None:
                    progress(f"steps {steps[0]}-{steps[-1]}" if len(steps) > 1 else f"step {steps[0]}")
        sink.close()
        if tally is None or not (t_keys & b_keys):
            raise CompareInputError(f"no common (rank, step): TARGET has {sorted(t_keys)}, "
                                    f"BASELINE has {sorted(b_keys)}")
        if skip_at[0] is not None:
            notes[skip_at[0]:skip_at[0]] = skip_notes(skipped)
        for label, only in (("TARGET", t_keys - b_keys), ("BASELINE", b_keys - t_keys)):
            if only:
                notes.append(one_side_text(label, only))
                incomplete.append(one_side_text(label, only, missing=True))
        sink.views(con)
        summary = tally.summary(sorted(t_keys & b_keys), notes, opts)
        _finish(summary, tally, incomplete, producers, skipped, log_skipped, unverified)
        lap("summary")
        if progress is not None:
            progress("summary")
    except BaseException:
        sink.discard()
        con.close()
        raise
    return CompareResult(summary=summary, con=con, notes=notes, timings=timings, stats=stats, notices=notices,
                         sink=sink)
