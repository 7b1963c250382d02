"""Per-leaf metrics, float64.

``statistics`` (SQL, :func:`leaf_pairs_sql`): upstream's ``X diff`` = X_N − X_B and
``XRelativeErr`` = |X_N − X_B| / |X_B| × 100 for X in Max, Min, Mean, Norm; our error

    e = max(|ΔMax|/S, |ΔMin|/S, |ΔMean|/R, |ΔNorm|/Norm_B),
    S = max(|Max_B|, |Min_B|), R = Norm_B / sqrt(numel),

every denominator floored at the baseline dtype's atol (float64 1e-7, other floats 1e-5,
non-floats 1), so a Mean near 0 never dominates. Worked example: B = [1, -1, 2, -2]
(Max 2, Min -2, Mean 0, Norm √10 ≈ 3.1623), N = B with 2 → 2.002: ΔMax = 0.002,
ΔMean = 0.0005, ΔNorm ≈ 0.000632; S = 2, R = √10/2 ≈ 1.5811; e = max(0.001, 0, 0.000316,
0.0002) = 0.001.

``md5``: e = 0 if CRC-32, dtype and shape are equal, else 1.

``tensor`` (:func:`tensor_metrics`, two numpy arrays): Cosine, EucDist, e = ‖N−B‖/‖B‖,
MaxAbsErr, MaxRelativeErr, One/Five Thousandth Err Ratio.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

__all__ = ["tensor_metrics", "MetricsWorkspace", "leaf_pairs_sql", "build_leaf_pairs", "prepare_leaves", "rechunk",
           "ATOL"]

ATOL = {"float64": 1e-7, "float32": 1e-5, "float16": 1e-5, "bfloat16": 1e-5, "float": 1e-5}


#: elements per block of the blocked tensor metrics: four float64 blocks of it (2 MiB) stay in the
#: L2/L3 cache; larger blocks mean fewer numpy calls per pair (measured best from 8,192 up to 131,072)
BLOCK = 65536


class MetricsWorkspace:
    """Reusable buffers for :func:`tensor_metrics` and tensor reading (one per thread).

    Holds four float64 blocks of :data:`BLOCK` elements (the metrics run block by block
    in them, so a pair of any size costs no large float64 temporaries) and one byte
    buffer per side name for :meth:`raw` (file contents read without a fresh allocation),
    each as large as the largest tensor read with it.

    Args:
        block: elements per block (int ≥ 1; default :data:`BLOCK`).
    Raises:
        ValueError: ``block`` < 1.
    """

    def __init__(self, block: int = BLOCK) -> None:
        if block < 1:
            raise ValueError(f"MetricsWorkspace: block must be >= 1, got {block}")
        self.block = int(block)
        self._blocks: tuple = ()
        self._raw: dict = {}

    def blocks(self) -> tuple:
        """Four float64 arrays of ``self.block`` elements and one bool array of as many."""
        if not self._blocks:
            self._blocks = tuple(np.empty(self.block, np.float64) for _ in range(4)) + (
                np.empty(self.block, np.bool_),)
        return self._blocks

    def raw(self, side: str, nbytes: int) -> np.ndarray:
        """A uint8 array of ``nbytes`` (a view of the kept buffer of ``side``; its previous
        contents are overwritten by the next read of the same side)."""
        buf = self._raw.get(side)
        if buf is None or buf.size < nbytes:
            buf = self._raw[side] = np.empty(max(nbytes, 1), np.uint8)
        return buf[:nbytes]


_EPS = float(np.finfo(np.float64).eps)

#: elements per BLAS dot call: OpenBLAS runs a dot product of at most 10,000 elements on the
#: calling thread (a larger one wakes its thread pool, which costs more than it saves on busy cores)
DOT_CHUNK = 8192


def _dot(x: np.ndarray, y: np.ndarray) -> float:
    """Σ x·y (float64, 1-D, contiguous) in single-threaded BLAS calls of :data:`DOT_CHUNK`
    elements: the whole chunks in one stacked ``matmul`` call, the tail with ``dot``."""
    k = x.size
    if k <= DOT_CHUNK:
        return float(np.dot(x, y))
    m = k - k % DOT_CHUNK
    s = float(np.add.reduce(np.matmul(x[:m].reshape(-1, 1, DOT_CHUNK), y[:m].reshape(-1, DOT_CHUNK, 1)),
                            axis=None))
    return s + float(np.dot(x[m:], y[m:])) if m < k else s


def _nonfinite_result() -> dict:
    return {"cosine": None, "euc_dist": math.inf, "e": math.inf, "max_abs_err": math.inf,
            "max_rel_err": math.inf, "one_thousandth_ratio": 0.0, "five_thousandths_ratio": 0.0,
            "nonfinite": True}


def tensor_metrics(target: np.ndarray, baseline: np.ndarray,
                   work: Optional[MetricsWorkspace] = None) -> dict[str, Optional[float]]:
    """Element-wise metrics of two same-shape arrays, in float64.

    NaN/Inf positions compare first: if they differ (position, or value: NaN, +Inf, -Inf),
    ``nonfinite`` is True and ``e`` is inf; otherwise the metrics use the finite elements
    only. Computed in one pass over blocks of :data:`BLOCK` elements (converted to
    float64 in the workspace's buffers, every sum, maximum and count taken while the
    block is in cache); sums add per-block partial sums, so results equal a whole-array
    float64 computation up to float64 rounding of the sums (maxima and counts exactly).

    Args:
        target, baseline: arrays of equal shape (any real dtype; converted to float64).
        work: buffers to compute in (:class:`MetricsWorkspace`); None allocates a
            workspace for this call.
    Returns:
        ``{"cosine", "euc_dist", "e", "max_abs_err", "max_rel_err",
        "one_thousandth_ratio", "five_thousandths_ratio", "nonfinite"}``; Cosine is None
        when either side is all zeros (undefined). Relative errors use eps = 2**-52
        where B = 0. Example: N = [1, 2.004], B = [1, 2] gives MaxAbsErr 0.004,
        MaxRelativeErr 0.002, e = 0.004/√5 ≈ 0.00179, One Thousandth ratio 0.5.
    Raises:
        ValueError: the shapes differ.
    """
    target, baseline = np.asarray(target), np.asarray(baseline)
    if target.shape != baseline.shape:
        raise ValueError(f"tensor_metrics: shapes differ: target {target.shape}, baseline {baseline.shape}")
    if work is None:
        work = MetricsWorkspace(min(BLOCK, max(target.size, 1)))
    tn, tb = target.reshape(-1), baseline.reshape(-1)
    size = tn.size
    nbuf, bbuf, dbuf, rbuf, flag = work.blocks()
    step = nbuf.size
    f64n, f64b = tn.dtype == np.float64, tb.dtype == np.float64
    nn = bb = nb = dd = 0.0
    max_abs = max_rel = 0.0
    count = c1 = c5 = 0
    dot, subtract, absolute, divide, less = _dot, np.subtract, np.absolute, np.divide, np.less
    amax, count_nonzero = np.maximum.reduce, np.count_nonzero
    with np.errstate(all="ignore"):
        for lo in range(0, size, step):
            hi = min(lo + step, size)
            k = hi - lo
            if f64n:
                n = tn[lo:hi]
            else:
                n = nbuf[:k]
                np.copyto(n, tn[lo:hi], casting="unsafe")
            if f64b:
                b = tb[lo:hi]
            else:
                b = bbuf[:k]
                np.copyto(b, tb[lo:hi], casting="unsafe")
            snn, sbb = dot(n, n), dot(b, b)
            if not (math.isfinite(snn) and math.isfinite(sbb)):
                # a finite sum of squares proves every element finite; else compare the positions
                fin_n, fin_b = np.isfinite(n), np.isfinite(b)
                if not (np.array_equal(fin_n, fin_b)
                        and np.array_equal(n[~fin_n], b[~fin_b], equal_nan=True)):
                    return _nonfinite_result()
                n, b = n[fin_n], b[fin_b]
                k = n.size
                if k == 0:
                    continue
                snn, sbb = dot(n, n), dot(b, b)
            d, r = dbuf[:k], rbuf[:k]
            nn += snn
            bb += sbb
            nb += dot(n, b)
            subtract(n, b, out=d)
            dd += dot(d, d)
            absolute(d, out=d)
            max_abs = max(max_abs, float(amax(d)))
            absolute(b, out=r)
            divide(d, r, out=r)
            m = float(amax(r))
            if not math.isfinite(m):      # B = 0 somewhere (0/0 or x/0): divide by eps there instead
                zero = np.equal(b, 0, out=flag[:k])
                r[zero] = d[zero] / _EPS
                m = float(amax(r))
            max_rel = max(max_rel, m)
            # counts: a block whose largest relative error is below a threshold needs no comparison
            c1 += k if m < 0.001 else int(count_nonzero(less(r, 0.001, out=flag[:k])))
            c5 += k if m < 0.005 else int(count_nonzero(less(r, 0.005, out=flag[:k])))
            count += k
    if count == 0:
        return {"cosine": None, "euc_dist": 0.0, "e": 0.0, "max_abs_err": 0.0, "max_rel_err": 0.0,
                "one_thousandth_ratio": 1.0, "five_thousandths_ratio": 1.0, "nonfinite": False}
    euc = math.sqrt(dd)
    norm_n, norm_b = math.sqrt(nn), math.sqrt(bb)
    cosine = float(nb / (norm_n * norm_b)) if norm_n > 0 and norm_b > 0 else None
    e = euc / norm_b if norm_b > 0 else (0.0 if euc == 0 else math.inf)
    return {"cosine": cosine, "euc_dist": euc, "e": e, "max_abs_err": max_abs, "max_rel_err": max_rel,
            "one_thousandth_ratio": c1 / count, "five_thousandths_ratio": c5 / count, "nonfinite": False}


#: the dtype as call signatures see it (:mod:`msprobe.compare.align`): floats of any width are one class
TOKEN_CLASS_SQL = ("CASE WHEN lower({d}) LIKE '%float%' OR lower({d}) LIKE '%half%' OR lower({d}) LIKE '%double%' "
                   "THEN 'f' ELSE {d} END")


def _fin(x: str) -> str:
    return f"CASE WHEN isnan({x}) OR isinf({x}) THEN NULL ELSE {x} END"


def _dclass_sql(col: str) -> str:
    d = f"lower({col})"
    return (f"CASE WHEN {col} IS NULL THEN NULL "
            f"WHEN contains({d}, 'bfloat16') THEN 'bfloat16' "
            f"WHEN contains({d}, 'float16') OR suffix({d}, 'half') THEN 'float16' "
            f"WHEN contains({d}, 'float32') OR {d} IN ('float', 'torch.float') THEN 'float32' "
            f"WHEN contains({d}, 'float64') OR suffix({d}, 'double') THEN 'float64' "
            f"WHEN contains({d}, 'float') THEN 'float' WHEN contains({d}, 'complex') THEN 'complex' "
            f"WHEN contains({d}, 'bool') THEN 'bool' WHEN contains({d}, 'int') THEN 'int' ELSE {d} END")


#: machine epsilon per dtype class (float32 for int: upstream computes their statistics in float32)
_EPS_OF = {"float64": 2.0 ** -52, "float32": 2.0 ** -23, "float": 2.0 ** -23, "float16": 2.0 ** -10,
           "bfloat16": 2.0 ** -7, "int": 2.0 ** -23}


def noise_allowance_sql(profile: str, stat: str, side: str) -> str:
    """SQL for the rounding allowance of one producer's statistic (``stat``: ``max``
    (Max and Min), ``mean`` or ``norm``), in the units of the e terms of
    :func:`leaf_pairs_sql` (relative to S, R and Norm_B), for the leaf columns of
    ``side`` (``t``/``b``: ``{side}_dclass``, ``{side}_numel``). ``profile`` is a producer
    of :mod:`msprobe.compare.producers`; with n = numel, eps32 = 2**-23 and eps_d the
    epsilon of the tensor's dtype:

    - ours: Max/Min exact; Mean, Norm of 32/16-bit floats: eps32·(2 + log2 n) (the float32
      cascade sum of the fallback path; float64 otherwise), float64/int 0.
    - upstream 1.x: Max/Min of float64/int rounded to float32: eps32; Mean: eps_d (rounded
      to a 16-bit dtype) + eps32·(2 + log2 n) (``torch.mean``, cascade sum);
      Norm: eps_d + eps32·(2 + n/1000) (``torch.norm`` accumulates the squares in float32:
      measured on torch 2.13 CPU, 1e6 elements 85·eps32, 1.6e7 elements 6,144·eps32).
    - upstream 26.x: as 1.x, but Max/Min exact (Mean/Norm of float64/int are null there).
    """
    from msprobe.compare.producers import OURS, UPSTREAM_1

    d, n = f"{side}_dclass", f"greatest(coalesce({side}_numel, 1), 1)"
    eps32 = _EPS_OF["float32"]
    own = f"(CASE {d} WHEN 'float16' THEN {_EPS_OF['float16']!r} WHEN 'bfloat16' THEN {_EPS_OF['bfloat16']!r} ELSE 0.0 END)"
    if profile == OURS:
        if stat == "max":
            return "0.0"
        return f"(CASE WHEN {d} IN ('float32', 'float', 'float16', 'bfloat16') THEN {eps32!r} * (2 + log2({n})) ELSE 0.0 END)"
    if stat == "max":
        return f"(CASE WHEN {d} IN ('float64', 'int') THEN {eps32!r} ELSE 0.0 END)" if profile == UPSTREAM_1 else "0.0"
    if stat == "mean":
        return f"({own} + {eps32!r} * (2 + log2({n})))"
    return f"({own} + {eps32!r} * (2 + {n} / 1000.0))"


def _rel_pct(stat: str) -> str:
    """SQL of upstream's relative error of statistic ``stat`` in percent, ``|t - b| / |b| *
    100``, and 0 where both sides hold the same value (two zeros included)."""
    return f"CASE WHEN t_{stat} = b_{stat} THEN 0.0 ELSE abs(t_{stat} - b_{stat}) / abs(b_{stat}) * 100 END"


def leaf_pairs_sql(mode: str, tol: dict[str, float], loss_scale: float, row_id: bool = False,
                   noise: Optional[tuple] = None) -> str:
    """SELECT over ``lp_wide`` (see :func:`build_leaf_pairs`) giving the leaf pairs (plus a
    trailing ``watermark`` column) from ``alignment``, ``t_leaves``, ``b_leaves``:
    one row per leaf of a paired call (full outer join on ``io``, ``arg``; a tensor leaf
    without a same-path partner pairs with the other side's leftover leaf of the same
    ``io``, dtype class and shape when that is unique on both sides: upstream orders API
    backward outputs differently, spec section 9), with the
    upstream diff columns, ``e`` (see module docstring), ``tol_pair`` (rtol of the pair's
    lower-precision dtype, 0 for non-floats) and ``state``: identical, structural,
    nonfinite, unpaired, or measured (to be judged against the tolerance).
    Target backward statistics are divided by ``loss_scale`` first. ``row_id``: carry
    ``lp_wide``'s ``lp_row`` through (after ``in_b``). ``noise``: None, or the two sides'
    producers (:func:`msprobe.compare.producers.noise_profiles`): then each statistics
    term of ``e`` is reduced by both producers' rounding allowance for that statistic
    (:func:`noise_allowance_sql`), floored at 0, so ``e`` is the error that the two tools'
    ways of computing statistics cannot explain.
    """
    floats = "('float64','float32','float','float16','bfloat16')"
    prec = {"float64": 0, "float32": 1, "float": 1, "float16": 2, "bfloat16": 3}
    tol_case = " ".join(f"WHEN '{k}' THEN {float(v)!r}" for k, v in tol.items())
    prec_case = " ".join(f"WHEN '{k}' THEN {v}" for k, v in prec.items())
    atol_case = " ".join(f"WHEN '{k}' THEN {v!r}" for k, v in ATOL.items())
    scale = float(loss_scale)
    terms = [
        "abs(coalesce(t_max_finite, t_max) - coalesce(b_max_finite, b_max)) / s_den",
        "abs(coalesce(t_min_finite, t_min) - coalesce(b_min_finite, b_min)) / s_den",
        "abs(t_mean - b_mean) / greatest(b_norm / sqrt(greatest(b_numel, 1)), atol)",
        "abs(t_norm - b_norm) / greatest(abs(b_norm), atol)",
    ]
    if noise is not None:
        stats = ("max", "max", "mean", "norm")
        terms = [f"{x} - {noise_allowance_sql(noise[0], st, 't')} - {noise_allowance_sql(noise[1], st, 'b')}"
                 for x, st in zip(terms, stats)]
    stat_e = "greatest(" + ", ".join(_fin(f"({x})") for x in terms) + ", 0.0)"
    md5_e = "CASE WHEN t_md5 = b_md5 AND t_dtype = b_dtype AND t_shape = b_shape THEN 0.0 ELSE 1.0 END"
    e_expr = md5_e if mode == "md5" else stat_e
    same_stats = ("t_max IS NOT DISTINCT FROM b_max AND t_min IS NOT DISTINCT FROM b_min AND "
                  "t_mean IS NOT DISTINCT FROM b_mean AND t_norm IS NOT DISTINCT FROM b_norm")
    no_md5 = "FALSE" if mode == "md5" else f"t_dtype = b_dtype AND {same_stats}"
    identical = (f"CASE WHEN t_md5 IS NOT NULL AND b_md5 IS NOT NULL THEN t_md5 = b_md5 AND t_dtype = b_dtype "
                 f"ELSE {no_md5} END")
    cols = ["leaf_kind", "dtype", "dclass", "shape", "numel", "max", "min", "mean", "norm", "max_finite",
            "min_finite", "requires_grad", "has_nan", "has_inf", "data_name", "value_json", "payload", "lord"]
    bwd = "call_kind IN ('api_backward','module_backward','parameters_grad')"

    def col(side: str, c: str) -> str:
        name = f"{side}_{c}"
        if c in ("has_nan", "has_inf"):
            return f"CASE WHEN in_{side} THEN coalesce({name}, FALSE) END AS {name}"
        if side == "t" and scale != 1.0 and c in ("max", "min", "mean", "norm", "max_finite", "min_finite"):
            return f"CASE WHEN {bwd} THEN {name} / {scale!r} ELSE {name} END AS {name}"
        return name
    j_cols = ", ".join(col(sd, c) for c in cols for sd in ("t", "b"))
    return f"""
WITH j AS (
  SELECT rank, step, ord, aid, t_call, b_call, call_kind, io, arg, b_arg, {j_cols},
         t_crc32 AS t_md5, b_crc32 AS b_md5, in_t, in_b, {"lp_row, " if row_id else ""}watermark FROM lp_wide),
k AS (
  SELECT j.*,
    (CASE b_dclass {atol_case} ELSE 1.0 END) AS atol,
    greatest(abs(coalesce(b_max_finite, b_max)), abs(coalesce(b_min_finite, b_min)), (CASE b_dclass {atol_case} ELSE 1.0 END)) AS s_den,
    CASE WHEN NOT in_t OR NOT in_b THEN 'unpaired'
         WHEN t_leaf_kind <> b_leaf_kind THEN 'structural'
         WHEN t_leaf_kind = 'value' THEN CASE WHEN t_value_json IS NOT DISTINCT FROM b_value_json THEN 'identical' ELSE 'structural' END
         WHEN t_leaf_kind <> 'tensor' THEN 'identical'
         WHEN t_dclass IS DISTINCT FROM b_dclass AND NOT (t_dclass IN {floats} AND b_dclass IN {floats}) THEN 'structural'
         WHEN t_shape IS DISTINCT FROM b_shape THEN 'structural'
         WHEN t_requires_grad IS NOT NULL AND b_requires_grad IS NOT NULL AND t_requires_grad <> b_requires_grad THEN 'structural'
         WHEN t_has_nan <> b_has_nan OR t_has_inf <> b_has_inf THEN 'nonfinite'
         WHEN {identical} THEN 'identical'
         ELSE 'measured' END AS state
  FROM j)
SELECT k.* EXCLUDE (s_den, atol, watermark),
  t_max - b_max AS max_diff, t_min - b_min AS min_diff, t_mean - b_mean AS mean_diff, t_norm - b_norm AS norm_diff,
  {_rel_pct('max')} AS max_rel_pct, {_rel_pct('min')} AS min_rel_pct, {_rel_pct('mean')} AS mean_rel_pct,
  {_rel_pct('norm')} AS norm_rel_pct,
  CASE WHEN state IN ('structural', 'nonfinite') THEN 'inf'::DOUBLE
       WHEN state = 'identical' THEN 0.0
       WHEN state = 'unpaired' THEN NULL
       ELSE {e_expr} END AS e,
  CASE WHEN state = 'unpaired' OR t_leaf_kind <> 'tensor' THEN 0.0
       WHEN t_dclass NOT IN {floats} OR b_dclass NOT IN {floats} THEN 0.0
       WHEN (CASE t_dclass {prec_case} ELSE 1 END) >= (CASE b_dclass {prec_case} ELSE 1 END)
         THEN (CASE t_dclass {tol_case} ELSE 1.3e-6 END)
       ELSE (CASE b_dclass {tol_case} ELSE 1.3e-6 END) END AS tol_pair,
  coalesce(t_dclass IN {floats}, FALSE) AS is_float,
  CASE WHEN io IN ('input_args', 'input_kwargs', 'parameters', 'input') AND call_kind <> 'parameters_grad'
       THEN 'in' ELSE 'out' END AS role,
  watermark
FROM k
"""


_LEAF_COLUMNS = ("leaf_kind", "dtype", "dclass", "shape", "numel", "max", "min", "mean", "norm", "max_finite",
                 "min_finite", "requires_grad", "has_nan", "has_inf", "data_name", "value_json", "payload", "lord",
                 "crc32")


def prepare_leaves(con, leaves):
    """``leaves`` (a side's Arrow leaf table) plus ``ridx`` (row index, int64),
    ``dclass`` (the canonical dtype class of :func:`_dclass_sql`) and ``sclass`` (the
    dtype in call signatures, :data:`TOKEN_CLASS_SQL`), each evaluated once per distinct
    dtype spelling."""
    import pyarrow as pa
    import pyarrow.compute as pc

    dtype = leaves["dtype"].combine_chunks() if leaves.num_rows else pa.array([], pa.string())
    enc = pc.dictionary_encode(dtype)
    names = pa.table({"d": enc.dictionary})
    con.register("lp_dtypes", names)
    rel = con.sql(f"SELECT {_dclass_sql('d')} AS c, {TOKEN_CLASS_SQL.format(d='d')} AS s FROM lp_dtypes")
    classes = rel.to_arrow_table()
    con.unregister("lp_dtypes")
    out = leaves.append_column("ridx", pa.array(np.arange(leaves.num_rows, dtype=np.int64)))
    for name, col in (("dclass", "c"), ("sclass", "s")):
        values = classes[col].combine_chunks()
        per_leaf = values.take(enc.indices) if len(values) else pa.nulls(leaves.num_rows, pa.string())
        out = out.append_column(name, per_leaf.cast(pa.string()))
    return out


def _index_sql(tol: dict[str, float], remap: bool) -> str:
    """The leaf-pair index (see :func:`build_leaf_pairs`): one row per leaf pair with only
    narrow columns: ``rank``, ``step``, ``aid`` (the call's target seq), ``arow`` (the
    call's ``alignment`` rowid), ``t_ridx``/``b_ridx`` (row of the leaf in each side's
    leaf table, null on a missing side), ``in_t``/``in_b`` and ``tol_pair``. Without
    ``remap`` leaves pair by path only (right when no pair is :func:`_any_lonely`); with
    ``remap`` a tensor leaf without a same-path, same-shape tensor partner pairs by an
    (io, dtype class, shape) unique on both sides, except a leaf a mapping moved to
    ``*.unmapped.*`` (a Primitive's output that its PyTorch counterpart does not return,
    ``Conv2D``'s result before the bias), which pairs with nothing."""
    floats = "('float64','float32','float','float16','bfloat16')"
    prec = {"float64": 0, "float32": 1, "float": 1, "float16": 2, "bfloat16": 3}
    tol_case = " ".join(f"WHEN '{k}' THEN {float(v)!r}" for k, v in tol.items())
    prec_case = " ".join(f"WHEN '{k}' THEN {v}" for k, v in prec.items())

    def side(table: str, seq: str) -> str:
        # narrow rows: the alignment's string columns are gathered later by ``arow``
        return f"""SELECT a.rank, a.step, a.t_seq AS aid, a.rowid AS arow, l.io, l.arg, l.ridx, l.leaf_kind,
         l.dclass{", l.shape" if remap else ""}
  FROM alignment a JOIN {table} l ON l.rank = a.rank AND l.step = a.step AND l.cseq = a.{seq}
  WHERE a.t_name IS NOT NULL AND a.b_name IS NOT NULL"""
    dc = f"CASE WHEN dclass IN {floats} THEN 'f' ELSE dclass END"
    keys = """coalesce(t.rank, b.rank) AS rank, coalesce(t.step, b.step) AS step,
         coalesce(t.aid, b.aid) AS aid, coalesce(t.arow, b.arow) AS arow, t.ridx AS t_ridx, b.ridx AS b_ridx,
         t.leaf_kind AS t_leaf_kind, t.dclass AS t_dclass, b.dclass AS b_dclass,
         t.io IS NOT NULL AS in_t, b.io IS NOT NULL AS in_b"""
    if remap:
        body = f"""
-- a leaf a mapping moved to *.unmapped.* pairs with nothing, not even by shape
tk AS (SELECT rank, step, aid, io, arg, shape, {dc} AS dc FROM t0 WHERE leaf_kind = 'tensor'
       AND arg NOT LIKE 'unmapped%'),
bk AS (SELECT rank, step, aid, io, arg, shape, {dc} AS dc FROM b WHERE leaf_kind = 'tensor'
       AND arg NOT LIKE 'unmapped%'),
-- tensor leaves without a same-path partner pair by a (io, dtype class, shape) unique on both sides
t_left AS (SELECT * FROM tk WHERE NOT EXISTS (SELECT 1 FROM bk WHERE bk.rank = tk.rank AND bk.step = tk.step
           AND bk.aid = tk.aid AND bk.io = tk.io AND bk.arg = tk.arg AND bk.shape = tk.shape)),
b_left AS (SELECT * FROM bk WHERE NOT EXISTS (SELECT 1 FROM tk WHERE tk.rank = bk.rank AND tk.step = bk.step
           AND tk.aid = bk.aid AND tk.io = bk.io AND tk.arg = bk.arg AND tk.shape = bk.shape)),
t_u AS (SELECT *, count(*) OVER (PARTITION BY rank, step, aid, io, dc, shape) AS n FROM t_left),
b_u AS (SELECT *, count(*) OVER (PARTITION BY rank, step, aid, io, dc, shape) AS n FROM b_left),
remap AS MATERIALIZED (SELECT t_u.rank, t_u.step, t_u.aid, t_u.io, t_u.arg, b_u.arg AS b_arg FROM t_u JOIN b_u
  ON t_u.rank = b_u.rank AND t_u.step = b_u.step AND t_u.aid = b_u.aid AND t_u.io = b_u.io
  AND t_u.dc = b_u.dc AND t_u.shape = b_u.shape WHERE t_u.n = 1 AND b_u.n = 1),
t AS (SELECT t0.*, CASE WHEN remap.b_arg IS NOT NULL THEN remap.b_arg
                         WHEN EXISTS (SELECT 1 FROM remap r2 WHERE r2.rank = t0.rank AND r2.step = t0.step
                              AND r2.aid = t0.aid AND r2.io = t0.io AND r2.b_arg = t0.arg) THEN NULL
                         ELSE t0.arg END AS join_arg
      FROM t0 LEFT JOIN remap
      ON remap.rank = t0.rank AND remap.step = t0.step AND remap.aid = t0.aid AND remap.io = t0.io
      AND remap.arg = t0.arg),
j AS (
  SELECT {keys}
  FROM t FULL OUTER JOIN b
    ON t.rank = b.rank AND t.step = b.step AND t.aid = b.aid AND t.io = b.io AND t.join_arg = b.arg),"""
    else:
        body = f"""
j AS (
  SELECT {keys}
  FROM t0 t FULL OUTER JOIN b
    ON t.rank = b.rank AND t.step = b.step AND t.aid = b.aid AND t.io = b.io AND t.arg = b.arg),"""
    return f"""
WITH t0 AS ({side('t_leaves', 't_seq')}),
b AS ({side('b_leaves', 'b_seq')}),{body}
tp AS (SELECT j.*,
  CASE WHEN NOT in_t OR NOT in_b OR t_leaf_kind <> 'tensor' THEN 0.0
       WHEN t_dclass NOT IN {floats} OR b_dclass NOT IN {floats} THEN 0.0
       WHEN (CASE t_dclass {prec_case} ELSE 1 END) >= (CASE b_dclass {prec_case} ELSE 1 END)
         THEN (CASE t_dclass {tol_case} ELSE 1.3e-6 END)
       ELSE (CASE b_dclass {tol_case} ELSE 1.3e-6 END) END AS tol_pair FROM j)
SELECT rank, step, aid, arow, t_ridx, b_ridx, in_t, in_b, tol_pair FROM tp
"""


def arrow_streamed(rel):
    """The rows of DuckDB relation ``rel`` as a ``pyarrow.Table``, streamed batch by batch
    (DuckDB does not first hold the whole result itself: for the 1M-row ``tensors`` that
    is its size saved at the peak)."""
    if hasattr(rel, "to_arrow_reader"):   # DuckDB >= 1.4
        return rel.to_arrow_reader(131072).read_all()
    return rel.to_arrow_table()


def rechunk(table, rows: int = 122880):
    """``table`` cut into record batches of at most ``rows`` rows (zero-copy slices):
    DuckDB scans an Arrow table batch by batch, one thread per batch, so a table held in
    one large chunk would be scanned by one thread."""
    import pyarrow as pa

    if table.num_rows <= rows:
        return table
    return pa.Table.from_batches(table.to_batches(max_chunksize=rows), schema=table.schema)


def _watermarks(arow, tol_pair, a_rank, a_step):
    """Per pair row: the step's precision watermark up to its call, i.e. the largest
    ``tol_pair`` over the pairs of the calls of its (rank, step) up to and including its
    call in ``ord`` order. ``arow`` (int64, per pair) indexes the alignment rows, which are
    sorted by (rank, step, ord) (``a_rank``/``a_step``: their keys, numpy arrays)."""
    call_tol = np.full(len(a_rank), -np.inf)
    np.maximum.at(call_tol, arow, tol_pair)
    if len(a_rank):
        key = (a_rank.astype(np.int64) << 32) | (a_step.astype(np.int64) & 0xFFFFFFFF)
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        for s, e in zip(starts, np.r_[starts[1:], len(key)]):
            np.maximum.accumulate(call_tol[s:e], out=call_tol[s:e])
    return call_tol[arow]


def build_leaf_pairs(con, t_leaves, b_leaves, tol: dict[str, float]):
    """Register ``lp_wide``: one row per leaf pair with both sides' leaf columns
    (``t_*``/``b_*``, null on a missing side), ``in_t``/``in_b`` and the step's precision
    ``watermark`` up to the pair's call; :func:`leaf_pairs_sql` computes the metrics over it.
    Rows come in alignment order (rank, step, ord), then target leaf order (``lord``),
    then the baseline-only leaves in baseline leaf order; column ``lp_row`` numbers them.

    The pairing (which leaf meets which, see :func:`leaf_pairs_sql`) is a join over narrow
    integer and key columns only (:func:`_index_sql`); the call's and the leaves' wide
    columns are then gathered by row index with Arrow ``take``, so no wide row passes
    through a hash join.

    Args:
        con: connection holding ``alignment`` and the sides' leaf tables ``t_leaves``/
            ``b_leaves`` (from :func:`prepare_leaves`, the same Arrow tables as given here).
        t_leaves, b_leaves: those Arrow tables.
        tol: rtol per dtype class (for the watermark).
    Returns:
        the Arrow table registered as ``lp_wide``.
    """
    def stream(sql: str):
        return arrow_streamed(con.sql(sql))

    # fast path: pair by path; only when some tensor leaf lacks a same-path, same-shape
    # partner (which the gathered pairs show) does the remap step run
    wide = _gather(con, stream(_index_sql(tol, remap=False)), t_leaves, b_leaves)
    if _any_lonely(wide):
        del wide
        wide = _gather(con, stream(_index_sql(tol, remap=True)), t_leaves, b_leaves)
    wide = rechunk(wide)
    con.register("lp_wide", wide)
    return wide


def _any_lonely(wide) -> bool:
    """Whether some pair of ``wide`` holds a tensor leaf without a tensor partner of the
    same shape (then the remap step of :func:`_index_sql` must run). Exact when it says
    False; True may also mean "not sure" (null shape elements), which only costs the
    remap query."""
    import pyarrow.compute as pc

    if wide.num_rows == 0:
        return False
    tt = pc.fill_null(pc.equal(wide["t_leaf_kind"], "tensor"), False)
    bt = pc.fill_null(pc.equal(wide["b_leaf_kind"], "tensor"), False)
    if pc.any(pc.xor(tt, bt)).as_py():
        return True
    both = pc.and_(tt, bt)
    a = wide["t_shape"].filter(both).combine_chunks()
    b = wide["b_shape"].filter(both).combine_chunks()
    if len(a) == 0:
        return False
    if a.null_count or b.null_count:
        return True
    if not np.array_equal(pc.list_value_length(a).to_numpy(), pc.list_value_length(b).to_numpy()):
        return True
    va, vb = a.flatten(), b.flatten()
    if va.null_count or vb.null_count:
        return True
    return not np.array_equal(va.to_numpy(), vb.to_numpy())


def _gather(con, idx, t_leaves, b_leaves):
    """The ``lp_wide`` table (see :func:`build_leaf_pairs`) from the pair index ``idx``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def np_col(table, name, dtype):
        return table[name].to_numpy().astype(dtype, copy=False) if table.num_rows else np.zeros(0, dtype)

    arow = np_col(idx, "arow", np.int64)
    t_rows = idx["t_ridx"].combine_chunks() if idx.num_rows else pa.array([], pa.int64())
    b_rows = idx["b_ridx"].combine_chunks() if idx.num_rows else pa.array([], pa.int64())
    # deterministic order: the call's alignment row, then the target leaf order, then baseline-only leaves
    t_lord = t_leaves["lord"].take(t_rows) if len(t_rows) else pa.array([], pa.int64())
    b_lord = b_leaves["lord"].take(b_rows) if len(b_rows) else pa.array([], pa.int64())
    only_b = pc.is_null(t_lord).to_numpy(zero_copy_only=False)
    lord = pc.coalesce(t_lord, b_lord).to_numpy(zero_copy_only=False)
    order = np.lexsort((lord, only_b, arow))
    perm = pa.array(order)
    arow = arow[order]
    t_rows, b_rows = t_rows.take(perm), b_rows.take(perm)
    align = con.sql("SELECT rowid AS r, rank, step, ord, t_name, b_name, kind FROM alignment ORDER BY rowid")
    align = align.to_arrow_table()
    if not np.array_equal(align["r"].to_numpy(), np.arange(align.num_rows)):
        raise AssertionError("alignment rowids are not 0..n-1")
    watermark = _watermarks(arow, np_col(idx, "tol_pair", np.float64)[order], align["rank"].to_numpy(),
                            align["step"].to_numpy())
    a_rows = pa.array(arow)
    t_io, b_io = t_leaves["io"].take(t_rows), b_leaves["io"].take(b_rows)
    t_arg, b_arg = t_leaves["arg"].take(t_rows), b_leaves["arg"].take(b_rows)
    columns = {
        "rank": idx["rank"].take(perm), "step": idx["step"].take(perm), "ord": align["ord"].take(a_rows),
        "aid": idx["aid"].take(perm), "t_call": align["t_name"].take(a_rows), "b_call": align["b_name"].take(a_rows),
        "call_kind": align["kind"].take(a_rows), "io": pc.coalesce(t_io, b_io), "arg": pc.coalesce(t_arg, b_arg),
        "b_arg": b_arg, "t_ridx": t_rows, "b_ridx": b_rows, "in_t": idx["in_t"].take(perm),
        "in_b": idx["in_b"].take(perm), "watermark": pa.array(watermark, pa.float64()),
    }
    del idx, align
    names, cols = list(columns), list(columns.values())

    def gather(leaves, rows):        # column by column: cheaper than Table.take
        return [leaves[c].take(rows) for c in _LEAF_COLUMNS]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="msprobe-compare-take") as pool:
        # Arrow's take releases the GIL: the two sides are gathered in parallel
        t_job, b_job = pool.submit(gather, t_leaves, t_rows), pool.submit(gather, b_leaves, b_rows)
        t_cols, b_cols = t_job.result(), b_job.result()
    for c, t_col, b_col in zip(_LEAF_COLUMNS, t_cols, b_cols):
        names += [f"t_{c}", f"b_{c}"]
        cols += [t_col, b_col]
    names.append("lp_row")
    cols.append(pa.array(np.arange(len(t_rows), dtype=np.int64)))
    return pa.table(cols, names=names)
