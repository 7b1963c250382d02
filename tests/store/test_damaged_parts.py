"""The Parquet parts are a copy of the log: an unreadable manifest or a part file deleted by
hand makes the readers fall back to the log (same answers, one notice), and a part whose log
file is gone too is reported as skipped (compare says incomplete), never a traceback."""
from __future__ import annotations

import pytest

from msprobe.cli import main
from store import schema as S
from store.compact import compact
from store.manifest import MANIFEST_NAME, load_manifest
from store.query import query
from store.select import StoreReader

SQL = "SELECT rank, step, seq, io, arg, norm, crc32 FROM tensors ORDER BY rank, seq, io, arg"
CALLS = "SELECT rank, step, seq, name FROM calls ORDER BY rank, seq, name"


def _rows(dump, sql, **kw) -> list:
    """The result rows, values as repr() (NaN equals NaN)."""
    return [{k: repr(v) for k, v in row.items()} for row in query(dump, sql, **kw).to_pylist()]


def _compacted(tmp_path, sample):
    dump = tmp_path / "d"
    for r in (0, 1):
        sample.write_scenario(dump, rank=r, meta={**sample.META_MIX, "rank_dir": f"rank{r}"}, flush_rows=5)
    expected = {sql: _rows(dump, sql) for sql in (SQL, CALLS)}   # the log alone
    compact(dump)
    parts = load_manifest(dump / S.STORE_DIR / "parquet").parts
    assert parts
    return dump, expected, parts


@pytest.mark.parametrize("text", ["", "{\"parts\": [", "[]", "{\"parts\": 5}", "{\"parts\": [{\"path\": 1}]}"])
def test_unreadable_manifest_reads_the_log_with_a_notice(tmp_path, sample, text):
    dump, expected, _ = _compacted(tmp_path, sample)
    (dump / S.STORE_DIR / "parquet" / MANIFEST_NAME).write_text(text)
    notices: list[str] = []
    for sql in (SQL, CALLS):
        assert _rows(dump, sql, notices=notices) == expected[sql]
    assert notices and all(n.startswith("read from the log: ") and MANIFEST_NAME in n for n in notices)


def test_missing_part_reads_its_log_file_whole(tmp_path, sample, capsys):
    dump, expected, parts = _compacted(tmp_path, sample)
    gone = next(p for p in parts if p.rank == 1 and p.steps[0] >= 0)
    (dump / S.STORE_DIR / "parquet" / gone.path).unlink()
    reader = StoreReader(dump)
    assert not reader.skipped and len(reader.recovered) == 1 and gone.path in reader.recovered[0]
    for sql in (SQL, CALLS):
        assert _rows(dump, sql) == expected[sql]
    # a selection that does not touch the missing part keeps reading the parts
    assert _rows(dump, SQL, ranks=[0]) == [r for r in expected[SQL] if r["rank"] == "0"]
    assert StoreReader(dump, ranks=[0]).recovered == []
    assert main(["query", str(dump), "SELECT count(*) AS n FROM tensors", "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[1] == str(len(expected[SQL])) and "read from the log:" in err


def test_missing_part_and_log_is_skipped_and_compare_is_incomplete(tmp_path, sample, capsys):
    dump, expected, parts = _compacted(tmp_path, sample)
    whole = tmp_path / "whole"
    for r in (0, 1):
        sample.write_scenario(whole, rank=r, meta={**sample.META_MIX, "rank_dir": f"rank{r}"}, flush_rows=5)
    gone = next(p for p in parts if p.rank == 1 and p.steps[0] >= 0)
    (dump / S.STORE_DIR / "parquet" / gone.path).unlink()
    (dump / S.STORE_DIR / S.LOG_DIR / gone.log_file).unlink()
    reader = StoreReader(dump)
    assert [s.rows for s in reader.skipped] == [gone.rows] and reader.skipped[0].offset == -1
    assert reader.skipped[0].steps == tuple(gone.steps)
    first, last = gone.steps
    assert _rows(dump, SQL) == [r for r in expected[SQL] if r["rank"] != "1" or not first <= int(r["step"]) <= last]
    capsys.readouterr()
    assert main(["compare", str(dump), str(whole)]) == 3
    out, err = capsys.readouterr()
    assert "incomplete" in (out + err) and gone.path.split("/")[-1] in (out + err)


def test_selected_rank_not_in_the_dump_is_named(tmp_path, sample, capsys):
    dump, expected, _ = _compacted(tmp_path, sample)
    assert StoreReader(dump, ranks=[0, 1]).notices() == []
    assert StoreReader(dump, ranks=[1, 7, 9]).notices() == [
        f"selected ranks 7, 9: not in {str(dump)!r} (ranks there: 0, 1)"]
    assert main(["query", str(dump), "SELECT count(*) AS n FROM tensors", "--rank", "7", "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    assert out == "n\n0\n" and f"selected rank 7: not in {str(dump)!r} (ranks there: 0, 1)" in err


def test_export_names_a_missing_part_and_an_absent_rank(tmp_path, sample, capsys):
    dump, _, parts = _compacted(tmp_path, sample)
    assert main(["export", str(dump), "--rank", "1", "-o", str(tmp_path / "before")]) == 0
    gone = next(p for p in parts if p.rank == 1 and p.steps[0] >= 0)
    (dump / S.STORE_DIR / "parquet" / gone.path).unlink()
    capsys.readouterr()
    assert main(["export", str(dump), "--rank", "1,5", "-o", str(tmp_path / "out")]) == 0
    out, err = capsys.readouterr()
    assert "read from the log: " in err and gone.path in err
    assert f"selected rank 5: not in {str(dump)!r} (ranks there: 0, 1)" in err
    assert "skipped" not in err
    before = sorted(p.relative_to(tmp_path / "before") for p in (tmp_path / "before").rglob("*.json"))
    assert before and before == sorted(p.relative_to(tmp_path / "out") for p in (tmp_path / "out").rglob("*.json"))
    for rel in before:
        assert (tmp_path / "out" / rel).read_bytes() == (tmp_path / "before" / rel).read_bytes()


def test_compact_on_an_unreadable_manifest_says_how_to_rebuild(tmp_path, sample, capsys):
    import shutil

    dump, expected, _ = _compacted(tmp_path, sample)
    directory = dump / S.STORE_DIR / "parquet"
    (directory / MANIFEST_NAME).write_text("{\"parts\": [")
    capsys.readouterr()
    assert main(["compact", str(dump)]) == 2
    err = capsys.readouterr().err
    assert "not a readable msprobe manifest" in err and f"delete {str(directory)!r} and run msprobe compact" in err
    shutil.rmtree(directory)
    assert main(["compact", str(dump)]) == 0
    assert [_rows(dump, sql) for sql in (SQL, CALLS)] == [expected[SQL], expected[CALLS]]
    assert StoreReader(dump).notices() == [] and load_manifest(directory).parts
