"""The comparison pipeline: load → align → leaf metrics → verdicts → first divergence.

Everything after loading runs in one DuckDB connection holding ``t_calls``, ``t_leaves``,
``t_stacks`` (target) and ``b_*`` (baseline); Python only runs the aligner per
(rank, step) and the call-verdict pass. See :func:`msprobe.compare.compare`.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from dataclasses import dataclass, field
from typing import Optional, Union

import duckdb
import pyarrow as pa

from msprobe.compare.align import align_all
from msprobe.compare.distributed import attribute_collectives
from msprobe.compare.errors import CompareInputError
from msprobe.compare.load import Side, load_side
from msprobe.compare.metrics import arrow_streamed, build_leaf_pairs, leaf_pairs_sql, prepare_leaves, rechunk
from msprobe.compare.options import CompareOptions
from msprobe.compare.verdicts import build_calls, leaf_verdicts_sql
from store import schema as S

__all__ = ["CompareResult", "run_compare"]

# APIs with a ``leaf`` mapping: their inputs differ by construction, so only outputs sign them,
# and without the leaves a map left out (``*.unmapped.*``: upstream api_mapping's "abandoned"
# positions), so they still align
_OUTPUTS_ONLY = (" AND NOT ((l.io LIKE 'input%' OR l.arg LIKE 'unmapped%') AND "
                 "regexp_replace(l.name, '\\.\\d+\\.(forward|backward)$', '') IN ({names}))")


# APIs a built-in ``primitive_leaf`` map renamed into: no leaf signs them (name and order align them)
_BY_NAME = " AND regexp_replace(l.name, '\\.\\d+\\.(forward|backward)$', '') NOT IN ({names})"


@dataclass
class CompareResult:
    """What :func:`msprobe.compare.compare` returns.

    Attributes:
        summary: the ``summary.json`` object (verdict, per-rank first origin...).
        first: ``{rank: first_origin dict or None}``.
        con: the DuckDB connection holding the tables.
        notes: warnings about the inputs (unmatched ranks/steps, mode fallback...).
        timings: seconds per stage (load, tables, align, leaf_metrics...).
        stats: counts: ``tensor_pairs`` (pairs read in tensor mode), ``attributed``
            (collective calls attributed to another rank).
        arrow: ``{"tensors": pyarrow.Table}``: the Arrow table behind the ``tensors``
            view of ``con`` (outputs write it without a copy).
        original: ``{mapped TARGET call name: original TARGET name}`` when a mapping
            renamed calls (the tables hold the mapped names; reports show the original).
    """

    summary: dict
    con: duckdb.DuckDBPyConnection
    notes: list = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)
    arrow: dict = field(default_factory=dict)
    original: dict = field(default_factory=dict)
    #: lines for stderr: the parts of either side's logs not read as data, unverified logs
    notices: list = field(default_factory=list)
    #: a comparison made one step at a time: the :class:`msprobe.compare.outputs.TableSink`
    #: whose Parquet files back the views ``tensors``, ``calls``, ``alignment`` of ``con``
    sink: object = None

    @property
    def verdict(self) -> str:
        return self.summary["verdict"]

    @property
    def first(self) -> dict:
        return {r["rank"]: r["first_origin"] for r in self.summary["ranks"]}

    @property
    def tensors(self) -> duckdb.DuckDBPyRelation:
        """Per leaf pair: names, metrics, verdict (DuckDB relation)."""
        return self.con.table("tensors")

    @property
    def calls(self) -> duckdb.DuckDBPyRelation:
        """Per call pair: names, kind, verdict, reason, e (DuckDB relation)."""
        return self.con.table("calls")

    @property
    def alignment(self) -> duckdb.DuckDBPyRelation:
        """Per call: target name, baseline name, how it was paired (DuckDB relation)."""
        return self.con.table("alignment")

    @property
    def exit_code(self) -> int:
        """The exit status of ``msprobe compare`` for :attr:`verdict` (:data:`EXIT_CODES`):
        0 identical or close, 1 diverged, 3 incomplete, 4 inconclusive (2 is bad input)."""
        return EXIT_CODES.get(self.verdict, 0)


def _filter(side: Side, opts: CompareOptions) -> Side:
    import pyarrow.compute as pc

    def keep(table: pa.Table) -> pa.Table:
        mask = None
        if opts.ranks is not None:
            mask = pc.is_in(table["rank"], pa.array(sorted(opts.ranks), pa.int32()))
        if opts.steps is not None:
            m2 = pc.is_in(table["step"], pa.array(sorted(opts.steps), pa.int32()))
            mask = m2 if mask is None else pc.and_(mask, m2)
        return table if mask is None else table.filter(mask)

    side.calls, side.leaves = keep(side.calls), keep(side.leaves)
    return side


_LEVEL_KINDS = {
    "L0": frozenset({"module_forward", "module_backward", "parameters_grad"}),
    "L1": frozenset({"api_forward", "api_backward"}),
    "mix": frozenset({"module_forward", "module_backward", "parameters_grad", "api_forward", "api_backward"}),
    "debug": frozenset({"debug_save"}),
    "L2": frozenset({"kernel"}),   # MindSpore's kernel dump (msprobe.kernel_dump.ingest)
}


def _common_kinds(t: Side, b: Side, notes: list) -> None:
    """Levels differ: keep the entry kinds both levels record (spec section 1), or raise."""
    import pyarrow.compute as pc

    kt, kb = _LEVEL_KINDS.get(t.level), _LEVEL_KINDS.get(b.level)
    if kt is None or kb is None:
        notes.append(f"levels differ: TARGET {t.level}, BASELINE {b.level}")
        return
    common = sorted(kt & kb)
    if not common:
        raise CompareInputError(f"levels differ: TARGET level {t.level!r} records {sorted(kt)}, BASELINE level "
                                f"{b.level!r} records {sorted(kb)}; no entry kind in common")
    notes.append(f"levels differ: TARGET {t.level}, BASELINE {b.level}; comparing the common entry kinds "
                 f"{', '.join(common)}")
    keep = pa.array(common)
    for side in (t, b):
        side.calls = side.calls.filter(pc.is_in(side.calls["kind"], keep))
        names = side.calls["name"].unique()
        side.leaves = side.leaves.filter(pc.is_in(side.leaves["name"], names))


def _choose_mode(opts: CompareOptions, t: Side, b: Side, notes: list) -> str:
    def has(side: Side, col: str) -> bool:
        return side.leaves.num_rows > 0 and side.leaves[col].null_count < side.leaves.num_rows
    if opts.mode == "auto":
        from msprobe.compare.tensordata import has_tensor_data
        if has_tensor_data(t) and has_tensor_data(b):
            return "tensor"
        if (not (has(t, "max") and has(b, "max"))) and has(t, "crc32") and has(b, "crc32"):
            return "md5"    # summary_mode xor: checksums without statistics
        return "statistics"
    if opts.mode == "md5" and not (has(t, "crc32") and has(b, "crc32")):
        kinds = [n for n in notes if n.startswith("checksums not compared: ")]
        if kinds:
            raise CompareInputError("--mode md5: the checksums are of different kinds (" + kinds[0].split(": ", 1)[1]
                                    + "); record both with the same summary_mode, or use --mode statistics")
        raise CompareInputError("--mode md5: field 'md5' (CRC-32) missing from "
                                + ("TARGET" if not has(t, "crc32") else "BASELINE")
                                + "; record with summary_mode md5, or use --mode statistics")
    if opts.mode == "tensor":
        from msprobe.compare.tensordata import has_tensor_data
        for label, side in (("TARGET", t), ("BASELINE", b)):
            if not has_tensor_data(side):
                raise CompareInputError(f"--mode tensor: {label} {side.path!r}: no tensor data (field 'data_name' "
                                        f"and payload empty); record with task tensor, or use --mode statistics")
    return opts.mode


#: two of our stores with two steps or more are compared one step at a time
#: (:mod:`msprobe.compare.stepwise`); False compares every step at once
STEP_AT_A_TIME = True


def run_compare(target: Union[str, os.PathLike], baseline: Union[str, os.PathLike],
                opts: CompareOptions, on_table=None, progress=None, out=None,
                keep_tables: bool = True) -> CompareResult:
    """Run the whole comparison (see module docstring); raises CompareInputError on bad input.
    ``on_table``: None or ``f(name, arrow_table)``, called once tables ``alignment`` and
    ``tensors`` are final (while the later stages still run;
    :class:`msprobe.compare.outputs.EarlyTables`). ``progress``: None or ``f(stage)``,
    called with each stage's name (the keys of the summary's timings) as it ends.

    Two of our stores holding two steps or more (without ``--mapping``, ``--rank-map``,
    ``--first-only``) are compared one step at a time (:mod:`msprobe.compare.stepwise`):
    the tables are then appended step by step to files for ``out`` (the OUT directory, or
    None; with ``keep_tables`` False and no ``out``, nowhere) and ``on_table`` is not
    called; the results are the same."""
    import time

    readers = (None, None)
    if STEP_AT_A_TIME:
        from msprobe.compare.stepwise import plan, run_stepwise

        steps = plan(target, baseline, opts)
        if steps is not None and steps.groups is not None:
            return run_stepwise(steps, opts, out=out, progress=progress, keep_tables=keep_tables)
        if steps is not None:
            readers = steps.readers

    notes: list[str] = []
    timings: dict[str, float] = {}
    stats: dict[str, int] = {}
    arrow: dict[str, pa.Table] = {}
    clock = [time.perf_counter()]

    def lap(stage: str) -> None:
        now = time.perf_counter()
        timings[stage] = round(now - clock[0], 3)
        clock[0] = now
        if progress is not None:
            progress(stage)

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="msprobe-compare-load") as pool:
        # the two sides load in parallel (Arrow and DuckDB release the GIL)
        # --rank/--step select the files to read; with --rank-map the baseline's ranks differ
        base_ranks = None if opts.rank_map else opts.ranks
        futures = (pool.submit(load_side, target, "TARGET", ranks=opts.ranks, steps=opts.steps, reader=readers[0]),
                   pool.submit(load_side, baseline, "BASELINE", ranks=base_ranks, steps=opts.steps,
                               reader=readers[1]))
        t, b = (f.result() for f in futures)
    if opts.rank_map:
        from msprobe.compare.distributed import apply_rank_map
        apply_rank_map(t, b, opts.rank_map, notes)
    t, b = _filter(t, opts), _filter(b, opts)
    incomplete: list[str] = []      # why what was compared is not all there is
    log_skipped: list[dict] = []
    notices: list[str] = []
    for label, side in (("TARGET", t), ("BASELINE", b)):
        side_notices(label, side.skipped, side.unverified, side.missing_ranks, side.unfinished, opts,
                     incomplete, log_skipped, notices)
        if side.calls.num_rows == 0:
            raise CompareInputError(f"{label} {side.path!r}: no calls left after --rank/--step selection")
    if t.level and b.level and t.level != b.level:
        _common_kinds(t, b, notes)
    from msprobe.compare.producers import noise_profiles, reconcile
    skipped = reconcile(t, b, notes)
    noise = noise_profiles(t.producer, b.producer)
    if t.producer != b.producer:
        notes.append(f"producers differ: TARGET {t.producer}, BASELINE {b.producer}; statistics compared with "
                     f"both tools' rounding allowed for (docs/compare-upstream-formats.md)")
    from msprobe.compare.mapping import apply_mapping, framework_mapping
    differ = bool(t.framework and b.framework and t.framework != b.framework)
    mapping, renames, b_renames = opts.mapping, None, None
    if differ:
        mapping, b_renames = framework_mapping(t, b, opts.mapping, notes)
    if mapping is not None:
        renames = apply_mapping(t, b, mapping)
    if b_renames is not None:       # the BASELINE was renamed (PyTorch TARGET, MindSpore BASELINE)
        from msprobe.compare.mapping import Renames
        renames = renames or Renames()
        renames.baseline_original = b_renames.original
    if renames is not None:
        for label, n in renames.ignored.items():
            notes.append(f"{label}: {n} calls ignored by the mapping")
        for label, side in (("TARGET", t), ("BASELINE", b)):
            if side.calls.num_rows == 0:
                raise CompareInputError(f"{label} {side.path!r}: no calls left after the mapping's ignore list")
    mode = _choose_mode(opts, t, b, notes)
    lap("load")
    con = duckdb.connect(":memory:")
    t_keys, b_keys = register_sides(con, t, b)
    common = sorted(t_keys & b_keys)
    for label, only in (("TARGET", t_keys - b_keys), ("BASELINE", b_keys - t_keys)):
        if only:
            notes.append(one_side_text(label, only))
            incomplete.append(one_side_text(label, only, missing=True))
    if not common:
        raise CompareInputError(f"no common (rank, step): TARGET has {sorted(t_keys)}, BASELINE has {sorted(b_keys)}")
    lap("tables")
    tensors = measure(con, t, b, common, mode, opts, stats, noise=noise, mapping=mapping,
                      renames=(renames, b_renames), on_table=on_table, lap=lap)
    arrow["tensors"] = tensors
    tally = Tally(mode)
    tally.add(con, renames.original if renames is not None else {})
    summary = tally.summary(common, notes, opts)
    unverified = {label: list(side.unverified) for label, side in (("TARGET", t), ("BASELINE", b)) if side.unverified}
    _finish(summary, tally, incomplete, {"TARGET": t.producer, "BASELINE": b.producer}, skipped, log_skipped,
            unverified)
    if differ or opts.mapping is not None:
        from msprobe.compare.mapping import Renames, unmatched_prefixes
        summary["unmatched"] = unmatched_prefixes(con, renames or Renames())
    lap("summary")
    return CompareResult(summary=summary, con=con, notes=notes, timings=timings, stats=stats, arrow=arrow,
                         original=dict(renames.original) if renames is not None else {},
                         notices=notices)


def register_sides(con: duckdb.DuckDBPyConnection, t: Side, b: Side) -> tuple[set, set]:
    """Register the sides' ``calls``, ``leaves`` (with the columns of
    :func:`msprobe.compare.metrics.prepare_leaves`) and ``stacks`` on ``con`` as
    ``t_*``/``b_*`` (zero-copy Arrow scans; a name registered before is replaced); returns
    the (rank, step) pairs each side's calls hold."""
    for prefix, side in (("t", t), ("b", b)):
        side.leaves = prepare_leaves(con, side.leaves)
        side.calls = rechunk(side.calls)
        for name in ("calls", "leaves", "stacks"):
            con.register(f"{prefix}_{name}", getattr(side, name))
    t_keys = set(con.sql("SELECT DISTINCT rank, step FROM t_calls").fetchall())
    b_keys = set(con.sql("SELECT DISTINCT rank, step FROM b_calls").fetchall())
    return t_keys, b_keys


def one_side_text(label: str, only, missing: bool = False) -> str:
    """The note (``missing``: the ``incomplete`` line) for the (rank, step) pairs ``only``
    that only side ``label`` holds."""
    text = f"{label} only (not compared): " + ", ".join(f"rank {r} step {s}" for r, s in sorted(only))
    return f"{text}; missing from {'BASELINE' if label == 'TARGET' else 'TARGET'}" if missing else text


def measure(con: duckdb.DuckDBPyConnection, t: Side, b: Side, common: list, mode: str, opts: CompareOptions,
            stats: dict, *, noise=None, mapping=None, renames=(None, None), on_table=None, lap=None) -> pa.Table:
    """Align, measure and judge the registered sides (:func:`register_sides`) over the
    (rank, step) pairs ``common``: creates tables ``alignment`` and ``calls`` on ``con``,
    registers ``tensors`` and returns it (Arrow). ``t.leaves``/``b.leaves`` are released
    (and unregistered) once the leaf pairs hold what is needed. ``stats`` gets
    ``tensor_pairs`` (tensor mode) and ``attributed``. ``renames``: the (TARGET, BASELINE)
    :class:`msprobe.compare.mapping.Renames` or None; ``on_table``/``lap`` as in
    :func:`run_compare` (None: not called)."""
    lap = lap or (lambda stage: None)
    leaf_apis = sorted({re.sub(r"(\.\d+)?\.(forward|backward)$", "", k)
                        for k in (mapping.leaf if mapping is not None else {})})
    only = _OUTPUTS_ONLY.format(names=", ".join("'" + n.replace("'", "''") + "'" for n in leaf_apis)) \
        if leaf_apis else ""
    by_name = sorted(set().union(*(r.by_name for r in renames if r is not None)))
    if by_name:
        only += _BY_NAME.format(names=", ".join("'" + n.replace("'", "''") + "'" for n in by_name))
    align_all(con, common, max_d=opts.max_d, outputs_only=only)
    if on_table is not None:
        on_table("alignment", lambda: con.table("alignment").to_arrow_table())
    lap("align")
    lp_wide = build_leaf_pairs(con, t.leaves, b.leaves, opts.tol)
    for prefix, side in (("t", t), ("b", b)):      # lp_wide holds what is needed now: free the leaves
        con.unregister(f"{prefix}_leaves")
        side.leaves = None
    pairs = leaf_pairs_sql(mode, opts.tol, opts.loss_scale, noise=noise)
    if mode == "tensor":
        from msprobe.compare.tensordata import TENSOR_COLUMNS, apply_tensor_metrics
        con.execute(f"CREATE OR REPLACE VIEW leaf_pairs AS {pairs}")
        if opts.first_only:      # read pairs only until each rank's first origin
            from msprobe.compare.firstonly import tensor_first_only
            tensors, stats["tensor_pairs"] = tensor_first_only(con, t, b, opts, attribute_collectives)
        else:
            stats["tensor_pairs"] = apply_tensor_metrics(con, t, b, opts.loss_scale, workers=opts.workers)
            tensors = arrow_streamed(con.sql(leaf_verdicts_sql("SELECT * FROM leaf_pairs", TENSOR_COLUMNS)))
            con.execute("DROP TABLE tensor_metrics")
        con.execute("DROP VIEW leaf_pairs")
    else:
        tensors = _statistics_tensors(con, lp_wide, mode, opts, noise)
    del lp_wide
    con.unregister("lp_wide")
    con.register("tensors", tensors)     # an Arrow table: outputs write it without a copy
    if on_table is not None:
        on_table("tensors", tensors)
    lap("leaf_metrics")
    stats["attributed"] = build_calls(con, attribute_collectives)
    lap("call_verdicts")
    return tensors


def _statistics_tensors(con: duckdb.DuckDBPyConnection, lp_wide: pa.Table, mode: str,
                        opts: CompareOptions, noise: Optional[tuple] = None) -> pa.Table:
    """Table ``tensors`` of statistics/md5 mode: the rows and columns of
    ``leaf_verdicts_sql(leaf_pairs_sql(...))`` over ``lp_wide``, in ``lp_wide``'s row order.
    DuckDB computes only the columns the query derives (state, diffs, e, tol, verdict, and
    the few leaf columns it rewrites); the columns it passes through unchanged are
    ``lp_wide``'s own Arrow columns (no second copy of the wide leaf columns)."""
    import numpy as np
    import pyarrow.compute as pc

    full = leaf_verdicts_sql(leaf_pairs_sql(mode, opts.tol, opts.loss_scale, row_id=True, noise=noise))
    schema = con.sql(full).limit(0).to_arrow_table().schema         # binds the query only
    out_names = [n for n in schema.names if n != "lp_row"]
    renamed = {"t_md5": "t_crc32", "b_md5": "b_crc32"}
    rewritten = {"t_has_nan", "b_has_nan", "t_has_inf", "b_has_inf"}
    if float(opts.loss_scale) != 1.0:
        rewritten |= {"t_max", "t_min", "t_mean", "t_norm", "t_max_finite", "t_min_finite"}
    wide = set(lp_wide.column_names)
    derived = [n for n in out_names if n in rewritten or (n not in wide and n not in renamed)]
    sel = ", ".join('"' + n + '"' for n in ["lp_row", *derived])
    comp = arrow_streamed(con.sql(f"SELECT {sel} FROM ({full})"))
    rows = comp["lp_row"].to_numpy() if comp.num_rows else np.zeros(0, np.int64)
    if comp.num_rows != lp_wide.num_rows:
        raise AssertionError(f"leaf metrics: {comp.num_rows} rows for {lp_wide.num_rows} pairs")
    if not np.array_equal(rows, np.arange(len(rows))):     # DuckDB kept the order so far; do not rely on it
        comp = comp.take(pa.array(np.argsort(rows, kind="stable")))
    columns = []
    for n in out_names:
        col = comp[n] if n in derived else lp_wide[renamed.get(n, n)]
        if not col.type.equals(schema.field(n).type):
            col = pc.cast(col, schema.field(n).type)
        columns.append(col)
    return rechunk(pa.table(columns, names=out_names))


def _stack(con: duckdb.DuckDBPyConnection, stack_id: Optional[int]) -> list[str]:
    if stack_id is None:
        return []
    return [f for (f,) in con.execute("SELECT frame FROM t_stacks WHERE stack_id = ? ORDER BY depth", [stack_id]).fetchall()]


def _describe(con, r: dict) -> dict:
    return {"name": r.get("t_original") or r["t_name"], "baseline_name": r["b_name"], "step": r["step"],
            "direction": "backward" if r["kind"] in ("api_backward", "module_backward", "parameters_grad") or (
                r["kind"] == S.KERNEL and re.match(S.KERNEL_BACKWARD_RE, r["t_name"] or "")) else "forward",
            "kind": r["kind"], "module": r["module"], "reason": r["reason"] or
            (f"diverged inputs and outputs (largest e {r['e']:.3g})" if r["e"] is not None else None),
            "e": r["e"], "stack": _stack(con, r["stack_id"]),
            **({"attributed_to": r["attributed_to"]} if r.get("attributed_to") is not None else {})}


# per rank: its first origin and its first call diverged (origin or propagated), in
# execution order (step, ord); the tie order of equal (step, ord) is DuckDB's
_FIRST_SQL = """
SELECT * EXCLUDE (rd, ro), verdict = 'origin' AND ro = 1 AS is_origin, rd = 1 AS is_first FROM (
  SELECT *, row_number() OVER (PARTITION BY rank ORDER BY step, ord) AS rd,
            row_number() OVER (PARTITION BY rank, verdict ORDER BY step, ord) AS ro
  FROM calls WHERE verdict IN ('origin', 'propagated'))
WHERE rd = 1 OR (verdict = 'origin' AND ro = 1)
"""


class Tally:
    """What ``summary.json`` is made of, gathered from tables ``calls`` and ``tensors``
    of one comparison, or added up over the steps of a comparison made one step at a time
    (:mod:`msprobe.compare.stepwise`; :meth:`add` in step order): per rank the counts per
    verdict, the calls of each side, the first origin and the first diverged call
    (described with their stacks when found), and the numbers of tensor pairs not
    identical and, in tensor mode, without data.

    Args:
        mode: the comparison mode (``statistics``, ``md5``, ``tensor``).
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.counts: dict[int, dict] = {}
        self.sides: dict[int, list] = {}
        self.origin: dict[int, tuple] = {}      # rank -> ((step, ord), described call)
        self.diverged: dict[int, tuple] = {}
        self.not_identical = 0
        self.no_data = 0

    def add(self, con: duckdb.DuckDBPyConnection, original: dict) -> None:
        """Add the ``calls`` and ``tensors`` on ``con`` (stacks from its ``t_stacks``);
        ``original``: ``{mapped TARGET name: original name}`` shown in the descriptions."""
        for rank, verdict, n, n_t, n_b in con.execute(
                "SELECT rank, verdict, count(*), count(t_name), count(b_name) FROM calls GROUP BY ALL").fetchall():
            counts = self.counts.setdefault(rank, {"pass": 0, "propagated": 0, "origin": 0, "unpaired": 0})
            counts[verdict] = counts.get(verdict, 0) + n
            sides = self.sides.setdefault(rank, [0, 0])
            sides[0] += n_t
            sides[1] += n_b
        cur = con.execute(_FIRST_SQL)
        names = [d[0] for d in cur.description]
        for row in cur.fetchall():
            r = dict(zip(names, row))
            if r.get("t_name") in original:
                r["t_original"] = original[r["t_name"]]
            for wanted, found in (("is_origin", self.origin), ("is_first", self.diverged)):
                if r[wanted] and r["rank"] not in found:
                    found[r["rank"]] = ((r["step"], r["ord"]), _describe(con, r))
        (n,), = con.execute("SELECT count(*) FROM tensors WHERE verdict NOT IN ('identical', 'unpaired')").fetchall()
        self.not_identical += n
        if self.mode == "tensor":
            (n,), = con.execute("SELECT count(*) FROM tensors WHERE verdict = 'missing_data'").fetchall()
            self.no_data += n

    def missing_data(self) -> list[str]:
        """The ``incomplete`` line for tensor pairs without data ([] when there are none)."""
        if not self.no_data:
            return []
        return [f"{self.no_data} tensor pairs without data on one side (tensor file or payload shard missing or "
                "damaged)"]

    def summary(self, common, notes: list, opts: CompareOptions) -> dict:
        """summary.json (less what the caller adds) for the (rank, step) pairs ``common``;
        appends to ``notes`` a line per rank whose unpaired calls outnumber its paired ones."""
        ranks = sorted({r for r, _ in common})
        out_ranks = []
        any_div = False
        unpaired_ranks = []
        for rank in ranks:
            c = self.counts.get(rank, {"pass": 0, "propagated": 0, "origin": 0, "unpaired": 0})
            paired = c["pass"] + c["propagated"] + c["origin"]
            if 2 * paired < min(self.sides.get(rank, (0, 0))):
                # fewer than half the calls of the smaller side found a partner: two different
                # programs; whatever differs among the few pairs says nothing
                unpaired_ranks.append(rank)
            if c["unpaired"] > paired:  # the verdict speaks for the paired calls only
                notes.append(f"rank {rank}: {c['unpaired']} calls found no partner against {paired} paired: the "
                             "runs differ in structure (another model, level, scope or steps), or a dump path holds "
                             "the logs of several runs")
            origin, diverged = self.origin.get(rank), self.diverged.get(rank)
            if diverged is not None and origin is not None and origin[0] <= diverged[0]:
                diverged = None     # the first diverged call is the origin itself or comes later
            if origin is not None or diverged is not None:
                any_div = True
            out_ranks.append({"rank": rank,
                              "first_origin": origin[1] if origin else None,
                              "first_diverged": diverged[1] if diverged else None,
                              "counts": c,
                              **({"baseline_rank": opts.rank_map.get(rank, rank)} if opts.rank_map else {})})
        if unpaired_ranks:
            verdict = "inconclusive"
        elif any_div:
            verdict = "diverged"
        else:
            verdict = "close" if self.not_identical else "identical"
        return {"verdict": verdict, "mode": self.mode, "ranks": out_ranks, "global_origin": _global_origin(out_ranks),
                "inconclusive_ranks": unpaired_ranks, "notes": list(notes)}


#: exit status of ``msprobe compare`` per verdict (2: bad input, never a verdict)
EXIT_CODES = {"identical": 0, "close": 0, "diverged": 1, "incomplete": 3, "inconclusive": 4}


def _finish(summary: dict, tally: Tally, incomplete: list, producers: dict, skipped: dict, log_skipped: list,
            unverified: dict) -> None:
    """Add to ``summary`` (:meth:`Tally.summary`) the sides' ``producers``, the ``skipped``
    leaves, ``incomplete`` (with :meth:`Tally.missing_data`), ``log_skipped`` and, when
    any, ``unverified``. An ``identical``/``close`` verdict becomes ``incomplete`` when
    something was not compared (a step or rank on one side only, a damaged log part,
    tensor data missing): only what was compared agreed. ``diverged`` and
    ``inconclusive`` stand (a divergence found is real; the first divergence may still lie
    in what is missing, which ``incomplete`` lists)."""
    summary["producers"] = producers
    summary["skipped"] = skipped
    summary["incomplete"] = incomplete = list(incomplete) + tally.missing_data()
    if incomplete and summary["verdict"] in ("identical", "close"):
        summary["verdict_of_compared"] = summary["verdict"]
        summary["verdict"] = "incomplete"
    summary["log_skipped"] = log_skipped
    if unverified:
        summary["unverified"] = unverified


def _selected_skips(skipped, opts: CompareOptions) -> list:
    """The skipped log parts that can hold rows of the selected ranks and steps: a part of
    another rank's file, or of steps all outside ``--step``, does not make the comparison
    incomplete."""
    from store.log_writer import parse_log_file_name

    out = []
    for skip in skipped:
        parsed = parse_log_file_name(Path(skip.path).name)
        if opts.ranks is not None and parsed is not None and parsed[0] not in opts.ranks:
            continue
        after, before = skip.steps if skip.steps else (None, None)
        if opts.steps is not None and after is not None and before is not None \
                and not any(after <= s <= before for s in opts.steps):
            continue
        out.append(skip)
    return out


def side_notices(label: str, skipped, unverified, missing, unfinished, opts: CompareOptions,
                 incomplete: list, log_skipped: list, notices: list) -> None:
    """What one side's log reader reports (skipped log parts, ranks ``missing`` a readable
    log, unverified and unfinished files), appended in the comparison's words: to
    ``incomplete`` what can lack rows of the selected ranks and steps, to ``log_skipped``
    those skipped parts as dicts, to ``notices`` every line of
    :func:`store.log_reader.notices`; each line starts with ``label``."""
    from store.log_reader import notices as notice_lines

    for skip in _selected_skips(skipped, opts):
        incomplete.append(f"{label}: {skip.describe()}")
        log_skipped.append({"side": label, "path": skip.path, "offset": skip.offset, "end": skip.end,
                            "rows": skip.rows, "steps": list(skip.steps) if skip.steps else None,
                            "reason": skip.reason})
    incomplete += [f"{label}: rank {rank} has no readable log (the run recorded it)"
                   for rank in missing if opts.ranks is None or rank in opts.ranks]
    incomplete += [f"{label}: {path} has no end-of-stream marker (its process was killed or still runs): its "
                   "last rows may be missing" for path in _selected_files(unfinished, opts)]
    notices += [f"{label}: {line}" for line in notice_lines(skipped, unverified, missing, unfinished)]


def _selected_files(paths, opts: CompareOptions) -> list:
    """The log files among ``paths`` of the ranks selected by ``--rank``."""
    from store.log_writer import parse_log_file_name

    out = []
    for path in paths:
        parsed = parse_log_file_name(Path(path).name)
        if opts.ranks is None or parsed is None or parsed[0] in opts.ranks:
            out.append(path)
    return out


def _global_origin(out_ranks: list[dict]) -> Optional[dict]:
    """The rank whose first origin the others' divergences trace back to: the rank a first
    diverged call is attributed to (through a collective), else the lowest rank with an
    origin; None without an origin. Returns ``{"rank": r, **first_origin}``."""
    by_rank = {r["rank"]: r for r in out_ranks}
    for r in out_ranks:
        fd = r["first_diverged"]
        src = fd.get("attributed_to") if fd else None
        if src is not None and by_rank.get(src, {}).get("first_origin"):
            return {"rank": src, **by_rank[src]["first_origin"]}
    for r in out_ranks:
        if r["first_origin"]:
            return {"rank": r["rank"], **r["first_origin"]}
    return None
