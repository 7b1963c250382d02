"""Leaf and call verdicts, and the first divergence.

Leaf (SQL, :data:`LEAF_VERDICTS_SQL`): ``identical``, ``close`` (e ≤ tol), ``diverged``,
``nonfinite``, ``structural``, ``unpaired``. The tolerance of a float leaf is the larger
of its pair's rtol and a *precision watermark*: the largest pair rtol seen so far in
the step's execution order. An fp32 op fed by bf16 results carries bf16-sized errors, so
once a lower precision has entered the computation, later comparisons use its tolerance.

Call (Python, :func:`call_verdicts`): ``origin`` if an argument value differs, or an
output is diverged, nonfinite or structural with e above 10 × the largest input e;
``propagated`` if some leaf diverged otherwise; ``pass``; ``unpaired`` for inserted or
deleted calls. Backward inputs include the incoming gradients and the forward call's
inputs and parameters; ``parameters_grad`` belongs to its module's backward. A module
call is judged by its own input and output errors, as any call: its children (recorded
or not, paired or not) do not change its verdict.
"""
from __future__ import annotations

import math
from typing import Optional

__all__ = ["LEAF_VERDICTS_SQL", "leaf_verdicts_sql", "CALL_AGG_SQL", "call_verdicts", "build_calls", "BAD"]

BAD = ("diverged", "nonfinite", "structural")

LEAF_VERDICTS_SQL = """
WITH p AS ({pairs})
SELECT p.* EXCLUDE (watermark), CASE WHEN p.is_float THEN greatest(p.tol_pair, p.watermark) ELSE p.tol_pair END AS tol,
  CASE WHEN p.state <> 'measured' THEN p.state
       WHEN p.e <= (CASE WHEN p.is_float THEN greatest(p.tol_pair, p.watermark) ELSE p.tol_pair END) THEN 'close'
       ELSE 'diverged' END AS verdict
FROM p
"""


def leaf_verdicts_sql(pairs: str, tensor_columns: tuple = ()) -> str:
    """Query giving table ``tensors``: each leaf pair of the query ``pairs`` (columns of
    :func:`msprobe.compare.metrics.leaf_pairs_sql`, with its ``watermark``: the largest
    pair rtol over the step's calls up to this one) with ``tol`` (its pair rtol raised to
    the watermark, for floats) and ``verdict``. With ``tensor_columns`` (tensor mode),
    table ``tensor_metrics`` (keys rank, step, aid, io, arg; state, e and those columns)
    overrides ``state``/``e`` of the pairs it holds and adds its columns."""
    if not tensor_columns:
        return LEAF_VERDICTS_SQL.format(pairs=pairs)
    cols = ", ".join(f"tm.{c}" for c in tensor_columns)
    pairs = (f"SELECT lp.* REPLACE (CASE WHEN tm.rank IS NULL THEN lp.state ELSE tm.state END AS state, "
             f"CASE WHEN tm.rank IS NULL THEN lp.e ELSE tm.e END AS e), {cols} FROM ({pairs}) lp "
             f"LEFT JOIN tensor_metrics tm ON lp.rank = tm.rank AND lp.step = tm.step AND lp.aid = tm.aid "
             f"AND lp.io = tm.io AND lp.arg = tm.arg")
    return LEAF_VERDICTS_SQL.format(pairs=pairs)


CALL_AGG_SQL = """
WITH g AS (
  -- per call (its target seq ``aid``): the leaf aggregates, over integer keys only
  SELECT rank, step, aid,
    max(e) FILTER (WHERE role = 'in' AND verdict <> 'unpaired') AS in_e,
    max(e) FILTER (WHERE role = 'out' AND verdict <> 'unpaired') AS out_e,
    max(e) FILTER (WHERE role = 'out' AND verdict IN ('diverged', 'nonfinite', 'structural')) AS out_bad_e,
    coalesce(bool_or(role = 'in' AND t_leaf_kind = 'value' AND verdict = 'structural'), FALSE) AS arg_differs,
    coalesce(bool_or(verdict IN ('diverged', 'nonfinite', 'structural')), FALSE) AS any_bad,
    count(verdict) FILTER (WHERE verdict = 'identical') AS n_identical,
    count(verdict) AS n_leaves,
    arg_max(CASE WHEN role = 'out' AND verdict IN ('diverged', 'nonfinite', 'structural')
                 THEN t_call || '|' || io || '|' || arg END, e)
      FILTER (WHERE role = 'out' AND verdict IN ('diverged', 'nonfinite', 'structural')) AS worst_leaf,
    arg_max(verdict, e) FILTER (WHERE role = 'out' AND verdict IN ('diverged', 'nonfinite', 'structural')) AS worst_verdict
  FROM tensors GROUP BY rank, step, aid)
SELECT a.rank, a.step, a.ord, a.t_name, a.b_name, a.t_seq, a.b_seq, a.kind, a.how,
  g.in_e, g.out_e, g.out_bad_e, coalesce(g.arg_differs, FALSE) AS arg_differs, coalesce(g.any_bad, FALSE) AS any_bad,
  coalesce(g.n_identical, 0) AS n_identical, coalesce(g.n_leaves, 0) AS n_leaves, g.worst_leaf, g.worst_verdict,
  tc.parent AS module, tc.stack_id AS stack_id
FROM alignment a
LEFT JOIN g ON g.rank = a.rank AND g.step = a.step AND g.aid = a.t_seq AND a.b_name IS NOT NULL
LEFT JOIN t_calls tc ON tc.rank = a.rank AND tc.step = a.step AND tc.seq = a.t_seq
ORDER BY a.rank, a.step, a.ord
"""


def _forward_of(name: str, kind: str) -> Optional[str]:
    if kind == "api_backward":
        return name[: -len("backward")] + "forward"
    if kind == "module_backward":
        stem, _, counter = name.rsplit(".", 2)
        return f"{stem}.forward.{counter}"
    return None


def call_verdicts(rows: list[dict]) -> list[dict]:
    """Fill ``verdict``, ``reason`` and ``e`` (largest leaf e) on each call row.

    Args:
        rows: :data:`CALL_AGG_SQL` rows as dicts, ordered by (rank, step, ord).
    Returns:
        the same dicts, completed.
    """
    by_key = {}
    for r in rows:
        if r["t_name"] is not None:
            by_key[(r["rank"], r["step"], r["t_name"])] = r
    module_inputs: dict[tuple, float] = {}
    for r in rows:
        if r["kind"] in ("module_forward", "module_backward") and r["in_e"] is not None:
            key = (r["rank"], r["step"], r["t_name"].rsplit(".", 2)[0])
            module_inputs[key] = max(module_inputs.get(key, 0.0), r["in_e"])
    for r in rows:
        e_values = [v for v in (r["in_e"], r["out_e"]) if v is not None]
        r["e"] = max(e_values) if e_values else None
        if r["t_name"] is None or r["b_name"] is None:
            r["verdict"], r["reason"] = "unpaired", "deleted" if r["t_name"] is None else "inserted"
            continue
        in_e = r["in_e"] or 0.0
        fwd = _forward_of(r["t_name"], r["kind"])
        if fwd is not None and (r["rank"], r["step"], fwd) in by_key:
            in_e = max(in_e, by_key[(r["rank"], r["step"], fwd)]["in_e"] or 0.0)
        if r["kind"] == "parameters_grad":
            in_e = max(in_e, module_inputs.get((r["rank"], r["step"], r["t_name"][: -len(".parameters_grad")]), 0.0))
        r["in_e_all"] = in_e
        origin_reason = None
        if r["arg_differs"]:
            origin_reason = "argument value differs"
        elif r["out_bad_e"] is not None and (r["out_bad_e"] > 10 * in_e or (math.isinf(r["out_bad_e"]) and not math.isinf(in_e))):
            origin_reason = (f"{r['worst_verdict']} output {r['worst_leaf'].split('|', 1)[1].replace('|', '.')}: "
                             f"e={r['out_bad_e']:.3g} > 10 x largest input e {in_e:.3g}")
        r["verdict"] = "origin" if origin_reason else ("propagated" if r["any_bad"] else "pass")
        r["reason"] = origin_reason
    return rows


# --- the same judgement in SQL (what the engine runs; call_verdicts stays the reference) ---

_PATH = r"regexp_replace({x}, '\.[^.]*(\.[^.]*)?$', '')"          # name.rsplit(".", 2)[0]
_FWD_OF = (r"CASE a.kind WHEN 'api_backward' THEN regexp_replace(a.t_name, 'backward$', 'forward') "
           r"WHEN 'module_backward' THEN regexp_replace(a.t_name, '\.[^.]*\.([^.]*)$', '.forward.\1') END")

#: ``calls_pre``: CALL_AGG_SQL rows plus ``e``, ``in_all`` (largest input e, with the
#: forward call's inputs for backward calls and the module's for parameters_grad) and
#: ``verdict0`` (before cross-rank attribution).
CALLS_PRE_SQL = f"""
CREATE OR REPLACE TABLE calls_pre AS
WITH a AS ({CALL_AGG_SQL.replace("ORDER BY a.rank, a.step, a.ord", "")}),
mi AS (SELECT rank, step, {_PATH.format(x="t_name")} AS path, max(in_e) AS m FROM a
       WHERE kind IN ('module_forward', 'module_backward') AND in_e IS NOT NULL GROUP BY ALL),
j AS (
  SELECT a.*, greatest(coalesce(a.in_e, 0.0),
           CASE WHEN f.t_name IS NOT NULL THEN coalesce(f.in_e, 0.0) ELSE 0.0 END,
           CASE WHEN a.kind = 'parameters_grad' THEN coalesce(mi.m, 0.0) ELSE 0.0 END) AS in_all
  FROM a
  LEFT JOIN a f ON f.rank = a.rank AND f.step = a.step AND f.t_name = ({_FWD_OF})
  LEFT JOIN mi ON a.kind = 'parameters_grad' AND mi.rank = a.rank AND mi.step = a.step
            AND mi.path = left(a.t_name, length(a.t_name) - 16))
SELECT * EXCLUDE (in_all), CASE WHEN t_name IS NULL OR b_name IS NULL THEN NULL ELSE in_all END AS in_all,
  CASE WHEN in_e IS NULL THEN out_e WHEN out_e IS NULL THEN in_e ELSE greatest(in_e, out_e) END AS e,
  CASE WHEN t_name IS NULL OR b_name IS NULL THEN 'unpaired'
       WHEN arg_differs THEN 'origin'
       WHEN out_bad_e IS NOT NULL AND (out_bad_e > 10 * in_all OR (isinf(out_bad_e) AND NOT isinf(in_all)))
         THEN 'origin'
       WHEN any_bad THEN 'propagated' ELSE 'pass' END AS verdict0
FROM j
"""

_ORIGINS_SQL = """
SELECT rank, step, ord, t_name, kind, arg_differs, out_bad_e, in_all, worst_verdict, worst_leaf
FROM calls_pre WHERE verdict0 = 'origin' ORDER BY rank, step, ord
"""


def _origin_reason(r: dict) -> str:
    if r["arg_differs"]:
        return "argument value differs"
    return (f"{r['worst_verdict']} output {r['worst_leaf'].split('|', 1)[1].replace('|', '.')}: "
            f"e={r['out_bad_e']:.3g} > 10 x largest input e {r['in_all']:.3g}")


def build_calls(con, attribute=None) -> None:
    """Create table ``calls`` from ``alignment``, ``tensors`` and ``t_calls`` with the
    judgement of :func:`call_verdicts` (same verdicts and reasons), in SQL: only origin
    rows (few) and ``Distributed.*`` rows come to Python, for the reason text and
    cross-rank attribution.

    Args:
        con: the comparison's DuckDB connection.
        attribute: ``f(con, rows) -> int`` re-judging ``Distributed.*`` call rows (dicts,
            changed in place: ``verdict``, ``reason``, ``attributed_to``), or None.
    Returns:
        the number of rows ``attribute`` re-judged.
    """
    import pyarrow as pa

    con.execute(CALLS_PRE_SQL)
    cur = con.execute(_ORIGINS_SQL)
    names = [d[0] for d in cur.description]
    origins = [dict(zip(names, row)) for row in cur.fetchall()]
    fixes: dict[tuple, list] = {(r["rank"], r["step"], r["t_name"]): ["origin", _origin_reason(r), None]
                                for r in origins}
    changed = 0
    if attribute is not None:
        cur = con.execute("SELECT * FROM calls_pre WHERE starts_with(t_name, 'Distributed.') ORDER BY rank, step, ord")
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, row)) for row in cur.fetchall()]
        for row in rows:
            fix = fixes.get((row["rank"], row["step"], row["t_name"]))
            row["verdict"], row["reason"] = (fix[0], fix[1]) if fix else (row["verdict0"], None)
            row["attributed_to"] = None
        before = {id(row): (row["verdict"], row["reason"], row["attributed_to"]) for row in rows}
        changed = attribute(con, rows) if rows else 0
        for row in rows:
            now = (row["verdict"], row.get("reason"), row.get("attributed_to"))
            if now != before[id(row)]:
                fixes[(row["rank"], row["step"], row["t_name"])] = list(now)
    keys = list(fixes)
    fix_table = pa.table({"rank": pa.array([k[0] for k in keys], pa.int32()),
                          "step": pa.array([k[1] for k in keys], pa.int32()),
                          "t_name": pa.array([k[2] for k in keys], pa.string()),
                          "verdict": pa.array([fixes[k][0] for k in keys], pa.string()),
                          "reason": pa.array([fixes[k][1] for k in keys], pa.string()),
                          "attributed_to": pa.array([fixes[k][2] for k in keys], pa.int32())})
    con.register("call_fixes", fix_table)
    agg_cols = ", ".join(f"p.{c}" for c in _AGG_COLUMNS)
    con.execute(f"""CREATE OR REPLACE TABLE calls AS
        SELECT {agg_cols}, p.e, coalesce(f.verdict, p.verdict0) AS verdict,
          CASE WHEN f.verdict IS NOT NULL THEN f.reason
               WHEN p.verdict0 = 'unpaired' THEN CASE WHEN p.t_name IS NULL THEN 'deleted' ELSE 'inserted' END END AS reason,
          f.attributed_to
        FROM calls_pre p LEFT JOIN call_fixes f ON f.rank = p.rank AND f.step = p.step AND f.t_name = p.t_name
        ORDER BY p.rank, p.step, p.ord""")
    con.unregister("call_fixes")
    con.execute("DROP TABLE calls_pre")
    return changed


_AGG_COLUMNS = ("rank", "step", "ord", "t_name", "b_name", "t_seq", "b_seq", "kind", "how", "in_e", "out_e",
                "out_bad_e", "arg_differs", "any_bad", "n_identical", "n_leaves", "worst_leaf", "worst_verdict",
                "module", "stack_id")
