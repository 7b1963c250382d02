"""Cross-rank attribution of divergences received from another rank,
and ``--rank-map``.

Collectives: ``Distributed.*`` calls pair across ranks by API, counter and group: within
one step the call named ``Distributed.all_reduce.0.forward`` on rank 0 is the same
collective as the one of that name on rank 1 (each rank counts its own calls, and every
member of a group makes the same collective calls in the same order). A rank's call that
the per-rank verdicts judge an ``origin`` (clean inputs, diverged output) is re-judged
``propagated`` when another member of the collective fed it diverged data: that rank's
same call has a diverged, non-finite or structural input.

Directed operations count only the ranks whose data reaches this one (the source first):
``broadcast``/``scatter`` (:data:`DIRECTED_FROM_SOURCE`) only the root (``src``);
``reduce``/``gather`` (:data:`DIRECTED_TO_DEST`) deliver only to the root (``dst``), so
only the root's call is attributed, to the members that fed it bad data.

Point-to-point (:data:`P2P_SEND`, :data:`P2P_RECV`, and the ``isend``/``irecv`` items of
``batch_isend_irecv``): names differ across ranks, so sends and receives pair by order,
as the transport delivers them: within a step, the k-th send from rank s to rank d
(``dst``) carries the data of the k-th receive on d from s (``src``). A receive judged
``origin`` whose matching send had a bad tensor input is attributed to the sender. A
receive from any source (``src`` None) is not attributed.

The attributed row gets ``attributed_to`` (the sending rank) and a reason naming it; the
sending rank's first origin is then the global origin.
"""
from __future__ import annotations

import json
from typing import Optional

import duckdb

__all__ = ["attribute_collectives", "apply_rank_map", "DIRECTED_FROM_SOURCE", "DIRECTED_TO_DEST",
           "P2P_SEND", "P2P_RECV"]

#: collectives whose data flows from one root rank: API → (keyword, positional index of the root)
DIRECTED_FROM_SOURCE = {"broadcast": ("src", 1), "scatter": ("src", 2), "scatter_tensor": ("src", 1)}
#: collectives whose data flows to one root rank (PyTorch ``gather(t, list, dst)``, MindSpore
#: ``gather_into_tensor(t, dst)``)
DIRECTED_TO_DEST = {"reduce": ("dst", 1), "gather": ("dst", 2), "gather_into_tensor": ("dst", 1)}
#: point-to-point sends / receives: API → (keyword, positional index of the peer)
P2P_SEND = {"send": ("dst", 1), "isend": ("dst", 1)}
P2P_RECV = {"recv": ("src", 1), "irecv": ("src", 1)}
_BATCH = "batch_isend_irecv"
_NOT_COLLECTIVE = tuple(P2P_SEND) + tuple(P2P_RECV) + (_BATCH, "barrier")
_BAD = ("diverged", "nonfinite", "structural")

_INPUT_SQL = """
SELECT rank, step, t_call, io, arg, verdict, t_value_json
FROM tensors WHERE t_call LIKE 'Distributed.%' AND role = 'in'
"""


def _api(name: str) -> str:
    return name.split(".")[1] if name.count(".") >= 3 else name


def _value(value_json: Optional[str]):
    if value_json is None:
        return None
    try:
        v = json.loads(value_json)
    except ValueError:
        return None
    return v.get("value") if isinstance(v, dict) else v


def _int_value(value_json: Optional[str]) -> Optional[int]:
    v = _value(value_json)
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


def _root(api: str, args: dict, table: dict) -> Optional[int]:
    """The root/peer rank of a call from its recorded arguments (keyword, then position)."""
    kw, pos = table[api]
    for key in (("input_kwargs", kw), ("input_args", str(pos))):
        if key in args:
            v = _int_value(args[key][1])
            if v is not None:
                return v
    return None


def _tensor_bad(args: dict, prefix: str = "") -> bool:
    """The data tensor of a send (``input_args.0`` or keyword ``tensor``; nested leaves
    included) has a bad verdict."""
    heads = (("input_args", prefix + "0"), ("input_kwargs", prefix + "tensor")) if not prefix else \
        (("input_args", prefix + "tensor"),)
    return any(verdict in _BAD for (io, arg), (verdict, _v) in args.items()
               for hio, harg in heads if io == hio and (arg == harg or arg.startswith(harg + ".")))


def _p2p_events(api: str, args: dict) -> list[tuple[str, Optional[int], bool]]:
    """``[(send|recv, peer, bad tensor)]`` of one point-to-point call, in call order."""
    if api in P2P_SEND:
        return [("send", _root(api, args, P2P_SEND), _tensor_bad(args))]
    if api in P2P_RECV:
        return [("recv", _root(api, args, P2P_RECV), False)]
    events = []
    i = 0
    while True:     # batch_isend_irecv([P2POp, ...]): items split into leaves, or one object value each
        whole = args.get(("input_args", f"0.{i}"))
        if ("input_args", f"0.{i}.op") in args:
            op = _value(args[("input_args", f"0.{i}.op")][1])
            peer = _int_value(args.get(("input_args", f"0.{i}.peer"), (None, None))[1])
            bad = _tensor_bad(args, f"0.{i}.")
        elif whole is not None:
            try:
                obj = json.loads(whole[1]) if whole[1] else None
            except ValueError:
                obj = None
            if not isinstance(obj, dict) or "op" not in obj:
                break
            op = obj["op"].get("value") if isinstance(obj["op"], dict) else obj["op"]
            peer = obj.get("peer")
            peer = peer.get("value") if isinstance(peer, dict) else peer
            peer = peer if isinstance(peer, int) and not isinstance(peer, bool) else None
            bad = whole[0] in _BAD
        else:
            break
        kind = "send" if isinstance(op, str) and "send" in op else "recv"
        events.append((kind, peer, kind == "send" and bad))
        i += 1
    return events


def _attribute(r: dict, via: str, senders: list[int]) -> None:
    r["verdict"] = "propagated"
    r["attributed_to"] = senders[0]
    r["reason"] = (f"received through {r['t_name']} from rank {senders[0]}"
                   + (f" ({via})" if via else "")
                   + (f" (also ranks {senders[1:]})" if len(senders) > 1 else ""))


def _attribute_p2p(rows: list[dict], args_of: dict) -> int:
    sends: dict[tuple, list[bool]] = {}                 # (step, src, dst) → bad per send, in order
    send_names: dict[tuple, list[str]] = {}
    recvs: dict[tuple, list[dict]] = {}                 # (step, src, dst) → receiving row per recv
    for r in sorted(rows, key=lambda r: (r["rank"], r["step"], r.get("ord") or 0)):
        name = r["t_name"]
        if not name or not name.startswith("Distributed.") or _api(name) not in \
                tuple(P2P_SEND) + tuple(P2P_RECV) + (_BATCH,):
            continue
        for kind, peer, bad in _p2p_events(_api(name), args_of.get((r["step"], name, r["rank"]), {})):
            if kind == "send" and peer is not None:
                sends.setdefault((r["step"], r["rank"], peer), []).append(bad)
                send_names.setdefault((r["step"], r["rank"], peer), []).append(name)
            elif kind == "recv" and peer is not None:
                recvs.setdefault((r["step"], peer, r["rank"]), []).append(r)
    found: dict[int, tuple[list[int], list[str]]] = {}
    for key, receiving in recvs.items():
        step, src, dst = key
        bad = sends.get(key, [])
        for k, r in enumerate(receiving):
            if r.get("verdict") == "origin" and k < len(bad) and bad[k]:
                senders, via = found.setdefault(id(r), ([], []))
                if src not in senders:
                    senders.append(src)
                    via.append(send_names[key][k])
    by_id = {id(r): r for r in rows}
    for rid, (senders, via) in found.items():
        order = sorted(range(len(senders)), key=lambda i: senders[i])
        _attribute(by_id[rid], f"sent by {via[order[0]]}", [senders[i] for i in order])
    return len(found)


def attribute_collectives(con: duckdb.DuckDBPyConnection, rows: list[dict]) -> int:
    """Re-judge ``Distributed.*`` calls whose divergence came from another rank (see the
    module docstring): collectives, rooted collectives and point-to-point.

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
    group_of: dict[tuple, frozenset] = {}
    args_of: dict[tuple, dict] = {}
    for rank, step, call, io, arg, verdict, value_json in con.execute(_INPUT_SQL).fetchall():
        key = (step, call, rank)
        args_of.setdefault(key, {})[(io, arg)] = (verdict, value_json)
        if verdict in _BAD:
            bad_in[key] = True
        if (io == "input_kwargs" and arg == "group") or value_json and '"group_ranks"' in value_json:
            g = _group(value_json)
            if g is not None:
                group_of[key] = g
    members: dict[tuple, list[int]] = {}
    for r in rows:
        if r["t_name"] and r["t_name"].startswith("Distributed.") and r["b_name"] is not None:
            members.setdefault((r["step"], r["t_name"]), []).append(r["rank"])
    changed = _attribute_p2p(rows, args_of)
    for r in rows:
        name = r["t_name"]
        if r.get("verdict") != "origin" or not name or not name.startswith("Distributed."):
            continue
        api = _api(name)
        if api in _NOT_COLLECTIVE:
            continue
        step, rank = r["step"], r["rank"]
        key = (step, name, rank)
        if bad_in.get(key):
            continue   # this rank's own input is already bad
        group = group_of.get(key)
        peers = [p for p in members.get((step, name), []) if p != rank and (group is None or p in group)]
        args = args_of.get(key, {})
        if api in DIRECTED_FROM_SOURCE:
            src = _root(api, args, DIRECTED_FROM_SOURCE)
            peers = [p for p in peers if p == src] if src is not None else peers
        elif api in DIRECTED_TO_DEST:
            dst = _root(api, args, DIRECTED_TO_DEST)
            if dst is not None and dst != rank:
                continue   # only the destination receives the others' data
        senders = sorted(p for p in peers if bad_in.get((step, name, p)))
        if senders:
            _attribute(r, "", senders)
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

