"""store.compact / store.parts: finished steps become Hive-partitioned Parquet parts with a
manifest and a per-(rank, step) summary; compaction is incremental; the log stays untouched."""
from __future__ import annotations

import math
import os

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from msprobe.cli import main
from store import schema as S
from store.compact import compact
from store.errors import LogNotFoundError
from store.log_reader import read_log
from store.log_writer import LogWriter
from store.manifest import LOG_FILE, load_manifest
from store.parts import Compactor
from store.query import query


def _two_ranks(tmp_path, sample):
    dump = tmp_path / "d"
    for r in (0, 3):
        sample.write_scenario(dump, rank=r, meta={**sample.META_MIX, "rank_dir": f"rank{r}"}, flush_rows=5)
    return dump


def _key(row: dict) -> tuple:
    return (row[S.RANK], row[S.SEQ], row[S.ROW], row[S.IO] or "", row[S.ARG] or "", row[S.STACK_ID] or 0)


def test_parts_hold_every_log_row_once_partitioned_by_step_and_rank(tmp_path, sample):
    dump = _two_ranks(tmp_path, sample)
    logs = sorted((dump / S.STORE_DIR / S.LOG_DIR).iterdir())
    before = {p: p.read_bytes() for p in logs}
    report = compact(dump)
    out = dump / S.STORE_DIR / "parquet"
    assert report.pending == 0 and not report.skipped
    log = read_log(dump).table.to_pylist()
    found = []
    for path, rows in zip(report.written, report.rows):
        rel = path.relative_to(out).as_posix()
        rank = int(rel.split("rank=")[1].split("/")[0])
        file = pq.ParquetFile(path)
        table = file.read()
        assert table.num_rows == rows
        assert table.schema.metadata[S.FORMAT_KEY] == S.FORMAT_VERSION.encode()
        assert S.RANK not in table.schema.names and LOG_FILE in table.schema.names   # rank is in the path
        assert file.metadata.row_group(0).column(0).compression == "ZSTD"
        steps = table[S.STEP].to_numpy()
        if rel.startswith("_meta/"):
            assert set(table[S.ROW].to_pylist()) <= {S.ROW_STACK, S.ROW_MARKER}
        else:
            assert rel.startswith("step_bucket=0/")
            assert set(table[S.ROW].to_pylist()) <= {S.ROW_CALL, S.ROW_LEAF}
            # one row group per step, rows sorted by (step, seq)
            assert file.num_row_groups == len(np.unique(steps))
            for g in range(file.num_row_groups):
                assert len(np.unique(file.read_row_group(g)[S.STEP].to_numpy())) == 1
            order = np.lexsort((table[S.SEQ].to_numpy(), steps))
            assert (order == np.arange(len(order))).all()
        assert oct(os.stat(path).st_mode & 0o777) == oct(0o640)
        for row in table.to_pylist():
            row[S.RANK] = rank
            found.append({c: row[c] for c in S.COLUMNS})
    assert len(found) == len(log)
    assert repr(sorted(found, key=_key)) == repr(sorted(log, key=_key))     # repr: NaN == NaN
    assert {p: p.read_bytes() for p in logs} == before                     # the log is not rewritten
    assert not list(out.rglob("*.tmp"))
    assert compact(dump).written == ()                                     # nothing new: nothing written


def test_manifest_counts_and_log_coverage(tmp_path, sample):
    dump = _two_ranks(tmp_path, sample)
    compact(dump)
    manifest = load_manifest(dump / S.STORE_DIR / "parquet")
    log = read_log(dump).table
    for rank in (0, 3):
        rows = log.filter(log[S.RANK].to_numpy() == rank).to_pylist()
        tensors = [r for r in rows if r[S.ROW] == S.ROW_LEAF and r[S.LEAF_KIND] == S.LEAF_TENSOR]
        parts = [p for p in manifest.parts if p.rank == rank]
        assert sum(p.rows for p in parts) == len(rows)
        assert sum(p.tensors for p in parts) == len(tensors)
        assert sum(p.nan for p in parts) == sum(bool(r[S.HAS_NAN]) for r in tensors) == 1
        assert sum(p.inf for p in parts) == sum(bool(r[S.HAS_INF]) for r in tensors) == 1
        data = [p for p in parts if p.steps[0] >= 0]
        assert [p.steps for p in data] == [[0, 1]]
    for path in (dump / S.STORE_DIR / S.LOG_DIR).iterdir():
        coverage = manifest.logs[path.name]
        assert coverage.complete and coverage.bytes == path.stat().st_size
        assert coverage.rows == coverage.read_rows == (log[S.RANK].to_numpy() == int(path.name[4])).sum()


def test_summary_answers_first_nan_and_max_norm_per_step(tmp_path, sample):
    dump = _two_ranks(tmp_path, sample)
    compact(dump)
    summary = pq.read_table(dump / S.STORE_DIR / "parquet" / "_summary.parquet").to_pylist()
    log = read_log(dump).table.to_pylist()
    expected = []
    for rank in (0, 3):
        for step in (0, 1):
            rows = [r for r in log if r[S.RANK] == rank and r[S.STEP] == step]
            tensors = [r for r in rows if r[S.ROW] == S.ROW_LEAF and r[S.LEAF_KIND] == S.LEAF_TENSOR]
            nan = sorted((r for r in tensors if r[S.HAS_NAN]), key=lambda r: r[S.SEQ])
            finite = [r for r in tensors if r[S.NORM] is not None and math.isfinite(r[S.NORM])]
            top = max(finite, key=lambda r: r[S.NORM])
            expected.append({
                "rank": rank, "step": step, "call_rows": sum(r[S.ROW] == S.ROW_CALL for r in rows),
                "tensors": len(tensors), "nan_tensors": len(nan),
                "inf_tensors": sum(bool(r[S.HAS_INF]) for r in tensors),
                "first_nan_seq": nan[0][S.SEQ] if nan else None, "first_nan_name": nan[0][S.NAME] if nan else None,
                "max_norm": top[S.NORM], "max_norm_name": top[S.NAME]})
    assert summary == expected
    assert expected[0]["first_nan_name"] == "Functional.linear.0.forward" and expected[0]["max_norm"] == 4.0
    # the summary view gives the same before compaction (computed from the log)
    fresh = _two_ranks(tmp_path / "fresh", sample)
    assert query(fresh, "SELECT * FROM summary").to_pylist() == expected
    assert query(dump, "SELECT * FROM summary").to_pylist() == expected


def test_a_live_log_is_compacted_step_by_step(tmp_path, sample):
    """Only finished steps are compacted; the open step stays in the log, where the views
    still read it; each pass writes only the new steps, reading on where it stopped."""
    dump = tmp_path / "live"
    steps = sample.scenario()
    writer = LogWriter(dump, 0, flush_rows=5, flush_interval_s=3600)
    compactor = Compactor(dump)
    try:
        sample.write_events(writer, steps[0][:-1])                   # step 0 without its step_end
        writer.flush()
        first = compactor.run_once()
        assert first.written == () and first.pending > 0            # step 0 may still grow
        sample.write_events(writer, steps[0][-1:])                  # step_end of step 0
        writer.flush()
        second = compactor.run_once()
        assert [p.steps for p in compactor.manifest.parts if p.steps[0] >= 0] == [[0, 0]]
        assert second.pending == 0
        sample.write_events(writer, steps[1])                       # step 1 ends without step_end
        writer.flush()
        third = compactor.run_once()
        assert third.written == () and third.pending > 0
        live = query(dump, "SELECT rank, step, seq, name, io, arg, norm FROM tensors ORDER BY seq, io, arg")
        assert live.num_rows == 19 and set(live[S.STEP].to_pylist()) == {0, 1}
    finally:
        writer.close()
    last = compactor.run_once()
    assert last.pending == 0 and [p.steps for p in compactor.manifest.parts if p.steps[0] >= 0] == [[0, 0], [1, 1]]
    assert all(c.complete for c in compactor.manifest.logs.values())
    # a fresh compactor (another process) finds nothing new
    assert Compactor(dump).run_once().written == ()
    done = query(dump, "SELECT rank, step, seq, name, io, arg, norm FROM tensors ORDER BY seq, io, arg")
    assert repr(done.to_pylist()) == repr(live.to_pylist())


def test_a_part_not_in_the_manifest_is_removed_and_written_again(tmp_path, sample):
    dump = _two_ranks(tmp_path, sample)
    report = compact(dump)
    out = dump / S.STORE_DIR / "parquet"
    stray = out / "step_bucket=0" / "rank=0" / "part-stray-0.parquet"
    stray.write_bytes(report.written[1].read_bytes())
    compact(dump)
    assert not stray.exists()
    assert query(dump, "SELECT count(*) AS n FROM tensors").to_pylist() == [{"n": 38}]


def test_duckdb_reads_the_layout_by_hive_partitioning(tmp_path, sample):
    dump = _two_ranks(tmp_path, sample)
    out = tmp_path / "pq"
    assert main(["compact", str(dump), "-o", str(out)]) == 0
    sql = ("SELECT rank, step, seq, name, io, arg, max, norm FROM {src} "
           "WHERE row = 'leaf' AND leaf_kind = 'tensor' ORDER BY rank, seq, arg, io")
    glob = f"read_parquet('{out}/step_bucket=*/rank=*/*.parquet', hive_partitioning=true)"
    from_parquet = duckdb.sql(sql.format(src=glob)).fetchall()
    from_views = query(dump, sql.replace("row = 'leaf' AND leaf_kind = 'tensor'", "true").format(src="tensors"))
    assert repr(from_parquet) == repr([tuple(r.values()) for r in from_views.to_pylist()]) and from_parquet
    # a point query prunes by the partition columns
    assert duckdb.sql(f"SELECT count(*) FROM {glob} WHERE rank = 3 AND step = 1 AND row = 'leaf' "
                      f"AND leaf_kind = 'tensor'").fetchall() == [(2,)]


def test_missing_log_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(LogNotFoundError, match="no msprobe log"):
        compact(tmp_path)
    assert main(["compact", str(tmp_path)]) == 2
    assert "msprobe compact: error" in capsys.readouterr().err


def test_follow_ends_once_every_log_is_closed_and_compacted(tmp_path, sample):
    from store.compact import follow

    empty = tmp_path / "empty"
    empty.mkdir()
    passes = []
    follow(empty, interval=0.01, should_stop=lambda: len(passes.append(1) or passes) > 3)
    assert len(passes) == 4                                     # no log yet: it waited
    dump = _two_ranks(tmp_path, sample)
    reports = []
    follow(dump, interval=0.01, report=reports.append)
    assert len(reports) == 1 and reports[0].pending == 0       # one pass: both logs closed
    assert main(["compact", str(dump), "--follow", "--interval", "0.01"]) == 0
    assert query(dump, "SELECT count(*) AS n FROM tensors").to_pylist() == [{"n": 38}]
    assert main(["compact", str(dump), "--follow", "--interval", "0"]) == 2


def test_two_compactors_take_turns_and_share_the_manifest(tmp_path, sample):
    dump = tmp_path / "d"
    steps = sample.scenario()
    first, second = Compactor(dump), None
    with LogWriter(dump, 0, flush_rows=5, flush_interval_s=3600) as writer:
        sample.write_events(writer, steps[0])
        writer.flush()
        first.run_once()                                    # step 0 (its step_end is in the log)
        second = Compactor(dump)
        sample.write_events(writer, steps[1])
    second.run_once()                                       # step 1, after the writer closed
    assert first.run_once().written == ()                   # sees the other's parts: nothing left
    manifest = load_manifest(dump / S.STORE_DIR / "parquet")
    assert sorted(p.steps for p in manifest.parts if p.steps[0] >= 0) == [[0, 0], [1, 1]]
    assert query(dump, "SELECT count(*) AS n FROM tensors").to_pylist() == [{"n": 19}]


def test_follow_says_when_it_waits_for_the_first_log(tmp_path, sample, monkeypatch, capsys):
    import store.compact

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(store.compact, "follow", interrupted)
    assert main(["compact", str(tmp_path / "typo"), "--follow"]) == 0    # Ctrl-C ends it
    assert f"waiting for a log under {tmp_path / 'typo' / '.msprobe' / 'log'}" in capsys.readouterr().err
    dump = _two_ranks(tmp_path, sample)
    assert main(["compact", str(dump), "--follow"]) == 0
    assert "waiting" not in capsys.readouterr().err
