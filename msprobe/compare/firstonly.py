"""``--first-only`` in tensor mode: read tensor pairs only until each rank's first origin.

Tensor pairs are read in execution order, per rank, in growing chunks (each chunk ends at a
call boundary; sizes double from :data:`FIRST_CHUNK`). After each chunk the verdicts are
judged on the prefix read so far: the comparison is cut per rank after the last call
read (``alignment`` and the leaf pairs keep only the calls up to the cut). A rank stops
once the prefix names a first origin that no later call can change:

* it is an API call (forward or backward, debug save) and not ``Distributed.*`` (a
  module's or ``parameters_grad``'s verdict depends on its children, a collective's on
  the other ranks);
* no module call up to it has a recorded child beyond the cut (the rule "a module with
  recorded children is an origin only through an origin child" could otherwise turn an
  earlier module into an origin).

Everything else a call's verdict reads (its leaves, its forward call, the precision
watermark) comes earlier in execution order, so the first origin is the one a full
comparison names. The counts of ``summary.json`` then cover the calls up to each
rank's cut only.
"""
from __future__ import annotations

import pyarrow as pa

__all__ = ["tensor_first_only", "FIRST_CHUNK"]

#: pairs read per rank in the first round (then doubled each round)
FIRST_CHUNK = 64

_CUT = ("(c.done_all OR {a}.step < c.cstep OR ({a}.step = c.cstep AND {a}.ord <= c.cord))")

_UNSAFE_SQL = """
SELECT count(*) FROM alignment_all m
JOIN t_calls tc ON tc.rank = m.rank AND tc.step = m.step AND tc.parent = m.t_name
JOIN alignment_all k ON k.rank = tc.rank AND k.step = tc.step AND k.t_seq = tc.seq
WHERE m.rank = $rank AND m.kind IN ('module_forward', 'module_backward')
  AND (m.step < $ostep OR (m.step = $ostep AND m.ord <= $oord))
  AND NOT (k.step < $cstep OR (k.step = $cstep AND k.ord <= $cord))
"""


def tensor_first_only(con, target, baseline, opts, attribute) -> tuple[pa.Table, int]:
    """Judge a tensor-mode comparison reading pairs only up to each rank's first origin
    (see module docstring).

    Args:
        con: connection with ``alignment``, ``t_calls`` and the view ``leaf_pairs``.
        target, baseline: the loaded sides.
        opts: :class:`~msprobe.compare.options.CompareOptions` (``loss_scale``, ``workers``).
        attribute: cross-rank attribution callback for
            :func:`~msprobe.compare.verdicts.build_calls`.
    Returns:
        ``(tensors, n)``: the Arrow table of leaf pairs up to the cuts (registered as
        ``tensors``), and the number of tensor pairs read. ``alignment`` is left holding
        the calls up to each rank's cut.
    """
    from msprobe.compare.tensordata import (TENSOR_COLUMNS, TensorSource, measure_pairs, metrics_table,
                                            pending_pairs)
    from msprobe.compare.verdicts import build_calls, leaf_verdicts_sql

    by_rank: dict[int, list] = {}
    for item in pending_pairs(con):
        by_rank.setdefault(item[0], []).append(item)
    ranks = [r for (r,) in con.execute("SELECT DISTINCT rank FROM alignment ORDER BY rank").fetchall()]
    con.execute("ALTER TABLE alignment RENAME TO alignment_all")
    sources = (TensorSource(target), TensorSource(baseline))
    pos = {r: 0 for r in ranks}
    cut: dict[int, tuple] = {}
    done: set = set()
    rows: list[dict] = []
    chunk = FIRST_CHUNK
    tensors = None
    while True:
        for r in ranks:
            if r in done:
                continue
            todo = by_rank.get(r, [])
            i = pos[r]
            j = min(len(todo), i + chunk)
            while 0 < j < len(todo) and (todo[j][1], todo[j][12]) == (todo[j - 1][1], todo[j - 1][12]):
                j += 1                      # finish the call
            rows.extend(measure_pairs(target, baseline, todo[i:j], opts.loss_scale, opts.workers, sources))
            pos[r] = j
            cut[r] = (None, None) if j >= len(todo) else (todo[j - 1][1], todo[j - 1][12])
        chunk *= 2
        cuts = pa.table({"rank": pa.array(ranks, pa.int32()),
                         "cstep": pa.array([cut[r][0] for r in ranks], pa.int32()),
                         "cord": pa.array([cut[r][1] for r in ranks], pa.float64()),
                         "done_all": pa.array([cut[r][0] is None for r in ranks], pa.bool_())})
        con.register("lp_cut", cuts)
        con.register("tensor_metrics", metrics_table(rows))
        con.execute("CREATE OR REPLACE VIEW alignment AS SELECT a.* FROM alignment_all a JOIN lp_cut c "
                    f"ON c.rank = a.rank WHERE {_CUT.format(a='a')}")
        pairs = f"SELECT lp.* FROM leaf_pairs lp JOIN lp_cut c ON c.rank = lp.rank WHERE {_CUT.format(a='lp')}"
        tensors = con.sql(leaf_verdicts_sql(pairs, TENSOR_COLUMNS)).to_arrow_table()
        con.register("tensors", tensors)
        build_calls(con, attribute)
        for r in ranks:
            if r in done:
                continue
            if cut[r][0] is None:
                done.add(r)
                continue
            first = con.execute("SELECT step, ord, t_name, kind FROM calls WHERE rank = ? AND verdict = 'origin' "
                                "ORDER BY step, ord LIMIT 1", [r]).fetchall()
            if not first:
                continue
            ostep, oord, name, kind = first[0]
            if kind not in ("api_forward", "api_backward", "debug_save") or name.startswith("Distributed."):
                continue
            unsafe = con.execute(_UNSAFE_SQL, {"rank": r, "ostep": ostep, "oord": oord, "cstep": cut[r][0],
                                               "cord": cut[r][1]}).fetchall()[0][0]
            if not unsafe:
                done.add(r)
        if len(done) == len(ranks):
            break
    con.execute("CREATE TABLE alignment_cut AS SELECT * FROM alignment ORDER BY rank, step, ord")
    con.execute("DROP VIEW alignment")
    con.execute("ALTER TABLE alignment_cut RENAME TO alignment")
    con.execute("DROP TABLE alignment_all")
    con.unregister("lp_cut")
    con.unregister("tensor_metrics")
    con.execute("DROP TABLE IF EXISTS calls")
    return tensors, len(rows)
