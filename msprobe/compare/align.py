"""Call matching: pairs the calls of target and baseline per (rank, step).

Steps:

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
    except EditLimitExceeded:   # too different for an edit script
        return [(i, j, "greedy") for i, j in _greedy_pairs(ta, tb)]


def _greedy_pairs(ta: list, tb: list) -> list[tuple[int, int]]:
    """Pairs ``(i, j)`` of equal tokens in order, each ``ta[i]`` with the first equal
    ``tb[j]`` after the previous pair (greedy, linear; the fallback where Myers gives up)."""
    positions: dict = {}
    for j, tok in enumerate(tb):
        positions.setdefault(tok, []).append(j)
    out, last = [], -1
    for i, tok in enumerate(ta):
        js = positions.get(tok)
        if js:
            k = bisect.bisect_right(js, last)
            if k < len(js):
                last = js[k]
                out.append((i, last))
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


# --- the whole alignment over DuckDB tables (what the engine runs) -------------------------
# Same pairing as align_step, but tokens are 64-bit hashes computed in SQL, only the forward
# tokens reach Python (as numpy arrays, for the anchors' LIS and Myers per segment), and
# backward inheritance, name pairing, inserted/deleted rows and ``ord`` are SQL.

_TOKEN_SQL = r"""
SELECT c.rank, c.step, c.seq, c.name, c.kind,
  hash(CASE WHEN c.kind = 'api_forward' THEN 'api' ELSE 'name' END,
       CASE WHEN c.kind IN ('api_forward', 'module_forward')
            THEN regexp_replace(c.name, '\.[^.]*(\.[^.]*)?$', '') ELSE c.name END, coalesce(s.sig, 0)) AS tok
FROM {side}_calls c JOIN common_keys USING (rank, step) LEFT JOIN (
  SELECT rank, step, cseq, bit_xor(hash(io, arg, sclass, shape)) AS sig
  FROM {side}_leaves l WHERE leaf_kind = 'tensor'{outputs_only} GROUP BY ALL) s
  ON s.rank = c.rank AND s.step = c.step AND s.cseq = c.seq
WHERE c.kind IN ('api_forward', 'module_forward', 'debug_save')
"""

_PAIRS_SQL = r"""
CREATE OR REPLACE TABLE alignment AS
WITH T AS (SELECT c.rank, c.step, c.seq, c.name, c.kind FROM t_calls c JOIN common_keys USING (rank, step)),
B AS (SELECT c.rank, c.step, c.seq, c.name, c.kind FROM b_calls c JOIN common_keys USING (rank, step)),
fp AS (SELECT f.rank, f.step, f.t_seq, f.b_seq, f.how, t.name AS t_name, t.kind AS t_kind, b.name AS b_name,
              b.kind AS b_kind
       FROM fwd_pairs f JOIN T t ON t.rank = f.rank AND t.step = f.step AND t.seq = f.t_seq
       JOIN B b ON b.rank = f.rank AND b.step = f.step AND b.seq = f.b_seq),
path_map AS (SELECT rank, step, regexp_replace(t_name, '\.[^.]*(\.[^.]*)?$', '') AS tpath,
                    arg_min(regexp_replace(b_name, '\.[^.]*(\.[^.]*)?$', ''), t_seq) AS bpath
             FROM fp WHERE t_kind = 'module_forward' AND b_kind = 'module_forward' GROUP BY ALL),
cand AS (
  SELECT t.rank, t.step, t.seq AS t_seq, t.name, t.kind,
    CASE t.kind WHEN 'api_backward' THEN regexp_replace(f.b_name, 'forward$', 'backward')
                WHEN 'module_backward' THEN regexp_replace(f.b_name, '\.[^.]*\.([^.]*)$', '.backward.\1')
                WHEN 'parameters_grad' THEN pm.bpath || '.parameters_grad' END AS partner
  FROM T t
  LEFT JOIN fp f ON t.kind IN ('api_backward', 'module_backward') AND f.rank = t.rank AND f.step = t.step
    AND f.t_name = CASE t.kind WHEN 'api_backward' THEN regexp_replace(t.name, 'backward$', 'forward')
                               ELSE regexp_replace(t.name, '\.[^.]*\.([^.]*)$', '.forward.\1') END
  LEFT JOIN path_map pm ON t.kind = 'parameters_grad' AND pm.rank = t.rank AND pm.step = t.step
    AND pm.tpath = left(t.name, length(t.name) - 16)
  WHERE t.kind NOT IN ('api_forward', 'module_forward', 'debug_save')),
inh AS (
  SELECT rank, step, t_seq, b_seq, 'inherited' AS how, partner FROM (
    SELECT c.rank, c.step, c.t_seq, b.seq AS b_seq, c.partner,
           row_number() OVER (PARTITION BY c.rank, c.step, c.partner ORDER BY c.t_seq) AS k
    FROM cand c JOIN B b ON b.rank = c.rank AND b.step = c.step AND b.name = c.partner AND b.kind = c.kind)
  WHERE k = 1),
nm AS (
  SELECT c.rank, c.step, c.t_seq, b.seq AS b_seq, 'name' AS how
  FROM cand c JOIN B b ON b.rank = c.rank AND b.step = c.step AND b.name = c.name AND b.kind = c.kind
  WHERE NOT EXISTS (SELECT 1 FROM inh i WHERE i.rank = c.rank AND i.step = c.step AND i.t_seq = c.t_seq)
    AND NOT EXISTS (SELECT 1 FROM inh i WHERE i.rank = c.rank AND i.step = c.step AND i.partner = c.name)),
P AS (SELECT rank, step, t_seq, b_seq, how FROM fp UNION ALL SELECT rank, step, t_seq, b_seq, how FROM inh
      UNION ALL SELECT rank, step, t_seq, b_seq, how FROM nm),
tr AS (SELECT t.rank, t.step, t.seq::DOUBLE AS ord, t.name AS t_name, b.name AS b_name, t.seq AS t_seq,
              p.b_seq, t.kind, coalesce(p.how, 'inserted') AS how
       FROM T t LEFT JOIN P p ON p.rank = t.rank AND p.step = t.step AND p.t_seq = t.seq
       LEFT JOIN B b ON b.rank = p.rank AND b.step = p.step AND b.seq = p.b_seq),
-- per baseline call: g = paired calls so far, last_t = the target seq of the last of them
-- (integer columns only: the window sorts them; names join back for the deleted calls)
bw AS (SELECT b.rank, b.step, b.seq, p.t_seq AS pt, count(p.t_seq) OVER w AS g,
              last_value(p.t_seq IGNORE NULLS) OVER w AS last_t
       FROM B b LEFT JOIN P p ON p.rank = b.rank AND p.step = b.step AND p.b_seq = b.seq
       WINDOW w AS (PARTITION BY b.rank, b.step ORDER BY b.seq ROWS UNBOUNDED PRECEDING)),
-- a deleted call goes after the paired call before it (k-th deleted one since: + 0.5 - 0.5 / (k + 1))
bg AS (SELECT *, row_number() OVER (PARTITION BY rank, step, g ORDER BY seq) AS k FROM bw WHERE pt IS NULL),
dr AS (SELECT bg.rank, bg.step, (CASE WHEN g = 0 THEN -1.0::DOUBLE ELSE last_t::DOUBLE END) + 0.5::DOUBLE
                          - 0.5::DOUBLE / (k + 1)::DOUBLE AS ord,
              NULL::VARCHAR AS t_name, bb.name AS b_name, NULL::BIGINT AS t_seq, bg.seq AS b_seq, bb.kind,
              'deleted' AS how
       FROM bg JOIN B bb ON bb.rank = bg.rank AND bb.step = bg.step AND bb.seq = bg.seq)
SELECT rank::INTEGER AS rank, step::INTEGER AS step, ord, t_name, b_name, t_seq::BIGINT AS t_seq,
       b_seq::BIGINT AS b_seq, kind, how
FROM (SELECT * FROM tr UNION ALL SELECT * FROM dr) ORDER BY rank, step, ord
"""


def _segment_pairs(ta, tb, max_d: int) -> tuple:
    """Pairs of one segment between anchors: ``(i array, j array, how)``; numpy int arrays
    ``ta``/``tb`` of tokens. Equal segments pair position by position (what Myers gives);
    a segment whose edit distance surely exceeds ``max_d`` (by the token multiset bound)
    goes straight to the greedy fallback, as Myers would after exhausting its budget."""
    import numpy as np

    n, m = len(ta), len(tb)
    if n == 0 or m == 0:
        return None
    if n == m and np.array_equal(ta, tb):
        idx = np.arange(n)
        return idx, idx, "myers"
    lists = ta.tolist(), tb.tolist()
    # Myers trims the common prefix and suffix, then gives up when the middle needs more
    # than max_d edits; n + m - 2 * (shared tokens, as multisets) bounds those from below
    k = min(n, m)
    diff = np.flatnonzero(ta[:k] != tb[:k])
    lo = int(diff[0]) if diff.size else k
    k2 = k - lo
    diff = np.flatnonzero(ta[::-1][:k2] != tb[::-1][:k2])
    hi = int(diff[0]) if diff.size else k2
    mid_a, mid_b = ta[lo: n - hi], tb[lo: m - hi]
    hopeless, shared = False, -1
    if len(mid_a) and len(mid_b):
        ua, ca = np.unique(mid_a, return_counts=True)
        ub, cb = np.unique(mid_b, return_counts=True)
        _, ia, ib = np.intersect1d(ua, ub, assume_unique=True, return_indices=True)
        shared = int(np.minimum(ca[ia], cb[ib]).sum())
        hopeless = len(mid_a) + len(mid_b) - 2 * shared > max_d
    if hopeless:                          # Myers would give up: straight to the greedy pairing
        pairs = None
    elif shared == 0:                     # nothing in the middle matches: Myers pairs prefix and suffix
        pairs = [(i, i) for i in range(lo)] + [(n - hi + t, m - hi + t) for t in range(hi)]
        how = "myers"
    else:
        try:
            pairs = myers_align(lists[0], lists[1], max_d=max_d)
            how = "myers"
        except EditLimitExceeded:
            pairs = None
    if pairs is None:
        pairs, how = _greedy_pairs(*lists), "greedy"
    if not pairs:
        return None
    arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    return arr[:, 0], arr[:, 1], how


def align_all(con, common: list, *, max_d: int = 20000, outputs_only: str = "") -> None:
    """Create table ``alignment`` (:data:`ALIGN_SCHEMA` columns, the rows :func:`align_step`
    gives for every common (rank, step)) from ``t_calls``/``b_calls`` and
    ``t_leaves``/``b_leaves`` on ``con``.

    Args:
        con: DuckDB connection holding the side tables.
        common: the (rank, step) pairs present on both sides.
        max_d: Myers edit budget per segment (then greedy pairing of equal tokens).
        outputs_only: extra SQL condition on ``l`` (leaves) restricting which leaves sign a call.
    The leaf tables carry ``sclass`` (:func:`msprobe.compare.metrics.prepare_leaves`).
    """
    import numpy as np

    keys = pa.table({"rank": pa.array([r for r, _ in common], pa.int32()),
                     "step": pa.array([s for _, s in common], pa.int32())})
    con.register("common_keys", keys)
    fwd = {}
    for prefix in ("t", "b"):
        rel = con.sql(_TOKEN_SQL.format(side=prefix, outputs_only=outputs_only))
        table = rel.to_arrow_table()
        if table.num_rows:          # execution order (rank, step, seq): sorted here, not in SQL
            order = np.lexsort((table["seq"].to_numpy(), table["step"].to_numpy(), table["rank"].to_numpy()))
            if np.any(order[1:] < order[:-1]):
                table = table.take(pa.array(order))
        fwd[prefix] = table

    def groups(table):
        rank = table["rank"].to_numpy().astype(np.int64)
        step = table["step"].to_numpy().astype(np.int64)
        key = (rank << 32) | (step & 0xFFFFFFFF)
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.array([], np.int64)
        ends = np.r_[starts[1:], len(key)] if len(key) else starts
        return {(int(rank[s]), int(step[s])): (s, e) for s, e in zip(starts, ends)}

    tg, bg = groups(fwd["t"]), groups(fwd["b"])
    ttok = fwd["t"]["tok"].to_numpy(zero_copy_only=False).view(np.int64) if len(fwd["t"]) else np.zeros(0, np.int64)
    btok = fwd["b"]["tok"].to_numpy(zero_copy_only=False).view(np.int64) if len(fwd["b"]) else np.zeros(0, np.int64)
    tseq, bseq = fwd["t"]["seq"].to_numpy(), fwd["b"]["seq"].to_numpy()

    def modules(table, grp) -> dict:
        """(rank, step) -> [(position in the step's forward calls, name)] of its module
        forward calls, in execution order (names are unique within a step)."""
        import pyarrow.compute as pc

        if not table.num_rows:
            return {}
        rows = np.flatnonzero(pc.fill_null(pc.equal(table["kind"], "module_forward"), False)
                              .to_numpy(zero_copy_only=False))
        out: dict = {}
        sel = pa.array(rows, pa.int64())
        for r, rk, st, nm in zip(rows.tolist(), table["rank"].take(sel).to_pylist(),
                                 table["step"].take(sel).to_pylist(), table["name"].take(sel).to_pylist()):
            if nm is not None:
                out.setdefault((rk, st), []).append((r - grp[(rk, st)][0], nm))
        return out
    t_mod, b_mod = modules(fwd["t"], tg), modules(fwd["b"], bg)
    out_i, out_j, out_how = [], [], []
    HOW = {"myers": 0, "greedy": 1, "anchor": 2}
    for rank, step in common:
        t0, t1 = tg.get((rank, step), (0, 0))
        b0, b1 = bg.get((rank, step), (0, 0))
        ta, tb = ttok[t0:t1], btok[b0:b1]
        # module anchors: module forward calls with equal names, in target order
        b_pos = {name: j for j, name in b_mod.get((rank, step), ())}
        cand = [(i, b_pos[name]) for i, name in t_mod.get((rank, step), ()) if name in b_pos]
        anchor_list = _lis(cand)
        anc = np.asarray(anchor_list + [(len(ta), len(tb))], dtype=np.int64).reshape(-1, 2)
        end_i, end_j = anc[:, 0], anc[:, 1]                       # segment k: [start, end) on each side
        start_i, start_j = np.r_[0, end_i[:-1] + 1], np.r_[0, end_j[:-1] + 1]
        n_i, n_j = end_i - start_i, end_j - start_j
        # equal segments (same length, same tokens: what Myers pairs position by position),
        # found for all segments at once; the others go through _segment_pairs one by one
        same = (n_i == n_j) & (n_i > 0)
        lens = n_i[same]
        if lens.size:
            seg = np.repeat(np.arange(lens.size), lens)
            within = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
            ti, tj = start_i[same][seg] + within, start_j[same][seg] + within
            differs = np.add.reduceat((ta[ti] != tb[tj]).astype(np.int64), np.cumsum(lens) - lens) > 0
            ok = ~np.repeat(differs, lens)
            out_i.append(t0 + ti[ok])
            out_j.append(b0 + tj[ok])
            out_how.append(np.full(int(ok.sum()), HOW["myers"], np.int8))
            same[np.flatnonzero(same)[differs]] = False
        for k in np.flatnonzero(~same & (n_i > 0) & (n_j > 0)).tolist():
            pairs_k = _segment_pairs(ta[start_i[k]: end_i[k]], tb[start_j[k]: end_j[k]], max_d)
            if pairs_k is not None:
                si, sj, how = pairs_k
                out_i.append(t0 + start_i[k] + si)
                out_j.append(b0 + start_j[k] + sj)
                out_how.append(np.full(len(si), HOW[how], np.int8))
        out_i.append(t0 + end_i[:-1])
        out_j.append(b0 + end_j[:-1])
        out_how.append(np.full(len(anc) - 1, HOW["anchor"], np.int8))
    ii = np.concatenate(out_i).astype(np.int64) if out_i else np.zeros(0, np.int64)
    jj = np.concatenate(out_j).astype(np.int64) if out_j else np.zeros(0, np.int64)
    hh = np.concatenate(out_how) if out_how else np.zeros(0, np.int8)
    order = np.argsort(ii, kind="stable")          # target order
    ii, jj, hh = ii[order], jj[order], hh[order]
    names = np.array(["myers", "greedy", "anchor"], dtype=object)
    pairs = pa.table({"rank": fwd["t"]["rank"].take(pa.array(ii)), "step": fwd["t"]["step"].take(pa.array(ii)),
                      "t_seq": pa.array(tseq[ii], pa.int64()), "b_seq": pa.array(bseq[jj], pa.int64()),
                      "how": pa.array(names[hh].tolist() if len(hh) else [], pa.string())})
    con.register("fwd_pairs", pairs)
    con.execute(_PAIRS_SQL)
    for name in ("fwd_pairs", "common_keys"):
        con.unregister(name)
