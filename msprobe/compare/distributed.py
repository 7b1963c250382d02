"""Cross-rank attribution of divergences received through collectives (issue 8, "The
answer", multi-rank).

``Distributed.*`` calls pair across ranks by API, counter and group: within one step the
call named ``Distributed.all_reduce.0.forward`` on rank 0 is the same collective as the
one of that name on rank 1 (each rank counts its own calls, and every member of a group
makes the same collective calls in the same order). A rank's call that the per-rank
verdicts judge an ``origin`` (clean inputs, diverged output) is re-judged
``propagated`` when another member of the collective fed it diverged data: that rank's
same call has a diverged, non-finite or structural input. Directed collectives
(``broadcast``, ``scatter``: the root's data reaches the others) only count the source
rank; ``reduce``/``gather`` only deliver to the destination. The attributed row gets
``attributed_to`` (the sending rank) and a reason naming it; the sending rank's first
origin is then the global origin.

Point-to-point pairs (``isend``/``irecv``) are not attributed yet (names differ across
ranks).
"""
from __future__ import annotations

import json
from typing import Optional

import duckdb

__all__ = ["attribute_collectives", "DIRECTED_FROM_SOURCE"]

#: collectives whose data flows from one root rank (keyword, positional index of the root)
DIRECTED_FROM_SOURCE = {"broadcast": ("src", 1), "scatter": ("src", 2)}
_P2P = ("isend", "irecv", "send", "recv", "batch_isend_irecv", "barrier")

_INPUT_SQL = """
SELECT rank, step, t_call, io, arg, verdict, t_value_json
FROM tensors WHERE t_call LIKE 'Distributed.%' AND role = 'in'
"""


def _api(name: str) -> str:
    return name.split(".")[1] if name.count(".") >= 3 else name


def _int_value(value_json: Optional[str]) -> Optional[int]:
    if value_json is None:
        return None
    try:
        v = json.loads(value_json)
    except ValueError:
        return None
    if isinstance(v, dict):
        v = v.get("value")
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _group(value_json: Optional[str]) -> Optional[frozenset]:
    try:
        v = json.loads(value_json) if value_json else None
    except ValueError:
        return None
    if isinstance(v, dict):
        ranks = v.get("group_ranks") or v.get("value")
        if isinstance(ranks, list) and all(isinstance(r, int) for r in ranks):
            return frozenset(ranks)
    return None


def attribute_collectives(con: duckdb.DuckDBPyConnection, rows: list[dict]) -> int:
    """Re-judge collective calls whose divergence came from another rank (see module doc).

    Args:
        con: the comparison's connection (table ``tensors``).
        rows: call rows after :func:`msprobe.compare.verdicts.call_verdicts`; changed in
            place (``verdict``, ``reason``, ``attributed_to``).
    Returns:
        the number of rows re-judged.
    """
    if len({r["rank"] for r in rows}) < 2:
        return 0
    bad_in: dict[tuple, bool] = {}
    src_of: dict[tuple, int] = {}
    group_of: dict[tuple, frozenset] = {}
    for rank, step, call, io, arg, verdict, value_json in con.execute(_INPUT_SQL).fetchall():
        key = (step, call, rank)
        if verdict in ("diverged", "nonfinite", "structural"):
            bad_in[key] = True
        api = _api(call)
        if api in DIRECTED_FROM_SOURCE:
            kw, pos = DIRECTED_FROM_SOURCE[api]
            if (io == "input_kwargs" and arg == kw) or (io == "input_args" and arg == str(pos)):
                v = _int_value(value_json)
                if v is not None:
                    src_of[key] = v
        if (io == "input_kwargs" and arg == "group") or value_json and '"group_ranks"' in value_json:
            g = _group(value_json)
            if g is not None:
                group_of[key] = g
    members: dict[tuple, list[int]] = {}
    for r in rows:
        if r["t_name"] and r["t_name"].startswith("Distributed.") and r["b_name"] is not None:
            members.setdefault((r["step"], r["t_name"]), []).append(r["rank"])
    changed = 0
    for r in rows:
        name = r["t_name"]
        if r.get("verdict") != "origin" or not name or not name.startswith("Distributed."):
            continue
        api = _api(name)
        if api in _P2P:
            continue
        step, rank = r["step"], r["rank"]
        if bad_in.get((step, name, rank)):
            continue   # this rank's own input is already bad
        group = group_of.get((step, name, rank))
        peers = [p for p in members.get((step, name), []) if p != rank and (group is None or p in group)]
        if api in DIRECTED_FROM_SOURCE:
            src = src_of.get((step, name, rank))
            peers = [p for p in peers if p == src] if src is not None else peers
        senders = sorted(p for p in peers if bad_in.get((step, name, p)))
        if senders:
            r["verdict"] = "propagated"
            r["attributed_to"] = senders[0]
            r["reason"] = (f"received through {name} from rank {senders[0]}"
                           + (f" (also ranks {senders[1:]})" if len(senders) > 1 else ""))
            changed += 1
    return changed


def apply_rank_map(target, baseline, rank_map: dict, notes: list) -> None:
    """``--rank-map``: renumber the BASELINE's ranks so that BASELINE rank ``rank_map[t]``
    compares with TARGET rank ``t``; other BASELINE ranks keep their id unless the map
    gives that id to another rank (then they are not compared, and a note says so).
    Tensor-file directories follow their rank.

    Args:
        target, baseline: :class:`~msprobe.compare.load.Side` objects (changed in place).
        rank_map: ``{TARGET rank: BASELINE rank}`` (:func:`~msprobe.compare.options.parse_rank_map`).
        notes: the comparison's notes.
    Raises:
        CompareInputError: a rank of the map is not in its dump (the ranks found are named).
    """
    import os

    import pyarrow as pa

    from msprobe.compare.errors import CompareInputError

    t_ranks = sorted(set(target.calls["rank"].to_pylist()))
    b_ranks = sorted(set(baseline.calls["rank"].to_pylist()))
    for t, b in rank_map.items():
        if t not in t_ranks:
            raise CompareInputError(f"--rank-map {t}:{b}: TARGET {target.path!r} has no rank {t} "
                                    f"(ranks {t_ranks})")
        if b not in b_ranks:
            raise CompareInputError(f"--rank-map {t}:{b}: BASELINE {baseline.path!r} has no rank {b} "
                                    f"(ranks {b_ranks})")
    inverse = {b: t for t, b in rank_map.items()}
    new_of = {}
    for b in b_ranks:
        if b in inverse:
            new_of[b] = inverse[b]
        elif b in rank_map:            # its id now belongs to the rank mapped onto it
            notes.append(f"--rank-map: BASELINE rank {b} is not compared (TARGET rank {b} pairs with "
                         f"BASELINE rank {rank_map[b]})")
        else:
            new_of[b] = b
    notes.append("--rank-map: " + ", ".join(f"TARGET rank {t} ~ BASELINE rank {b}" for t, b in sorted(rank_map.items())))

    def remap(table: pa.Table) -> pa.Table:
        old = table["rank"].to_pylist()
        keep = pa.array([r in new_of for r in old], pa.bool_())
        table = table.set_column(table.schema.get_field_index("rank"), "rank",
                                 pa.array([new_of.get(r, r) for r in old], table.schema.field("rank").type))
        return table.filter(keep)

    dirs = {}
    steps = set(baseline.calls["step"].to_pylist())
    for b, t in new_of.items():
        for s in steps:
            d = baseline.data_dirs.get((b, s))
            if d is None:
                cand = os.path.join(str(baseline.path), f"step{s}", f"rank{b}", "dump_tensor_data")
                d = cand if os.path.isdir(cand) else None
            if d is not None:
                dirs[(t, s)] = d
    baseline.calls, baseline.leaves = remap(baseline.calls), remap(baseline.leaves)
    baseline.data_dirs = dirs

