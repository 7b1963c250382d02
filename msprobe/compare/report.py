"""Self-contained ``report.html`` of ``msprobe compare``, drawn with the pieces of
:mod:`msprobe.report.page`: per rank the verdict counts, the first origin and the first
diverged call with their stacks, the module tree with the path to the first origin
marked (modules of the step of the first origin, or of the first step), each call's largest relative error ``e`` along execution order (log scale,
coloured by verdict), and the non-pass calls as a table whose rows link to their stacks.

Big comparisons are reduced before they are embedded: the plot keeps every non-pass call
and at most :data:`MAX_PLOTTED` calls in all (pass calls evenly sampled), the table the
first :data:`MAX_ROWS` non-pass calls; the page says so.
"""
from __future__ import annotations

import os
from pathlib import Path

from msprobe.report.data import plain
from msprobe.report.page import render

__all__ = ["MAX_PLOTTED", "MAX_ROWS", "write_html"]

MAX_PLOTTED = 5000
MAX_ROWS = 200

_BODY = """<h1 id='title'>msprobe compare</h1>
<p class='note'>Verdicts: <b>pass</b> (within tolerance), <b>origin</b> (inputs agree, outputs differ),
<b>propagated</b> (already diverged inputs), <b>unpaired</b> (no partner in the other run).
<i>e</i> is a call's largest relative error over its tensors.</p>
<div id='compare'></div>"""


def _ranks(result) -> list[dict]:
    con = result.con
    out = []
    for r in result.summary["ranks"]:
        rank = r["rank"]
        calls = con.execute(
            "SELECT row_number() OVER (ORDER BY step, ord) - 1 AS i, step, coalesce(t_name, b_name) AS name, "
            "t_name, b_name, kind, verdict, e, module, reason, stack_id FROM calls WHERE rank = ? ORDER BY step, ord",
            [rank]).fetchall()
        names = ("i", "step", "name", "t_name", "b_name", "kind", "verdict", "e", "module", "reason", "stack_id")
        rows = [dict(zip(names, c)) for c in calls]
        plotted = [c for c in rows if c["verdict"] != "pass"]
        passing = [c for c in rows if c["verdict"] == "pass"]
        room = max(MAX_PLOTTED - len(plotted), 0)
        if len(passing) > room:
            passing = [passing[k * len(passing) // room] for k in range(room)] if room else []
        plotted = sorted(plotted + passing, key=lambda c: c["i"])
        table = [c for c in rows if c["verdict"] != "pass"][:MAX_ROWS]
        stack_ids = {c["stack_id"] for c in table if c["stack_id"] is not None}
        stacks = {}
        for stack_id in sorted(stack_ids):
            stacks[str(stack_id)] = [f for (f,) in con.execute(
                "SELECT frame FROM t_stacks WHERE stack_id = ? ORDER BY depth", [stack_id]).fetchall()]
        origin = r["first_origin"] or r["first_diverged"]
        tree_step = origin["step"] if origin else (rows[0]["step"] if rows else None)
        tree = [{"name": c["name"], "parent": c["module"], "kind": c["kind"], "verdict": c["verdict"], "e": c["e"]}
                for c in rows if c["step"] == tree_step and c["kind"] == "module_forward"]
        if origin and not any(n["name"] == origin["name"] for n in tree):
            tree.append({"name": origin["name"], "parent": origin["module"], "kind": origin["kind"],
                         "verdict": "origin" if r["first_origin"] else "propagated", "e": origin["e"]})
        origin_index = next((c["i"] for c in rows if origin and c["name"] == origin["name"]
                             and c["step"] == origin["step"]), None)
        out.append({
            "rank": rank, "counts": r["counts"], "first_origin": r["first_origin"],
            "first_diverged": r["first_diverged"], "origin_index": origin_index, "calls_total": len(rows),
            "plot": [[c["i"], c["e"], c["verdict"], c["name"], c["step"]] for c in plotted],
            "rows": [{k: c[k] for k in ("i", "step", "t_name", "b_name", "kind", "verdict", "e", "module", "reason")}
                     | {"stack_id": None if c["stack_id"] is None else str(c["stack_id"])} for c in table],
            "non_pass": sum(1 for c in rows if c["verdict"] != "pass"), "stacks": stacks,
            "tree": tree, "tree_step": tree_step,
        })
    return out


def write_html(result, path: Path) -> Path:
    """Write the report of a :class:`msprobe.compare.engine.CompareResult` to ``path``
    (no external resources); returns ``path``."""
    summary = result.summary
    data = plain({"verdict": summary["verdict"], "mode": summary["mode"], "notes": summary.get("notes", []),
                  "incomplete": summary.get("incomplete", []),
                  "ranks": _ranks(result), "max_plotted": MAX_PLOTTED, "max_rows": MAX_ROWS})
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render("msprobe compare", _BODY, data, "compare.js"), encoding="utf-8")
    os.replace(tmp, path)
    return path
