"""Leaf and call verdicts, and the first divergence (issue 8, "Verdicts", "The answer").

Leaf (SQL, :data:`LEAF_VERDICTS_SQL`): ``identical``, ``close`` (e ≤ tol), ``diverged``,
``nonfinite``, ``structural``, ``unpaired``. The tolerance of a float leaf is the larger
of its pair's rtol and a *precision watermark*: the largest pair rtol seen so far in
the step's execution order. An fp32 op fed by bf16 results carries bf16-sized errors, so
once a lower precision has entered the computation, later comparisons use its tolerance.

Call (Python, :func:`call_verdicts`): ``origin`` if an argument value differs, or an
output is diverged, nonfinite or structural with e above 10 × the largest input e;
``propagated`` if some leaf diverged otherwise; ``pass``; ``unpaired`` for inserted or
deleted calls. Backward inputs include the incoming gradients and the forward call's
inputs and parameters; ``parameters_grad`` belongs to its module's backward; a module
call with recorded children is an origin only through an origin child.
"""
from __future__ import annotations

import math
from typing import Optional

__all__ = ["LEAF_VERDICTS_SQL", "CALL_AGG_SQL", "call_verdicts", "BAD"]

BAD = ("diverged", "nonfinite", "structural")

LEAF_VERDICTS_SQL = """
CREATE OR REPLACE TABLE tensors AS
WITH c AS (
  SELECT rank, step, aid, min(ord) AS ord, max(tol_pair) AS call_tol FROM leaf_pairs GROUP BY ALL),
w AS (
  SELECT rank, step, aid, max(call_tol) OVER (PARTITION BY rank, step ORDER BY ord
         ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS watermark FROM c)
SELECT p.*, CASE WHEN p.is_float THEN greatest(p.tol_pair, w.watermark) ELSE p.tol_pair END AS tol,
  CASE WHEN p.state <> 'measured' THEN p.state
       WHEN p.e <= (CASE WHEN p.is_float THEN greatest(p.tol_pair, w.watermark) ELSE p.tol_pair END) THEN 'close'
       ELSE 'diverged' END AS verdict
FROM leaf_pairs p JOIN w USING (rank, step, aid)
"""

CALL_AGG_SQL = """
SELECT a.rank, a.step, a.ord, a.t_name, a.b_name, a.t_seq, a.b_seq, a.kind, a.how,
  max(t.e) FILTER (WHERE t.role = 'in' AND t.verdict <> 'unpaired') AS in_e,
  max(t.e) FILTER (WHERE t.role = 'out' AND t.verdict <> 'unpaired') AS out_e,
  max(t.e) FILTER (WHERE t.role = 'out' AND t.verdict IN ('diverged', 'nonfinite', 'structural')) AS out_bad_e,
  coalesce(bool_or(t.role = 'in' AND t.t_leaf_kind = 'value' AND t.verdict = 'structural'), FALSE) AS arg_differs,
  coalesce(bool_or(t.verdict IN ('diverged', 'nonfinite', 'structural')), FALSE) AS any_bad,
  count(t.verdict) FILTER (WHERE t.verdict = 'identical') AS n_identical,
  count(t.verdict) AS n_leaves,
  arg_max(t.t_call || '|' || t.io || '|' || t.arg, t.e) FILTER (WHERE t.role = 'out' AND t.verdict IN ('diverged', 'nonfinite', 'structural')) AS worst_leaf,
  arg_max(t.verdict, t.e) FILTER (WHERE t.role = 'out' AND t.verdict IN ('diverged', 'nonfinite', 'structural')) AS worst_verdict,
  tc.parent AS module, tc.stack_id AS stack_id
FROM alignment a
LEFT JOIN tensors t ON t.rank = a.rank AND t.step = a.step AND t.aid = a.t_seq AND a.b_name IS NOT NULL
LEFT JOIN t_calls tc ON tc.rank = a.rank AND tc.step = a.step AND tc.seq = a.t_seq
GROUP BY ALL
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
    children: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["t_name"] is not None:
            by_key[(r["rank"], r["step"], r["t_name"])] = r
        if r.get("module"):
            children.setdefault((r["rank"], r["step"], r["module"]), []).append(r)
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
    # a module (or its parameters_grad) with recorded children is an origin only through a child
    for r in rows:
        if r.get("verdict") != "origin":
            continue
        name = r["t_name"]
        if r["kind"] in ("module_forward", "module_backward"):
            owner = name
        elif r["kind"] == "parameters_grad":
            owner = None
            stem = name[: -len(".parameters_grad")]
            for key in by_key:
                if key[:2] == (r["rank"], r["step"]) and key[2].startswith(stem + ".backward."):
                    if children.get(key):
                        owner = key[2]
                        break
            if owner is None:
                continue
        else:
            continue
        kids = children.get((r["rank"], r["step"], owner), [])
        if kids and not any(k.get("verdict") == "origin" for k in kids):
            r["verdict"] = "propagated"
            r["reason"] = None
    return rows
