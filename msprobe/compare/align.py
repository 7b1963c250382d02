"""Call matching: pairs the calls of target and baseline per (rank, step).

Steps (issue 8, "Matching"):

1. Forward-kind calls (API forward, module forward, debug save) of each side, in
   execution order, become tokens. API calls: ``(name without counter, signature)``
   where the signature lists each tensor leaf as ``(io, arg, dtype class, shape)``
   (floats of any width are one class, so bf16 pairs with fp32). Module calls and debug
   saves: their full name.
2. Module anchors: module forward calls with equal names (path + class + per-path call
   index) pair; the largest order-consistent subset (longest increasing subsequence) is
   kept.
3. Between consecutive anchors, the remaining calls align by Myers' shortest edit script
   on their tokens (:mod:`msprobe.compare.myers`); a segment needing more than
   ``max_d`` edits falls back to pairing equal tokens in order.
4. Backward calls inherit their forward's pairing (API ``X.n.backward`` from
   ``X.n.forward``; module ``P.backward.n`` from ``P.forward.n``, spec section 9 fix 5;
   ``P.parameters_grad`` from any paired forward of ``P``); backward calls left over pair
   by equal name.

Every call ends up in exactly one alignment row: paired, ``inserted`` (target only) or
``deleted`` (baseline only).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Optional

import pyarrow as pa

from msprobe.compare.myers import EditLimitExceeded, align as myers_align

__all__ = ["Call", "align_step", "ALIGN_SCHEMA", "base_name", "FORWARD_KINDS"]

FORWARD_KINDS = ("api_forward", "module_forward", "debug_save")
ALIGN_SCHEMA = pa.schema([
    ("rank", pa.int32()), ("step", pa.int32()), ("ord", pa.float64()),
    ("t_name", pa.string()), ("b_name", pa.string()), ("t_seq", pa.int64()), ("b_seq", pa.int64()),
    ("kind", pa.string()), ("how", pa.string()),
])


@dataclass(frozen=True, slots=True)
class Call:
    """One call as the aligner sees it: ``sig`` is an order-independent hash of the
    tensor-leaf signature (XOR of ``hash(io, arg, dtype class, shape)`` over its tensor
    leaves; (io, arg) is unique within a call, so no two terms cancel)."""

    seq: int
    name: str
    kind: str
    sig: int


def base_name(name: str, kind: str) -> str:
    """Name without counter and direction: ``Tensor.__add__.1.forward`` → ``Tensor.__add__``,
    ``Module.fc.Linear.forward.0`` → ``Module.fc.Linear``, ``Module.fc.Linear.parameters_grad``
    → ``Module.fc.Linear``, debug save ``y.0`` → ``y``."""
    if kind == "parameters_grad":
        return name[: -len(".parameters_grad")]
    parts = name.rsplit(".", 2)
    if kind in ("debug_save",):
        return name.rsplit(".", 1)[0]
    return parts[0] if len(parts) == 3 else name


def _counter(name: str, kind: str) -> str:
    if kind in ("module_forward", "module_backward"):
        return name.rsplit(".", 1)[-1]
    return name.rsplit(".", 2)[-2]


def _token(call: Call):
    if call.kind == "api_forward":
        return ("api", base_name(call.name, call.kind), call.sig)
    return ("name", base_name(call.name, call.kind) if call.kind == "module_forward" else call.name, call.sig)


def _lis(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Longest subsequence of ``pairs`` (sorted by first) increasing in the second."""
    tails: list[int] = []
    tail_index: list[int] = []
    prev = [-1] * len(pairs)
    for i, (_, b) in enumerate(pairs):
        pos = bisect.bisect_left(tails, b)
        if pos == len(tails):
            tails.append(b)
            tail_index.append(i)
        else:
            tails[pos] = b
            tail_index[pos] = i
        prev[i] = tail_index[pos - 1] if pos else -1
    out = []
    i = tail_index[-1] if tail_index else -1
    while i >= 0:
        out.append(pairs[i])
        i = prev[i]
    return out[::-1]


def _pair_segment(t: list[Call], b: list[Call], max_d: int) -> list[tuple[int, int, str]]:
    ta = [_token(c) for c in t]
    tb = [_token(c) for c in b]
    try:
        return [(i, j, "myers") for i, j in myers_align(ta, tb, max_d=max_d)]
    except EditLimitExceeded:
        # too different for an edit script: pair equal tokens in order (greedy, linear)
        positions: dict = {}
        for j, tok in enumerate(tb):
            positions.setdefault(tok, []).append(j)
        out, last = [], -1
        for i, tok in enumerate(ta):
            js = positions.get(tok)
            if not js:
                continue
            k = bisect.bisect_right(js, last)
            if k < len(js):
                last = js[k]
                out.append((i, last, "greedy"))
        return out


def align_step(target: list[Call], baseline: list[Call], *, max_d: int = 20000) -> list[tuple]:
    """Align the calls of one (rank, step).

    Args:
        target, baseline: the calls of each side in execution order (``seq`` ascending).
        max_d: edit budget per segment for Myers before the greedy fallback.
    Returns:
        rows ``(ord, t_name, b_name, t_seq, b_seq, kind, how)``; ``ord`` orders them in
        target execution order (deleted calls right after the paired call before them),
        ``how`` is one of ``anchor``, ``myers``, ``greedy``, ``inherited``, ``name``,
        ``inserted``, ``deleted``.
    """
    tf = [c for c in target if c.kind in FORWARD_KINDS]
    bf = [c for c in baseline if c.kind in FORWARD_KINDS]
    # module anchors
    b_module = {c.name: j for j, c in enumerate(bf) if c.kind == "module_forward"}
    cand = [(i, b_module[c.name]) for i, c in enumerate(tf) if c.kind == "module_forward" and c.name in b_module]
    anchors = _lis(cand)
    pairs: list[tuple[int, int, str]] = []
    prev_i, prev_j = -1, -1
    for i, j in anchors + [(len(tf), len(bf))]:
        seg = _pair_segment(tf[prev_i + 1: i], bf[prev_j + 1: j], max_d)
        pairs.extend((prev_i + 1 + a, prev_j + 1 + b, how) for a, b, how in seg)
        if i < len(tf):
            pairs.append((i, j, "anchor"))
        prev_i, prev_j = i, j
    fwd_map = {tf[i].name: (bf[j].name, how) for i, j, how in pairs}
    t_by_name = {c.name: c for c in target}
    b_by_name = {c.name: c for c in baseline}
    paired: dict[str, tuple[str, str]] = dict(fwd_map)
    b_used = {bn for bn, _ in fwd_map.values()}
    # module path pairing for parameters_grad
    path_map: dict[str, str] = {}
    for tn, (bn, _) in fwd_map.items():
        tc, bc = t_by_name[tn], b_by_name[bn]
        if tc.kind == "module_forward" and bc.kind == "module_forward":
            path_map.setdefault(base_name(tn, tc.kind), base_name(bn, bc.kind))
    leftovers = []
    for c in target:
        if c.kind in FORWARD_KINDS:
            continue
        partner = None
        if c.kind == "api_backward":
            fwd = c.name[: -len("backward")] + "forward"
            if fwd in fwd_map:
                bn = fwd_map[fwd][0]
                partner = bn[: -len("forward")] + "backward"
        elif c.kind == "module_backward":
            stem, _, counter = c.name.rsplit(".", 2)
            fwd = f"{stem}.forward.{counter}"
            if fwd in fwd_map:
                bstem, _, bcounter = fwd_map[fwd][0].rsplit(".", 2)
                partner = f"{bstem}.backward.{bcounter}"
        elif c.kind == "parameters_grad":
            bpath = path_map.get(base_name(c.name, c.kind))
            if bpath is not None:
                partner = bpath + ".parameters_grad"
        if partner is not None and partner in b_by_name and partner not in b_used \
                and b_by_name[partner].kind == c.kind:
            paired[c.name] = (partner, "inherited")
            b_used.add(partner)
        else:
            leftovers.append(c)
    for c in leftovers:
        if c.name in b_by_name and c.name not in b_used and b_by_name[c.name].kind == c.kind:
            paired[c.name] = (c.name, "name")
            b_used.add(c.name)
    rows = []
    b_to_t_seq = {}
    for c in target:
        if c.name in paired:
            bn, how = paired[c.name]
            bc = b_by_name[bn]
            b_to_t_seq[bn] = c.seq
            rows.append((float(c.seq), c.name, bn, c.seq, bc.seq, c.kind, how))
        else:
            rows.append((float(c.seq), c.name, None, c.seq, None, c.kind, "inserted"))
    last_t, k = -1.0, 0
    for c in baseline:
        if c.name in b_to_t_seq:
            last_t, k = float(b_to_t_seq[c.name]), 0
        else:
            k += 1
            rows.append((last_t + 0.5 - 0.5 / (k + 1), None, c.name, None, c.seq, c.kind, "deleted"))
    rows.sort(key=lambda r: r[0])
    return rows
