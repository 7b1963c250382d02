"""store.compact: Parquet copies of the log, one file per rank; the log stays untouched."""
from __future__ import annotations

import os

import duckdb
import pyarrow.parquet as pq
import pytest

from msprobe.cli import main
from store import schema as S
from store.compact import compact
from store.errors import LogNotFoundError
from store.log_reader import read_log
from store.query import query


def test_one_parquet_per_rank_with_the_log_rows(tmp_path, sample):
    dump = tmp_path / "d"
    for r in (0, 3):
        sample.write_scenario(dump, rank=r, meta={**sample.META_MIX, "rank_dir": f"rank{r}"})
    logs = sorted((dump / S.STORE_DIR / S.LOG_DIR).iterdir())
    assert len(logs) == 2
    before = {p: p.read_bytes() for p in logs}
    report = compact(dump)
    out = dump / S.STORE_DIR / "parquet"
    assert report.written == (out / "rank0.parquet", out / "rank3.parquet")
    log = read_log(dump).table
    for rank, path, rows in zip((0, 3), report.written, report.rows):
        part = pq.read_table(path)
        assert part.schema.equals(S.LOG_SCHEMA, check_metadata=False)
        assert part.schema.metadata[S.FORMAT_KEY] == S.FORMAT_VERSION.encode()
        expected = log.filter(log[S.RANK].to_numpy() == rank)
        assert part.num_rows == rows == expected.num_rows
        assert repr(part.to_pylist()) == repr(expected.to_pylist())  # repr: NaN == NaN
        assert oct(os.stat(path).st_mode & 0o777) == oct(0o640)
    assert {p: p.read_bytes() for p in logs} == before            # the log is not rewritten
    assert sorted(os.listdir(out)) == ["rank0.parquet", "rank3.parquet"]  # no temporary left
    again = compact(dump)                                          # idempotent
    assert again.written == report.written and again.rows == report.rows


def test_duckdb_over_parquet_matches_the_views(tmp_path, sample):
    dump = tmp_path / "d"
    sample.write_scenario(dump, rank=0)
    out = tmp_path / "pq"
    assert main(["compact", str(dump), "-o", str(out)]) == 0
    sql = ("SELECT rank, step, seq, name, io, arg, max, norm FROM {src} "
           "WHERE row = 'leaf' AND leaf_kind = 'tensor' ORDER BY rank, seq, arg")
    from_parquet = duckdb.sql(sql.format(src=f"read_parquet('{out}/rank*.parquet')")).fetchall()
    from_views = query(dump, sql.replace("row = 'leaf' AND leaf_kind = 'tensor'", "true").format(src="tensors")).to_pylist()
    assert repr(from_parquet) == repr([tuple(r.values()) for r in from_views]) and from_parquet


def test_missing_log_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(LogNotFoundError, match="no msprobe log"):
        compact(tmp_path)
    assert main(["compact", str(tmp_path)]) == 2
    assert "msprobe compact: error" in capsys.readouterr().err
