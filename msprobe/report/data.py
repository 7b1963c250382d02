"""What ``msprobe report`` shows, computed with SQL over the views of :mod:`store.query`.

:func:`collect` returns one JSON-ready dict (floats that are NaN or infinite become the
strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``; see :func:`plain`), which
:mod:`msprobe.report.page` embeds in the page. Definitions, each also stated on the page:

- a *row* of the heat maps is a module (``Module.layers.0.Linear``: the entry name without
  ``.forward.N``/``.parameters_grad``); a dump without module entries (level ``L1``) uses
  its API calls (``Functional.linear.4``) instead;
- a module's *output Norm* in a step is the L2 norm of all its forward output tensors of
  that step (``sqrt(sum(Norm^2))`` over the output tensors of every call of the module);
- a module's *gradient Norm* is the same over the gradients of its own parameters
  (``parameters_grad`` entries);
- *movers* are the parameters whose gradient Norm spans the largest ratio
  ``max/min`` over the steps;
- a *large value* is a tensor whose ``|Max|`` or ``|Min|`` reaches ``threshold`` in some
  step (NaN is left to the first-NaN section). One tensor handed from call to call (an
  output that is the next call's input, a view, a transpose keeping statistics and shape)
  is one row: the tensors of a step with equal Max, Min, Mean, Norm, shape and CRC-32 are
  one, named by its first entry (rank, entry name, io, arg) with the other entries
  holding it in ``seen_in``; a row covers the steps where that first entry holds it;
- a *Norm jump* is a tensor (same rank, entry name, io and arg) whose Norm changed by at
  least ``jump`` times between two consecutive recorded steps; jumps between the same
  steps from and to the same Norms (one tensor handed on) are one row, named by the first
  entry, the others in ``seen_in``.

Big dumps are reduced before they are embedded: at most ``max_rows`` rows per heat map
(taken evenly along execution order) and at most ``max_steps`` columns (consecutive
recorded steps binned, the cell showing the bin's largest value), the graph and tree
keep at most ``max_tree`` distinct calls (modules first) and ``max_steps`` steps; each heat map's ``rows_total``, ``steps_total`` and ``bin`` say
what was reduced (the page prints it).
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Callable, Optional, Sequence, Union

from store import schema as S
from store.query import connect, relation_exists
from store.select import StoreReader

__all__ = ["collect", "plain"]

_MODULE_KEY = r"regexp_replace(name, '\.(forward|backward)\.[0-9]+$|\.parameters_grad$', '')"
_API_KEY = r"regexp_replace(name, '\.(forward|backward)$', '')"
# a tensor the call received (a parameter gradient's tensors are all results)
_IS_INPUT = ("(io IN ('input_args', 'input_kwargs', 'parameters', 'input') "
             "AND name NOT LIKE '%.parameters_grad')")


def plain(value: Any) -> Any:
    """``value`` with NaN/Infinity floats (at any depth of lists, tuples and dicts) as the
    strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``, so that strict JSON can hold it."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def _rows(con, sql: str, params: Optional[list] = None) -> list[dict]:
    cursor = con.execute(sql, params or [])
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def _first_meta(con) -> dict:
    """The meta of the first marker (by rank, then seq) that holds a JSON object."""
    texts = [t for (t,) in con.execute(
        f"SELECT {S.META} FROM msprobe_log WHERE {S.ROW} = '{S.ROW_MARKER}' AND {S.META} IS NOT NULL "
        f"ORDER BY {S.RANK}, {S.SEQ}").fetchall()]
    for text in texts:
        try:
            meta = json.loads(text) if text else None
        except ValueError:
            continue
        if isinstance(meta, dict):
            return meta
    return {}


#: every stack of the selection, one row per stack id (built on first use: the ``stacks``
#: view scans every stack part of every rank, so it is read once, not per lookup)
_STACKS = "msprobe_report_stacks"


def _frames(con, stack_ids: list) -> dict:
    """``{stack id: [frame, innermost first]}`` of ``stack_ids`` (ids without frames absent)."""
    if not relation_exists(con, _STACKS):
        con.execute(f"CREATE TEMP TABLE {_STACKS} AS SELECT stack_id, list(frame ORDER BY depth) AS frames "
                    f"FROM stacks GROUP BY stack_id")
    return dict(con.execute(f"SELECT stack_id, frames FROM {_STACKS} WHERE list_contains(?, stack_id)",
                            [list(stack_ids)]).fetchall())


def _stack(con, stack_id) -> list[str]:
    if stack_id is None:
        return []
    return _frames(con, [stack_id]).get(stack_id, [])


def _module_path(con, rank: int, step: int, name: Optional[str]) -> list[str]:
    """Outermost first: ``name`` and the chain of construct.json parents above it."""
    path: list[str] = []
    while name and name not in path:
        path.append(name)
        found = _rows(con, "SELECT parent FROM calls WHERE rank = ? AND step = ? AND name = ? LIMIT 1",
                      [rank, step, name])
        name = found[0]["parent"] if found else None
    return path[::-1]


def _nonfinite(con, rank: int) -> dict:
    """The rank's first origin of NaN/Inf (the first call, by seq, whose inputs are finite
    and whose outputs are not) and the first tensor holding NaN/Inf at all."""
    origin = _rows(con, f"""
        SELECT step, name, min(seq) AS seq FROM tensors
        WHERE rank = ? AND (has_nan OR has_inf)
        GROUP BY step, name HAVING bool_or(NOT {_IS_INPUT}) AND NOT bool_or({_IS_INPUT})
        ORDER BY seq LIMIT 1""", [rank])
    if origin:
        origin = _rows(con, "SELECT step, seq, name, kind, parent, stack_id FROM calls "
                            "WHERE rank = ? AND step = ? AND name = ? ORDER BY seq LIMIT 1",
                       [rank, origin[0]["step"], origin[0]["name"]])
    first = _rows(con, """
        SELECT step, seq, name, io, arg, has_nan, has_inf FROM tensors
        WHERE rank = ? AND (has_nan OR has_inf) ORDER BY seq LIMIT 1""", [rank])
    if first:
        call = _rows(con, "SELECT parent, stack_id FROM calls WHERE rank = ? AND step = ? AND name = ? "
                          "ORDER BY seq LIMIT 1", [rank, first[0]["step"], first[0]["name"]])
        first[0].update(call[0] if call else {"parent": None, "stack_id": None})
    out = {}
    for key, found in (("origin", origin), ("first_tensor", first)):
        if not found:
            out[key] = None
            continue
        row = found[0]
        row["module_path"] = _module_path(con, rank, row["step"], row.pop("parent"))
        row["stack"] = _stack(con, row.pop("stack_id"))
        out[key] = row
    return out


def _keyed(level_has_modules: bool) -> tuple[str, str]:
    """(key expression, WHERE clause) of the output heat map's rows."""
    if level_has_modules:
        return _MODULE_KEY, "api_type IN ('Module', 'Cell') AND direction = 'forward' AND io = 'output'"
    return _API_KEY, "api_type NOT IN ('Module', 'Cell') AND direction = 'forward' AND io = 'output'"


def _heat(con, rank: int, key: str, where: str, max_rows: int, max_steps: int) -> dict:
    """One heat map: ``values[row][column]`` (None where nothing was recorded); rows in
    execution order (first ``seq``), sampled evenly beyond ``max_rows``; consecutive steps
    binned beyond ``max_steps``, a bin holding its largest value (NaN when one is NaN)."""
    con.execute(f"""CREATE OR REPLACE TEMP TABLE msprobe_cells AS
        SELECT {key} AS key, step, sqrt(sum(norm * norm)) AS value, min(seq) AS seq
        FROM tensors WHERE rank = ? AND {where} AND norm IS NOT NULL GROUP BY ALL""", [rank])
    try:
        keys = [r["key"] for r in _rows(con, "SELECT key FROM msprobe_cells GROUP BY key ORDER BY min(seq)")]
        steps = [r["step"] for r in _rows(con, "SELECT DISTINCT step FROM msprobe_cells ORDER BY step")]
        rows_total = len(keys)
        if rows_total > max_rows:  # evenly along execution order
            keys = [keys[i * rows_total // max_rows] for i in range(max_rows)]
        size = max(1, math.ceil(len(steps) / max_steps))
        cells = _rows(con, """
            WITH s AS (SELECT step, (row_number() OVER (ORDER BY step) - 1) // ? AS col
                       FROM (SELECT DISTINCT step FROM msprobe_cells))
            SELECT key, col, max(value) AS value FROM msprobe_cells JOIN s USING (step)
            WHERE list_contains(?, key) GROUP BY key, col""", [size, keys])
    finally:
        con.execute("DROP TABLE IF EXISTS msprobe_cells")
    columns = [steps[i:i + size] for i in range(0, len(steps), size)]
    row_of = {k: i for i, k in enumerate(keys)}
    values: list[list] = [[None] * len(columns) for _ in keys]
    for c in cells:
        values[row_of[c["key"]]][c["col"]] = c["value"]
    labels = [str(c[0]) if len(c) == 1 else f"{c[0]}-{c[-1]}" for c in columns]
    return {"rows": keys, "columns": labels, "values": values, "rows_total": rows_total,
            "steps_total": len(steps), "bin": size}


def _movers(con, rank: int, count: int, max_steps: int) -> list[dict]:
    lines = _rows(con, f"""
        SELECT {_MODULE_KEY} || '.' || io AS param, list(step ORDER BY step) AS steps,
               list(norm ORDER BY step) AS norms,
               max(norm) FILTER (WHERE isfinite(norm) AND norm > 0)
                 / min(norm) FILTER (WHERE isfinite(norm) AND norm > 0) AS ratio
        FROM tensors WHERE rank = ? AND name LIKE '%.parameters_grad' AND norm IS NOT NULL
        GROUP BY ALL HAVING count(*) > 1 ORDER BY ratio DESC NULLS LAST, param LIMIT ?""", [rank, count])
    for line in lines:
        if len(line["steps"]) > max_steps:  # every k-th step: a line keeps its shape
            k = math.ceil(len(line["steps"]) / max_steps)
            line["steps"], line["norms"] = line["steps"][::k], line["norms"][::k]
    return lines


def _short(value):
    """A statistic as a float of 7 significant digits (float32's precision): a smaller page."""
    if value is None or not math.isfinite(value):
        return value
    return float(f"{value:.7g}")


def _graph(con, rank: int, max_tree: int, max_steps: int, max_stacks: int = 2000) -> dict:
    """The forward calls (modules and APIs) of every step of one rank, for the model graph
    and the module tree: construct.json's hierarchy plus, per step, each call's output
    statistics taken over all its output tensors together.

    Returns ``{"nodes": [[name, parent index or -1, kind, stack id or None]], "steps":
    [step], "stats": {step: [[node index, Max, Min, Mean, Norm, flag, tensors]]}, "stacks":
    {stack id: [frame]}, "total": distinct calls, "steps_total": recorded steps}``. Nodes
    are in order of first call (step, then seq). Max is the largest Max of the outputs, Min
    the smallest Min, Mean the numel-weighted mean of the Means, Norm ``sqrt(sum(Norm^2))``
    (each the statistic of all outputs concatenated); flag: 1 an output holds NaN, 2 Inf, 3
    both, 0 neither. Beyond ``max_tree`` distinct calls only modules are kept (the first
    ``max_tree`` of them); beyond ``max_steps`` steps, evenly spaced steps are kept.
    """
    steps = [r["step"] for r in _rows(con, "SELECT DISTINCT step FROM calls WHERE rank = ? ORDER BY step", [rank])]
    steps_total = len(steps)
    if len(steps) > max_steps:
        steps = [steps[i * len(steps) // max_steps] for i in range(max_steps)]
    total = _rows(con, "SELECT count(DISTINCT name) AS n, count(DISTINCT name) FILTER (WHERE kind = 'module_forward') AS m "
                       "FROM calls WHERE rank = ? AND kind IN ('module_forward', 'api_forward')", [rank])[0]
    kinds = "('module_forward', 'api_forward')" if total["n"] <= max_tree else "('module_forward')"
    rows = con.execute(f"""
        WITH c AS (SELECT step, seq, name, parent, kind, stack_id FROM calls
                   WHERE rank = ? AND kind IN {kinds} AND list_contains(?, step)),
             o AS (SELECT step, name, max(max) AS mx, min(min) AS mn,
                          sum(mean * numel) / nullif(sum(numel), 0) AS mean, sqrt(sum(norm * norm)) AS norm,
                          bool_or(has_nan) AS nan, bool_or(has_inf) AS inf, count(*) AS n
                   FROM tensors WHERE rank = ? AND io = 'output' AND direction = 'forward'
                     AND list_contains(?, step) GROUP BY step, name)
        SELECT c.step, c.name, c.parent, c.kind, c.stack_id, o.mx, o.mn, o.mean, o.norm, o.nan, o.inf, o.n
        FROM c LEFT JOIN o USING (step, name) ORDER BY c.step, c.seq""", [rank, steps, rank, steps]).fetchall()
    index: dict[str, int] = {}
    nodes: list[list] = []
    stats: dict[str, list] = {str(s): [] for s in steps}
    for step, name, parent, kind, stack_id, mx, mn, mean, norm, nan, inf, n in rows:
        i = index.get(name)
        if i is None:
            if len(nodes) >= max_tree:
                continue
            i = index[name] = len(nodes)
            nodes.append([name, parent, kind, None if stack_id is None else str(stack_id)])
        stats[str(step)].append([i, _short(mx), _short(mn), _short(mean), _short(norm),
                                 (1 if nan else 0) + (2 if inf else 0), n or 0])
    for node in nodes:
        node[1] = index.get(node[1], -1) if node[1] is not None else -1
    stack_ids = sorted({int(n[3]) for n in nodes if n[3] is not None})[:max_stacks]
    stacks = {str(sid): frames for sid, frames in sorted(_frames(con, stack_ids).items())} if stack_ids else {}
    return {"nodes": nodes, "steps": steps, "stats": stats, "stacks": stacks, "total": total["n"],
            "modules_total": total["m"], "steps_total": steps_total}


def _rank_batches(ranks: list, tensors: dict, rows: int) -> list[list]:
    """``ranks`` in consecutive batches of at most ``rows`` tensor records (``tensors``:
    per rank), at least one rank each."""
    batches: list[list] = []
    held = rows
    for rank in ranks:
        if held + tensors.get(rank, 0) > rows or not batches:
            batches.append([])
            held = 0
        batches[-1].append(rank)
        held += tensors.get(rank, 0)
    return batches


def _largest(con, threshold: float, jump: float, limit: int, ranks: list, tensors: Optional[dict] = None,
             batch_rows: int = 2_000_000) -> dict:
    """The largest values and Norm jumps; the jumps a batch of ranks at a time (a window
    over at most ``batch_rows`` tensor records: ``tensors`` gives each rank's count), the
    ``limit`` largest of all ranks kept."""
    # which ranks and steps hold a large value: a scan of four columns; the full records
    # are read for those ranks and steps only
    large = "greatest(abs(max), abs(min)) >= ? AND NOT isnan(max) AND NOT isnan(min)"
    where = con.execute(f"SELECT list(DISTINCT rank), list(DISTINCT step) FROM tensors WHERE {large}",
                        [threshold]).fetchall()[0]
    chosen = (" AND rank IN (" + ", ".join(str(int(r)) for r in where[0]) + ") AND step IN ("
              + ", ".join(str(int(s)) for s in where[1]) + ")") if where[0] else " AND false"
    extremes = [] if not where[0] else _rows(con, """
        WITH big AS (SELECT rank, step, seq, name, io, arg, shape, max, min, mean, norm, coalesce(crc32, '') AS crc
                     FROM tensors WHERE greatest(abs(max), abs(min)) >= ? AND NOT isnan(max) AND NOT isnan(min)
                     @CHOSEN),
             one AS (SELECT rank, step, max, min, greatest(abs(max), abs(min)) AS largest, min(seq) AS seq,
                            arg_min({'name': name, 'io': io, 'arg': arg}, seq) AS first,
                            list(DISTINCT name ORDER BY name) AS names
                     FROM big GROUP BY rank, step, max, min, mean, norm, shape, crc)
        SELECT rank, first.name AS name, first.io AS io, first.arg AS arg, count(*) AS steps,
               min(step) AS first_step, max(max) AS max, min(min) AS min, max(largest) AS largest,
               list_sort(list_distinct(flatten(list(names)))) AS seen_in, list(step ORDER BY step) AS step_list
        FROM one GROUP BY rank, first.name, first.io, first.arg
        ORDER BY largest DESC, rank, min(seq), io, arg LIMIT ?""".replace("@CHOSEN", chosen), [threshold, limit])
    for row in extremes:
        row["seen_in"] = [n for n in row["seen_in"] if n != row["name"]]
    jumps = []
    for batch in _rank_batches(ranks, tensors or {}, batch_rows):   # the window holds one batch's tensors
        chosen = ", ".join(str(int(r)) for r in batch)
        jumps += _rows(con, """
            WITH s AS (SELECT rank, step, seq, name, io, arg, norm,
                              lag(norm) OVER (PARTITION BY rank, name, io, arg ORDER BY step) AS previous,
                              lag(step) OVER (PARTITION BY rank, name, io, arg ORDER BY step) AS previous_step
                       FROM tensors WHERE rank IN (@RANKS) AND norm IS NOT NULL),
                 j AS (SELECT * FROM s WHERE previous > 0 AND norm > 0 AND isfinite(previous) AND isfinite(norm)
                                         AND greatest(norm / previous, previous / norm) >= ?),
                 one AS (SELECT rank, previous_step, step, previous, norm, min(seq) AS seq,
                                arg_min({'name': name, 'io': io, 'arg': arg}, seq) AS first,
                                list(DISTINCT name ORDER BY name) AS names
                         FROM j GROUP BY rank, previous_step, step, previous, norm)
            SELECT rank, previous_step, step, first.name AS name, first.io AS io, first.arg AS arg, previous, norm,
                   norm / previous AS ratio, names AS seen_in,
                   greatest(norm / previous, previous / norm) AS msprobe_factor, seq AS msprobe_seq
            FROM one
            ORDER BY msprobe_factor DESC, rank, step, seq, io, arg LIMIT ?""".replace("@RANKS", chosen), [jump, limit])
    jumps.sort(key=lambda r: (-r["msprobe_factor"], r["rank"], r["step"], r["msprobe_seq"],
                              r["io"] is None, r["io"] or "", r["arg"] is None, r["arg"] or ""))   # NULLS LAST
    jumps = jumps[:limit]
    for row in jumps:
        del row["msprobe_factor"], row["msprobe_seq"]
        row["seen_in"] = [n for n in row["seen_in"] if n != row["name"]]
    return {"threshold": threshold, "jump": jump, "limit": limit, "extremes": extremes, "jumps": jumps}


def _detail_ranks(ranks: list, nonfinite: list[dict], most: int) -> list:
    """The ranks shown in detail: those holding NaN/Inf (earliest step first, then rank),
    then the others in rank order; at most ``most``, returned sorted."""
    first = {r["rank"]: r["step"] for r in nonfinite}
    order = sorted(ranks, key=lambda r: (r not in first, first.get(r, 0), r))
    return sorted(order[:most])


def collect(
    dump_path: Union[str, os.PathLike], *, threshold: float = 1e4, jump: float = 10.0,
    max_rows: int = 200, max_steps: int = 200, max_tree: int = 3000, movers: int = 8, max_ranks: int = 16,
    progress: Optional[Callable[[str], None]] = None, ranks: Optional[Sequence[int]] = None,
    steps: Optional[Sequence[int]] = None,
) -> dict:
    """Everything the report page shows for the recording under ``dump_path``.

    Args:
        dump_path: the dump directory (log under ``.msprobe/log/``).
        threshold: a tensor is listed under "largest values" when ``|Max|`` or ``|Min|``
            is at least this.
        jump: a Norm jump is a change by at least this factor between recorded steps.
        max_rows, max_steps: heat map size limits (rows sampled, steps binned beyond them);
            ``max_steps`` also caps the steps of the graph (evenly spaced beyond it).
        max_tree: most distinct calls in the graph and module tree (beyond it, modules only).
        movers: how many parameter-gradient lines to draw.
        max_ranks: most ranks with per-rank detail (first NaN/Inf origin, graph, heat
            maps, movers, module tree): the ranks holding NaN/Inf first (earliest step
            first), then the lowest ranks; the others get the overview's per-step counts
            and NaN/Inf counts only (``msprobe report --rank R`` shows one in detail).
        progress: called with the name of each part as it starts (for a progress bar).
        ranks, steps: show only these ranks and steps (None: all); other ranks' log files
            and parts are not read.
    Returns:
        A dict of plain JSON values; non-finite floats as strings (see :func:`plain`).
        ``skipped`` holds one line per part of the log not read as data
        (:meth:`store.select.StoreReader.notices`), shown at the top of the page.
    Raises:
        LogNotFoundError: no log under ``dump_path``.
        ValueError: a limit below 1, or a ``threshold``/``jump`` that is not a positive number.
    """
    for label, value in (("max_rows", max_rows), ("max_steps", max_steps), ("max_tree", max_tree),
                         ("movers", movers), ("max_ranks", max_ranks)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{label}: expected an integer >= 1, got {value!r}")
    for label, value in (("threshold", threshold), ("jump", jump)):
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{label}: expected a positive number, got {value!r}")
    tick = progress or (lambda _part: None)
    reader = StoreReader(dump_path, ranks=ranks, steps=steps)
    con = connect(dump_path, reader=reader)
    try:
        tick("overview")
        # rank x step aggregates: entries from the calls, tensors and NaN/Inf from the
        # summary (compaction's _summary.parquet where compacted, else computed from the log)
        per_step = _rows(con, """
            WITH c AS (SELECT rank, step, count(*) AS entries FROM calls GROUP BY ALL)
            SELECT c.rank, c.step, c.entries, coalesce(s.tensors, 0) AS tensors
            FROM c LEFT JOIN summary s USING (rank, step) ORDER BY c.rank, c.step""")
        ranks = sorted({r["rank"] for r in per_step})
        nonfinite = _rows(con, """
            SELECT rank, min(step) AS step, sum(nan_tensors)::BIGINT AS nan_tensors,
                   sum(inf_tensors)::BIGINT AS inf_tensors,
                   arg_min(first_nan_name, step) FILTER (WHERE first_nan_name IS NOT NULL) AS first_nan_name,
                   min(step) FILTER (WHERE first_nan_name IS NOT NULL) AS first_nan_step
            FROM summary WHERE nan_tensors > 0 OR inf_tensors > 0 GROUP BY rank ORDER BY rank""")
        nonfinite = [r for r in nonfinite if r["rank"] in set(ranks)]
        detail = _detail_ranks(ranks, nonfinite, max_ranks)
        tensors_of: dict = {}
        for r in per_step:
            tensors_of[r["rank"]] = tensors_of.get(r["rank"], 0) + r["tensors"]
        has_modules = bool(_rows(con, "SELECT 1 FROM calls WHERE kind = 'module_forward' LIMIT 1"))
        key, where = _keyed(has_modules)
        out: dict[str, Any] = {
            "dump_path": str(dump_path), "meta": _first_meta(con), "ranks": ranks,
            "per_step": per_step, "nonfinite": nonfinite, "detail_ranks": detail,
            "rows_are": "modules" if has_modules else "APIs", "per_rank": {},
            "skipped": reader.notices(),
        }
        for rank in detail:
            tick(f"rank {rank}")
            out["per_rank"][str(rank)] = {
                "nonfinite": _nonfinite(con, rank),
                "output": _heat(con, rank, key, where, max_rows, max_steps),
                "grad": _heat(con, rank, _MODULE_KEY, "name LIKE '%.parameters_grad'", max_rows, max_steps),
                "movers": _movers(con, rank, movers, max_steps),
                "graph": _graph(con, rank, max_tree, max_steps),
            }
        tick("largest values")
        out["largest"] = _largest(con, float(threshold), float(jump), 1000, ranks, tensors_of)
        out["limits"] = {"max_rows": max_rows, "max_steps": max_steps, "max_tree": max_tree, "max_ranks": max_ranks}
    finally:
        con.close()
    return plain(out)
