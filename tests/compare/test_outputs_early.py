"""Output tables written early (msprobe.compare.outputs.EarlyTables): ``alignment`` and
``tensors`` are written on helper threads while the later stages run, under hidden
temporary names moved into place at the end; and the row order of ``tensors``."""
from __future__ import annotations

import csv

import pyarrow.parquet as pq
import pytest

import msprobe.compare as C
import msprobe.compare.engine as engine


def _rows(table) -> list:
    """The rows as sorted reprs (NaN metrics compare equal this way)."""
    return sorted(repr(row) for row in table.to_pylist())


def test_early_tables_hold_the_final_tables(runs, tmp_path):
    out = tmp_path / "o"
    r = C.compare(runs["ins_ln"], runs["base"], out=out, formats=["summary", "parquet", "csv"])
    for name in ("tensors", "alignment", "calls"):
        held = r.con.sql(f"SELECT * FROM {name}").to_arrow_table()
        written = pq.read_table(out / f"{name}.parquet")
        assert written.column_names == held.column_names
        assert written.num_rows == held.num_rows > 0
        assert _rows(written) == _rows(held)
        with open(out / f"{name}.csv", newline="") as handle:
            assert sum(1 for _ in csv.reader(handle)) == held.num_rows + 1      # header + rows
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["summary.json"] + [f"{n}.{f}" for n in ("tensors", "alignment", "calls") for f in ("parquet", "csv")])


def test_failure_after_early_writes_leaves_no_tables(runs, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("call verdicts failed")

    monkeypatch.setattr(engine, "build_calls", broken)
    out = tmp_path / "o"
    with pytest.raises(RuntimeError, match="call verdicts failed"):
        C.compare(runs["gelu"], runs["base"], out=out, formats=["summary", "parquet", "csv"])
    # tensors and alignment had been handed to the early writer: nothing of them is left
    assert not out.exists() or list(out.iterdir()) == []


def test_tensors_rows_follow_the_alignment_then_leaf_order(runs):
    r = C.compare(runs["ins_ln"], runs["base"])
    rows = r.con.sql("SELECT rank, step, ord, t_lord, b_lord, in_t FROM tensors").fetchall()
    assert len(rows) > 0
    keys = [(rank, step, o, 0 if in_t else 1, t_lord if in_t else b_lord)
            for rank, step, o, t_lord, b_lord, in_t in rows]
    assert keys == sorted(keys)
    again = C.compare(runs["ins_ln"], runs["base"]).con.sql("SELECT * FROM tensors").to_arrow_table()
    first = r.con.sql("SELECT * FROM tensors").to_arrow_table()
    assert [repr(row) for row in again.to_pylist()] == [repr(row) for row in first.to_pylist()]
