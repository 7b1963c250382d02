"""``msprobe compare TARGET --nan-origin``: per rank, the first call whose inputs are all
finite and whose outputs hold NaN or ±Inf.

A call is *bad in* when a leaf of its inputs (``input_args``, ``input_kwargs``,
``parameters``, backward ``input``; not for ``parameters_grad`` entries) holds NaN/Inf and
*bad out* when another leaf does. Per rank, in (step, seq) order, the origin is the first
call that is bad out and not bad in; ``nonfinite_calls`` counts the calls that are either.

Over our store the answer reads only the rank-steps that hold a non-finite tensor: the
compaction's per-(rank, step) summary (``nan_tensors``, ``inf_tensors``; the ``summary``
view of :mod:`store.query`, which also covers the uncompacted log) names them, and they
are loaded :data:`BATCH_RANK_STEPS` at a time, each rank's steps in order. After ``msprobe compact`` memory
is that of one batch, not of the run (before it, the selected ranks' logs are read once
for the summary); a run without NaN/Inf loads no tensor. Upstream layouts
(dump.json) are loaded whole.
"""
from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Optional, Union

import duckdb

from msprobe.compare.engine import _filter
from msprobe.compare.load import load_side
from msprobe.compare.options import CompareOptions
from store import schema as S

__all__ = ["BATCH_RANK_STEPS", "nan_origin"]

#: the most rank-steps one load holds (a rank with more non-finite steps is loaded in runs
#: of this many steps, in step order)
BATCH_RANK_STEPS = 256

_INPUT_IOS = "('input_args', 'input_kwargs', 'parameters', 'input')"
_BAD_CALLS_SQL = f"""
SELECT c.rank, c.step, c.seq, c.name, c.kind, c.parent, c.stack_id,
  coalesce(bool_or((l.has_nan OR l.has_inf) AND (l.io IN {_INPUT_IOS} AND c.kind <> 'parameters_grad')), FALSE)
    AS bad_in,
  coalesce(bool_or((l.has_nan OR l.has_inf) AND NOT (l.io IN {_INPUT_IOS} AND c.kind <> 'parameters_grad')), FALSE)
    AS bad_out
FROM calls_t c LEFT JOIN leaves_t l ON l.rank = c.rank AND l.step = c.step AND l.name = c.name
GROUP BY ALL HAVING bad_in OR bad_out ORDER BY c.rank, c.step, c.seq"""


def nan_origin(dump: Union[str, os.PathLike], *, ranks=None, steps=None) -> dict:
    """First call per rank whose inputs are all finite and whose outputs hold NaN/Inf.

    ``{"verdict", "ranks": [...], "notices": [...]}`` (below).

    Args:
        dump: our dump path, or an upstream layout (``step{N}/rank{R}/dump.json``).
        ranks, steps: ``--rank``/``--step`` selections (lists of ints or range text such
            as ``"0-3"``; None: all).
    Returns:
        ``{"verdict": "nonfinite"|"finite", "ranks": [{"rank", "first_origin", "counts"}]}``
        with one item per rank that recorded a call, in rank order; ``first_origin`` is
        None or ``{"name", "step", "kind", "direction", "module", "reason", "stack"}``;
        ``counts`` gives ``{"nonfinite_calls": n}`` (calls with a non-finite input or output);
        ``notices``: one line per part of our store not read as data (as ``msprobe query``
        says it; empty for upstream layouts), where an origin may lie unseen.
    Raises:
        CompareInputError: the dump is missing or empty, or the selection holds no call.
    """
    opts = CompareOptions.build(rank=ranks, step=steps)
    notices: list[str] = []
    plan = _plan(Path(dump), opts, notices)
    if plan is None:
        present, loads = None, [(opts.ranks, opts.steps)]
    else:
        present, loads = plan
    first: dict[int, Optional[dict]] = {}
    bad: dict[int, int] = defaultdict(int)
    for load_ranks, load_steps in loads:
        side = _filter(load_side(dump, "TARGET", ranks=load_ranks, steps=load_steps), opts)
        con = duckdb.connect(":memory:")
        try:
            con.register("calls_t", side.calls)
            con.register("leaves_t", side.leaves)
            con.register("stacks_t", side.stacks)
            if present is None:   # the whole selection is loaded: every rank with a call
                present = sorted({r for (r,) in con.execute("SELECT DISTINCT rank FROM calls_t").fetchall()})
            cur = con.execute(_BAD_CALLS_SQL)
            names = [d[0] for d in cur.description]
            for row in (dict(zip(names, values)) for values in cur.fetchall()):
                rank = row["rank"]
                bad[rank] += 1
                if first.get(rank) is None and row["bad_out"] and not row["bad_in"]:
                    first[rank] = _origin(con, row)
        finally:
            con.close()
    out = [{"rank": rank, "first_origin": first.get(rank), "counts": {"nonfinite_calls": bad.get(rank, 0)}}
           for rank in present]
    return {"verdict": "nonfinite" if any(r["first_origin"] or r["counts"]["nonfinite_calls"] for r in out)
            else "finite", "ranks": out, "notices": notices}


def _plan(p: Path, opts: CompareOptions,
          notices: list) -> Optional[tuple[list[int], list[tuple[list[int], list[int]]]]]:
    """Over our store: (the ranks with a call in the selection, the loads: (ranks, steps)
    pairs covering every selected rank-step with a NaN/Inf tensor, at most
    :data:`BATCH_RANK_STEPS` rank-steps each, each rank's steps in ascending order), and
    the reader's notices (skipped parts of the log, ranks without a readable row) appended
    to ``notices``. None for other layouts, and for a selection with no call (the
    whole-load path then raises the error that says so)."""
    if not (p.is_dir() and ((p / S.STORE_DIR / S.LOG_DIR).is_dir() or (p / S.STORE_DIR / "parquet").is_dir())):
        return None
    from store.query import query

    summary = query(p, "SELECT rank, step, call_rows, nan_tensors + inf_tensors AS nonfinite FROM summary",
                    ranks=opts.ranks, steps=opts.steps, notices=notices).to_pylist()
    present = sorted({r["rank"] for r in summary if r["call_rows"]})
    if not present:
        return None
    by_rank: dict[int, list[int]] = defaultdict(list)
    for r in summary:
        if r["nonfinite"]:
            by_rank[r["rank"]].append(r["step"])
    ranks_of: dict[tuple, list[int]] = defaultdict(list)    # ranks with the same non-finite steps
    for rank, steps in by_rank.items():
        ranks_of[tuple(sorted(set(steps)))].append(rank)
    loads = []
    for steps, ranks in sorted(ranks_of.items(), key=lambda kv: min(kv[1])):
        per_load = max(1, BATCH_RANK_STEPS // min(len(steps), BATCH_RANK_STEPS))
        for i in range(0, len(ranks), per_load):
            for j in range(0, len(steps), BATCH_RANK_STEPS):
                loads.append((sorted(ranks)[i:i + per_load], list(steps[j:j + BATCH_RANK_STEPS])))
    return present, loads


def _origin(con: duckdb.DuckDBPyConnection, row: dict) -> dict:
    frames = [f for (f,) in con.execute("SELECT frame FROM stacks_t WHERE stack_id = ? ORDER BY depth",
                                        [row["stack_id"]]).fetchall()] if row["stack_id"] is not None else []
    backward = "backward" in row["kind"] or row["kind"] == "parameters_grad"
    return {"name": row["name"], "step": row["step"], "kind": row["kind"],
            "direction": "backward" if backward else "forward", "module": row["parent"],
            "reason": "finite inputs, non-finite output", "stack": frames}
