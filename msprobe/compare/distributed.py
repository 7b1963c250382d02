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
