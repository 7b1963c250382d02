"""``--format xlsx``: upstream 1.2.2's result workbook (the facts and
their sources are in ``docs/compare-upstream-formats.md``).

One workbook per compared rank: ``compare_result_{timestamp}.xlsx`` for a single rank,
``compare_result_rank{N}-rank{M}_{timestamp}.xlsx`` per rank pair otherwise (TARGET rank
N, BASELINE rank M; timestamp ``%Y%m%d%H%M%S``). One row per leaf pair in execution order,
with upstream's columns for the mode (:data:`COLUMNS`; ``NPU_Stack_Info`` only when the
TARGET recorded stacks, as upstream adds it only with stack information). Rows are judged
by our leaf verdicts in upstream's words: tensor ``Accuracy Reached or Not`` ``Yes``/``No``,
statistics ``Result`` empty/``Warning``, md5 ``Result`` ``pass``/``Different``; a TARGET
leaf without a partner gets ``N/A`` and ``No bench data matched.`` as upstream writes it.
Statistics relative errors are upstream's strings (``12.5%``; ``N/A`` when the baseline
value is 0). Rows of origin calls are filled red, of propagated calls yellow. Needs
openpyxl.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

from msprobe.compare.errors import CompareInputError

__all__ = ["write_xlsx", "COLUMNS", "MAX_ROWS"]

MAX_ROWS = 1_048_575          # Excel's 1,048,576 rows less the header
FETCH_ROWS = 1024             # rows fetched from DuckDB at a time
_HEAD = ["NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape", "Bench Tensor Shape"]
_STATS = ["NPU max", "NPU min", "NPU mean", "NPU l2norm", "Bench max", "Bench min", "Bench mean", "Bench l2norm"]
COLUMNS = {
    "tensor": _HEAD + ["Cosine", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
                       "Five Thousandths Err Ratio"] + _STATS + ["Accuracy Reached or Not", "Err_message",
                                                                  "NPU_Stack_Info", "Data_name"],
    "statistics": _HEAD + ["Max diff", "Min diff", "Mean diff", "L2norm diff", "MaxRelativeErr", "MinRelativeErr",
                           "MeanRelativeErr", "NormRelativeErr"] + _STATS + ["Result", "Err_message", "NPU_Stack_Info"],
    "md5": _HEAD + ["NPU MD5", "BENCH MD5", "Result", "NPU_Stack_Info"],
}
_IO = {"input_args": "input", "input_kwargs": "input", "input": "input", "output": "output",
       "parameters": "parameters"}
_WORDS = {"tensor": ("Yes", "No"), "statistics": ("", "Warning"), "md5": ("pass", "Different")}
NO_BENCH = "No bench data matched."     # upstream's Err_message for a TARGET leaf without a partner
STACK = "NPU_Stack_Info"
_BAD = ("diverged", "nonfinite", "structural")

_SQL = """
SELECT t.*, c.verdict AS call_verdict, c.reason AS call_reason, c.stack_id AS call_stack
FROM tensors t LEFT JOIN calls c ON c.rank = t.rank AND c.step = t.step AND c.t_seq = t.aid
WHERE t.rank = ? ORDER BY t.step, t.ord, t.t_lord
"""


def _leaf_name(call, io, arg) -> str:
    if call is None:
        return "N/A"
    if io in _IO and arg is not None and not call.endswith("parameters_grad"):
        return f"{call}.{_IO[io]}.{arg}" if io != "parameters" else f"{call}.parameters.{arg}"
    return f"{call}.{arg}" if arg is not None else call


def _num(v):
    if v is None:
        return "N/A"
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _rel_pct(t, b):
    """Upstream's statistics relative error: ``"{|t - b| / |b| * 100}%"``, ``"N/A"`` when a
    value is missing or ``b`` is 0, ``"Nan"`` when the difference is NaN."""
    if t is None or b is None:
        return "N/A"
    diff = float(t) - float(b)
    if math.isnan(diff):
        return "Nan"
    if b == 0:
        return "N/A"
    return f"{abs(diff / float(b) * 100)}%"


def write_xlsx(result, out: Path, mode: str) -> list[Path]:
    """Write the workbooks into ``out``; returns their paths.

    Args:
        result: a :class:`~msprobe.compare.engine.CompareResult`.
        out: the output directory.
        mode: ``tensor``, ``statistics`` or ``md5`` (the comparison's mode).
    Raises:
        CompareInputError: openpyxl missing, or a rank has more than :data:`MAX_ROWS` rows
            (use Parquet).
    """
    try:
        import openpyxl
        from openpyxl.styles import PatternFill
    except ImportError:
        raise CompareInputError("--format xlsx: needs the openpyxl package, which is not installed; "
                                "use csv or parquet") from None
    con = result.con
    mode = mode if mode in COLUMNS else "statistics"
    cols = COLUMNS[mode]
    try:
        (n_stacks,), = con.execute("SELECT count(*) FROM t_stacks").fetchall()
    except Exception:     # no stack table: no stacks recorded
        n_stacks = 0
    if not n_stacks:
        cols = [c for c in cols if c != STACK]
    ranks = [r["rank"] for r in result.summary["ranks"]]
    baseline_rank = {r["rank"]: r.get("baseline_rank", r["rank"]) for r in result.summary["ranks"]}
    for rank in ranks:
        (n,), = con.execute("SELECT count(*) FROM tensors WHERE rank = ?", [rank]).fetchall()
        if n > MAX_ROWS:
            raise CompareInputError(f"--format xlsx: rank {rank} has {n} rows, over Excel's {MAX_ROWS}; "
                                    f"use --format parquet (tensors.parquet) instead")
    stamp = time.strftime("%Y%m%d%H%M%S")
    red, yellow = PatternFill("solid", fgColor="FFC7CE"), PatternFill("solid", fgColor="FFEB9C")
    good, bad = _WORDS[mode]
    has_tensor_cols = "cosine" in {c for (c,) in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'tensors'").fetchall()}
    stacks: dict = {}
    written = []
    for rank in ranks:
        wb = openpyxl.Workbook(write_only=False)
        ws = wb.active
        ws.title = "compare_result"
        ws.append(cols)
        if n_stacks:
            # every stack this rank's rows name, read before the row cursor opens: a query
            # run on the connection while the cursor is being fetched would end its result
            stacks = {sid: "\n".join(frames) for sid, frames in con.execute(
                "SELECT stack_id, list(frame ORDER BY depth) FROM t_stacks WHERE stack_id IN "
                "(SELECT DISTINCT stack_id FROM calls WHERE rank = ?) GROUP BY stack_id", [rank]).fetchall()}
        cur = con.execute(_SQL, [rank])
        names = [d[0] for d in cur.description]
        while True:
            batch = cur.fetchmany(FETCH_ROWS)
            if not batch:
                break
            for values in batch:
                r = dict(zip(names, values))
                sid = r["call_stack"]
                judged = bad if r["verdict"] in _BAD else good
                err = r["call_reason"] or ""
                if r["verdict"] == "unpaired":
                    judged = "N/A"
                    err = NO_BENCH if r["in_t"] is not False and r["t_call"] is not None else "unpaired: BASELINE only"
                elif r["verdict"] == "missing_data":
                    judged = "N/A"
                    err = f"Dump file: {r['t_data_name'] or r['b_data_name']} not found."
                row = {"NPU Name": _leaf_name(r["t_call"] if r["in_t"] is not False else None, r["io"], r["arg"]),
                       "Bench Name": _leaf_name(r["b_call"] if r["in_b"] is not False else None, r["io"],
                                                r["b_arg"] if r["b_arg"] is not None else r["arg"]),
                       "NPU Dtype": r["t_dtype"] or "N/A", "Bench Dtype": r["b_dtype"] or "N/A",
                       "NPU Tensor Shape": str(r["t_shape"]) if r["t_shape"] is not None else "N/A",
                       "Bench Tensor Shape": str(r["b_shape"]) if r["b_shape"] is not None else "N/A",
                       "Max diff": _num(r["max_diff"]), "Min diff": _num(r["min_diff"]),
                       "Mean diff": _num(r["mean_diff"]), "L2norm diff": _num(r["norm_diff"]),
                       "MaxRelativeErr": (_num(r["max_rel_err"]) if mode == "tensor" and has_tensor_cols
                                          else _rel_pct(r["t_max"], r["b_max"])),
                       "MinRelativeErr": _rel_pct(r["t_min"], r["b_min"]),
                       "MeanRelativeErr": _rel_pct(r["t_mean"], r["b_mean"]),
                       "NormRelativeErr": _rel_pct(r["t_norm"], r["b_norm"]),
                       "NPU max": _num(r["t_max"]), "NPU min": _num(r["t_min"]), "NPU mean": _num(r["t_mean"]),
                       "NPU l2norm": _num(r["t_norm"]), "Bench max": _num(r["b_max"]), "Bench min": _num(r["b_min"]),
                       "Bench mean": _num(r["b_mean"]), "Bench l2norm": _num(r["b_norm"]),
                       "NPU MD5": r["t_md5"] or "N/A", "BENCH MD5": r["b_md5"] or "N/A",
                       "Result": judged, "Accuracy Reached or Not": judged, "Err_message": err,
                       "NPU_Stack_Info": stacks.get(sid, "") if sid is not None else "",
                       "Data_name": str([r["t_data_name"] or "-1", r["b_data_name"] or "-1"])}
                if mode == "tensor" and has_tensor_cols:
                    row.update({"Cosine": _num(r["cosine"]), "MaxAbsErr": _num(r["max_abs_err"]),
                                "One Thousandth Err Ratio": _num(r["one_thousandth_ratio"]),
                                "Five Thousandths Err Ratio": _num(r["five_thousandths_ratio"])})
                ws.append([row.get(c, "N/A") for c in cols])
                fill = red if r["call_verdict"] == "origin" else yellow if r["call_verdict"] == "propagated" else None
                if fill is not None:
                    for cell in ws[ws.max_row]:
                        cell.fill = fill
        name = (f"compare_result_{stamp}.xlsx" if len(ranks) == 1
                else f"compare_result_rank{rank}-rank{baseline_rank[rank]}_{stamp}.xlsx")
        path = out / name
        wb.save(path)
        written.append(path)
    return written
