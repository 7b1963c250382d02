"""Self-contained ``report.html`` of ``msprobe compare``, drawn with the pieces of
:mod:`msprobe.report.page`. A rank and a step selector drive the page. Per rank: the
verdict counts, the first origin and the first diverged call with their stacks; the model
graph of the chosen step (modules and API calls nested as construct.json records them,
coloured by verdict; a click shows both runs' statistics side by side with the relative
errors, the stack and the SQL that reproduces the rows); each call's largest error in
units of its tolerance along execution order (log scale, coloured by verdict); the module
tree of the chosen step with the path to the first origin marked; and the non-pass calls
as a sortable, filterable table whose rows link to their stacks.

Names are the TARGET's own: with a ``--mapping`` the tables hold the mapped names
(:attr:`CompareResult.original` maps them back), and every part of the page shows the
original name, the baseline's under it where it differs.

Big comparisons are reduced before they are embedded: the plot keeps every non-pass call
and at most :data:`MAX_PLOTTED` calls in all (pass calls evenly sampled), the table the
first :data:`MAX_ROWS` non-pass calls, the graph at most :data:`MAX_GRAPH_STEPS` steps and
the details the first :data:`MAX_DETAIL_TENSORS` tensors; the page says so.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from msprobe.report.data import _short, plain
from msprobe.report.page import render

__all__ = ["MAX_PLOTTED", "MAX_ROWS", "MAX_GRAPH_STEPS", "MAX_DETAIL_TENSORS", "write_html"]

MAX_PLOTTED = 5000
MAX_ROWS = 2000
MAX_GRAPH_STEPS = 200
MAX_DETAIL_TENSORS = 20000
_VERDICTS = ("pass", "propagated", "origin", "unpaired")

_BODY = """<h1 id='title'>msprobe compare</h1>
<div id='notices'></div>
<nav><label>rank <select id='rank'></select></label> <label>step <select id='step'></select></label></nav>
<p class='note'>Verdicts: <b>pass</b> (within tolerance), <b>origin</b> (inputs agree, outputs differ),
<b>propagated</b> (already diverged inputs), <b>unpaired</b> (no partner in the other run).
<i>e</i> is a call's largest relative error over its tensors; <i>e/tol</i> the largest over its
output tensors of each tensor's error divided by that tensor's tolerance (above 1: out of tolerance).</p>
<div id='compare'></div>"""

# per call: the largest e/tol over its output tensors (tensors with a tolerance)
_RATIO_SQL = """
    SELECT rank, step, t_call, b_call, max(e / tol) FILTER (WHERE tol > 0 AND role = 'out' AND e IS NOT NULL) AS ratio
    FROM tensors GROUP BY ALL"""

_DETAIL_COLUMNS = ("io", "arg", "t_dtype", "b_dtype", "t_shape", "b_shape", "t_max", "b_max", "t_min", "b_min",
                   "t_mean", "b_mean", "t_norm", "b_norm", "max_rel_pct", "min_rel_pct", "mean_rel_pct",
                   "norm_rel_pct", "e", "tol", "verdict")


def _stacks(con, ids) -> dict:
    out = {}
    ids = sorted(i for i in ids if i is not None)
    if ids:
        for sid, frames in con.execute("SELECT stack_id, list(frame ORDER BY depth) FROM t_stacks "
                                       "WHERE list_contains(?, stack_id) GROUP BY stack_id", [ids]).fetchall():
            out[str(sid)] = frames
    return out


def _ranks(result) -> list[dict]:
    con = result.con
    original = getattr(result, "original", {}) or {}
    show = lambda name: original.get(name, name) if name is not None else None   # noqa: E731
    out = []
    for r in result.summary["ranks"]:
        rank = r["rank"]
        calls = con.execute(f"""
            SELECT row_number() OVER (ORDER BY c.step, c.ord) - 1 AS i, c.step, c.t_name, c.b_name, c.kind,
                   c.verdict, c.e, x.ratio, c.module, c.reason, c.stack_id
            FROM calls c LEFT JOIN ({_RATIO_SQL}) x ON x.rank = c.rank AND x.step = c.step
                 AND x.t_call IS NOT DISTINCT FROM c.t_name AND x.b_call IS NOT DISTINCT FROM c.b_name
            WHERE c.rank = ? ORDER BY c.step, c.ord""", [rank]).fetchall()
        names = ("i", "step", "t_name", "b_name", "kind", "verdict", "e", "ratio", "module", "reason", "stack_id")
        rows = []
        for c in calls:
            row = dict(zip(names, c))
            row["mapped"] = row["t_name"]
            row["t_name"], row["module"] = show(row["t_name"]), show(row["module"])
            row["name"] = row["t_name"] if row["t_name"] is not None else row["b_name"]
            rows.append(row)
        plotted = [c for c in rows if c["verdict"] != "pass"]
        passing = [c for c in rows if c["verdict"] == "pass"]
        room = max(MAX_PLOTTED - len(plotted), 0)
        if len(passing) > room:
            passing = [passing[k * len(passing) // room] for k in range(room)] if room else []
        plotted = sorted(plotted + passing, key=lambda c: c["i"])
        table = [c for c in rows if c["verdict"] != "pass"][:MAX_ROWS]
        graph = _graph(con, rank, rows)
        stacks = _stacks(con, {c["stack_id"] for c in table} | {int(s) for s in graph["stack_ids"]})
        del graph["stack_ids"]
        first = r["first_origin"] or r["first_diverged"]
        origin_index = None
        if first:   # summary names are the original TARGET names (the baseline's for a call only it has)
            origin_index = next((c["i"] for c in rows if c["step"] == first["step"] and c["b_name"] == first["baseline_name"]
                                 and c["name"] == first["name"]), None)
        out.append({
            "rank": rank, "counts": r["counts"], "first_origin": r["first_origin"],
            "first_diverged": r["first_diverged"], "origin_index": origin_index, "calls_total": len(rows),
            "plot": [[c["i"], c["ratio"], c["verdict"], c["name"], c["step"], c["e"]] for c in plotted],
            "rows": [{k: c[k] for k in ("i", "step", "t_name", "b_name", "kind", "verdict", "e", "ratio", "module", "reason")}
                     | {"stack_id": None if c["stack_id"] is None else str(c["stack_id"])} for c in table],
            "non_pass": sum(1 for c in rows if c["verdict"] != "pass"), "stacks": stacks, "graph": graph,
        })
    return out


def _graph(con, rank: int, rows: list[dict]) -> dict:
    """The forward calls of every step (at most :data:`MAX_GRAPH_STEPS` steps, evenly
    spaced) as graph nodes ``[name, parent index or -1, kind, stack id, baseline name,
    TARGET name as the tables hold it (mapped) or None]``
    (order of first call) and per step ``[node index, verdict, e, e/tol, call index i]``;
    ``details`` maps ``i`` to the rows of both runs' tensors of that call (outputs; inputs
    too for a call that did not pass)
    (:data:`_DETAIL_COLUMNS`; statistics to 7 significant digits, float32's precision;
    relative errors to 4; the baseline's dtype and shape None where they equal the
    target's), for the first :data:`MAX_DETAIL_TENSORS` tensors."""
    forward = [c for c in rows if c["kind"] in ("module_forward", "api_forward")]
    steps = sorted({c["step"] for c in rows})
    steps_total = len(steps)
    if len(steps) > MAX_GRAPH_STEPS:
        steps = [steps[k * len(steps) // MAX_GRAPH_STEPS] for k in range(MAX_GRAPH_STEPS)]
    kept = set(steps)
    index: dict[str, int] = {}
    nodes: list[list] = []
    stats: dict[str, list] = {str(s): [] for s in steps}
    for c in forward:
        if c["step"] not in kept:
            continue
        i = index.get(c["name"])
        if i is None:
            i = index[c["name"]] = len(nodes)
            nodes.append([c["name"], c["module"], c["kind"], None if c["stack_id"] is None else str(c["stack_id"]),
                          c["b_name"], c["mapped"]])
        stats[str(c["step"])].append([i, c["verdict"], c["e"], c["ratio"], c["i"]])
    for node in nodes:
        node[1] = index.get(node[1], -1) if node[1] is not None else -1
    calls = {(c["step"], c["mapped"], c["b_name"]): c["i"] for c in forward if c["step"] in kept}
    passing = {c["i"] for c in forward if c["verdict"] == "pass"}
    details: dict[str, list] = {}
    cols = ", ".join(_DETAIL_COLUMNS)
    cur = con.execute(f"""SELECT step, t_call, b_call, {cols} FROM tensors
        WHERE rank = ? AND call_kind IN ('module_forward', 'api_forward') AND list_contains(?, step)
        ORDER BY step, ord, io, arg LIMIT ?""", [rank, steps, MAX_DETAIL_TENSORS + 1])
    got = cur.fetchall()
    for step, t_call, b_call, *values in got[:MAX_DETAIL_TENSORS]:
        i = calls.get((step, t_call, b_call))
        if i is not None:
            row = dict(zip(_DETAIL_COLUMNS, values))
            if i in passing and not row["io"].startswith("output"):
                continue
            for side in ("dtype", "shape"):   # the baseline's only where it differs
                if row[f"b_{side}"] == row[f"t_{side}"]:
                    row[f"b_{side}"] = None
            for key in ("max_rel_pct", "min_rel_pct", "mean_rel_pct", "norm_rel_pct"):
                if isinstance(row[key], float) and math.isfinite(row[key]):
                    row[key] = float(f"{row[key]:.4g}")
            details.setdefault(str(i), []).append([_short(v) if isinstance(v, float) else v for v in row.values()])
    return {"nodes": nodes, "steps": steps, "steps_total": steps_total, "stats": stats, "details": details,
            "detail_columns": list(_DETAIL_COLUMNS), "details_cut": len(got) > MAX_DETAIL_TENSORS,
            "stack_ids": sorted({n[3] for n in nodes if n[3] is not None})}


def write_html(result, path: Path, parquet: bool | None = None) -> Path:
    """Write the report of a :class:`msprobe.compare.engine.CompareResult` to ``path``
    (no external resources); returns ``path``. ``parquet``: whether ``tensors.parquet`` is
    written beside it (the details' SQL reads it; the page says how to get it when not);
    None: whether the file is there now."""
    summary = result.summary
    out_dir = Path(path).parent
    if parquet is None:
        parquet = (out_dir / "tensors.parquet").is_file()
    data = plain({"verdict": summary["verdict"], "mode": summary["mode"], "notes": summary.get("notes", []),
                  "incomplete": summary.get("incomplete", []),
                  "ranks": _ranks(result), "max_plotted": MAX_PLOTTED, "max_rows": MAX_ROWS,
                  "out": str(out_dir), "parquet": bool(parquet)})
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render("msprobe compare", _BODY, data, "compare.js"), encoding="utf-8")
    os.replace(tmp, path)
    return path
