"""``--format xlsx``: upstream 1.2.2's file name and columns per mode, rows judged by our
leaf verdicts in its words, origin rows red, propagated rows yellow."""
from __future__ import annotations

import re

import pytest

openpyxl = pytest.importorskip("openpyxl")

import msprobe.compare as C  # noqa: E402
from msprobe.cli import main  # noqa: E402
from msprobe.compare.xlsx import COLUMNS  # noqa: E402

RED, YELLOW = "FFC7CE", "FFEB9C"


def _book(out):
    files = sorted(out.glob("compare_result_*.xlsx"))
    assert len(files) == 1 and re.fullmatch(r"compare_result_\d{14}\.xlsx", files[0].name)
    ws = openpyxl.load_workbook(files[0]).active
    rows = list(ws.iter_rows(values_only=True))
    fills = [ws.cell(row=i + 1, column=1).fill.fgColor.rgb for i in range(len(rows))]
    return rows[0], rows[1:], fills[1:]


# upstream 1.2.2: statistics Result is "Warning" or empty, md5 Result "pass" or "Different"
@pytest.mark.parametrize("mode, words", [("statistics", ("", "Warning")), ("md5", ("pass", "Different"))])
def test_xlsx_statistics_and_md5(runs, tmp_path, mode, words):
    out = tmp_path / "o"
    assert main(["compare", str(runs["gelu"]), str(runs["base"]), "--mode", mode, "--xlsx", "-o", str(out)]) == 1
    header, rows, fills = _book(out)
    assert list(header) == COLUMNS[mode]
    r = C.compare(runs["gelu"], runs["base"], mode=mode)
    (n,), = r.con.sql("SELECT count(*) FROM tensors").fetchall()
    assert len(rows) == n
    col = {c: i for i, c in enumerate(header)}
    rows = [tuple("" if v is None else v for v in row) for row in rows]   # openpyxl reads "" back as None
    by_name = {row[0]: (row, fill) for row, fill in zip(rows, fills)}
    gelu_out, fill = by_name["Functional.gelu.0.forward.output.0"]
    assert gelu_out[col["Result"]] == words[1] and fill.endswith(RED)
    gelu_in, fill = by_name["Functional.gelu.0.forward.input.0"]
    assert gelu_in[col["Result"]] == words[0]
    # a later call fed by the perturbed output is propagated: yellow
    (call, io, arg), = r.con.sql(
        "SELECT t.t_call, t.io, t.arg FROM tensors t JOIN calls c ON c.rank = t.rank AND c.step = t.step AND "
        "c.t_seq = t.aid WHERE c.verdict = 'propagated' AND t.verdict = 'diverged' AND t.io = 'output' "
        "ORDER BY t.ord LIMIT 1").fetchall()
    prop, fill = by_name[f"{call}.output.{arg}"]
    assert prop[col["Result"]] == words[1] and fill.endswith(YELLOW)
    assert sum(f.endswith(YELLOW) for f in fills) > 0 and sum(f.endswith(RED) for f in fills) > 0
    # every row's word matches our leaf verdict
    verdicts = [v for (v,) in r.con.sql("SELECT verdict FROM tensors ORDER BY step, ord, t_lord").fetchall()]
    bad = ("diverged", "nonfinite", "structural")
    assert [row[col["Result"]] for row in rows] == [words[1] if v in bad else words[0] for v in verdicts]
    if mode == "statistics":
        (t_max, b_max), = r.con.sql("SELECT t_max, b_max FROM tensors WHERE t_call = 'Functional.gelu.0.forward' "
                                    "AND io = 'output'").fetchall()
        assert gelu_out[col["Max diff"]] == pytest.approx(t_max - b_max)
        # upstream writes the relative error as a percent string
        text = gelu_out[col["MaxRelativeErr"]]
        assert text.endswith("%") and float(text[:-1]) == pytest.approx(abs(t_max - b_max) / abs(b_max) * 100)
        assert "conftest.py" in gelu_out[col["NPU_Stack_Info"]]
    else:
        assert gelu_out[col["NPU MD5"]] != gelu_out[col["BENCH MD5"]]


def test_xlsx_row_limit_names_parquet(runs, tmp_path, monkeypatch):
    import msprobe.compare.xlsx as X
    from msprobe.compare.errors import CompareInputError
    monkeypatch.setattr(X, "MAX_ROWS", 10)
    with pytest.raises(CompareInputError, match=r"rank 0 has \d+ rows, over Excel's 10; use --format parquet"):
        C.compare(runs["same"], runs["base"], out=tmp_path / "o", formats="xlsx")


def test_xlsx_tensor_mode(tmp_path, record_run, scaled_fn):
    base = record_run(tmp_path / "tb", task="tensor")
    gelu = record_run(tmp_path / "tg", task="tensor", perturb={"F.gelu": scaled_fn(1 + 1e-3)})
    out = tmp_path / "o"
    r = C.compare(gelu, base, mode="tensor", out=out, formats="xlsx")
    header, rows, fills = _book(out)
    assert list(header) == COLUMNS["tensor"]
    col = {c: i for i, c in enumerate(header)}
    row = next(x for x in rows if x[0] == "Functional.gelu.0.forward.output.0")
    (cos, mae), = r.con.sql("SELECT cosine, max_abs_err FROM tensors WHERE t_call = 'Functional.gelu.0.forward' "
                            "AND io = 'output'").fetchall()
    assert row[col["Cosine"]] == pytest.approx(cos) and row[col["MaxAbsErr"]] == pytest.approx(mae)
    assert row[col["Accuracy Reached or Not"]] == "No"
    assert row[col["Data_name"]] == str(["Functional.gelu.0.forward.output.0.pt"] * 2)
    first = next(x for x in rows if x[0] == "Functional.linear.0.forward.input.0")
    assert first[col["Accuracy Reached or Not"]] == "Yes" and first[col["Cosine"]] == pytest.approx(1.0)


def test_xlsx_holds_every_row_past_one_fetch(tmp_path, record_run):
    """A compare with more leaf pairs than one DuckDB fetch (7 steps of the conftest Net:
    over 1,100 rows) writes every row, in the order and with the names of the CSV output."""
    import csv

    import msprobe.compare.xlsx as X

    base = record_run(tmp_path / "b", md5=True, steps=7)
    same = record_run(tmp_path / "s", md5=True, steps=7)
    out = tmp_path / "o"
    r = C.compare(same, base, mode="md5", out=out, formats="xlsx,csv")
    (n,), = r.con.sql("SELECT count(*) FROM tensors").fetchall()
    assert n > X.FETCH_ROWS
    header, rows, _ = _book(out)
    assert len(rows) == n
    with open(out / "tensors.csv", newline="") as fh:
        csv_rows = list(csv.DictReader(fh))
    assert len(csv_rows) == n
    col = {c: i for i, c in enumerate(header)}
    assert [row[col["NPU MD5"]] for row in rows] == [c["t_md5"] or "N/A" for c in csv_rows]
    # a row carries its call's stack wherever the call recorded one, past the first fetch too
    has_stack = [s is not None for (s,) in r.con.sql(
        "SELECT c.stack_id FROM tensors t LEFT JOIN calls c ON c.rank = t.rank AND c.step = t.step "
        "AND c.t_seq = t.aid ORDER BY t.step, t.ord, t.t_lord").fetchall()]
    assert sum(has_stack[X.FETCH_ROWS:]) > 0
    assert ["conftest.py" in (row[col["NPU_Stack_Info"]] or "") for row in rows] == has_stack
    assert [row[col["NPU MD5"]] for row in rows] == [row[col["BENCH MD5"]] for row in rows]
