"""Format evolution: versions only add nullable columns; readers take older logs and parts
(a missing column reads as null, columns matched by name) and refuse newer logs."""
from __future__ import annotations

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from store import schema as S
from store.compact import compact
from store.log_reader import LogReader, read_log
from store.query import query

DROPPED = (S.MAX_FINITE, S.MIN_FINITE, S.DATA_NAME, S.PAYLOAD)


def _older(table: pa.Table, version: bytes = b"1") -> pa.Table:
    """``table`` as an older version wrote it: some nullable columns missing, the rest in
    another order, the older version number in the metadata."""
    kept = [n for n in reversed(table.column_names) if n not in DROPPED]
    return table.select(kept).replace_schema_metadata({S.FORMAT_KEY: version})


def test_an_older_log_reads_with_the_new_columns_null(tmp_path, sample):
    current = tmp_path / "now"
    sample.write_scenario(current)
    rows = read_log(current).table
    old = tmp_path / "old"
    log_dir = old / S.STORE_DIR / S.LOG_DIR
    log_dir.mkdir(parents=True)
    older = _older(rows)
    with pa.ipc.new_stream(str(log_dir / "rank0.1.1.arrows"), older.schema) as writer:
        writer.write_table(older)
    contents = read_log(old)
    assert contents.skipped == ()
    assert contents.table.schema.equals(S.LOG_SCHEMA)
    for name in S.COLUMNS:
        column = contents.table[name]
        if name in DROPPED:
            assert column.null_count == len(column)
        else:
            assert repr(column.to_pylist()) == repr(rows[name].to_pylist()), name
    sql = "SELECT rank, step, seq, name, io, arg, max, norm, crc32 FROM tensors ORDER BY seq, io, arg"
    assert repr(query(old, sql).to_pylist()) == repr(query(current, sql).to_pylist())


def test_a_newer_log_is_refused_and_reported(tmp_path):
    newer = str(int(S.FORMAT_VERSION) + 1)
    path = tmp_path / f"v{newer}.arrows"
    schema = S.LOG_SCHEMA.append(pa.field("later", pa.string())).with_metadata(
        {S.FORMAT_KEY: newer.encode()})
    with pa.ipc.new_stream(str(path), schema) as writer:
        writer.write_table(schema.empty_table())
    reader = LogReader(path)
    assert reader.read_new() == []
    assert reader.skipped[0].reason.startswith(f"unsupported: log format version '{newer}'")


def test_an_older_part_reads_with_the_new_columns_null(tmp_path, sample):
    dump = tmp_path / "d"
    for rank in (0, 1):
        sample.write_scenario(dump, rank=rank, meta={**sample.META_MIX, "rank_dir": f"rank{rank}"})
    report = compact(dump)
    before = query(dump, "SELECT rank, seq, io, arg, norm, max_finite FROM msprobe_log "
                         "WHERE row = 'leaf' ORDER BY rank, seq, io, arg").to_pylist()
    assert any(r["max_finite"] is not None for r in before if r["rank"] == 1)
    part = next(p for p in report.written if "step_bucket=" in str(p) and "rank=1" in str(p))
    pq.write_table(_older(pq.read_table(part)), part)            # rank 1's part: an older writer's
    after = query(dump, "SELECT rank, seq, io, arg, norm, max_finite FROM msprobe_log "
                        "WHERE row = 'leaf' ORDER BY rank, seq, io, arg").to_pylist()
    assert repr(after) == repr([{**r, "max_finite": None} if r["rank"] == 1 else r for r in before])
    # DuckDB alone: merge the parts by column name
    root = dump / S.STORE_DIR / "parquet"
    found = duckdb.sql(f"SELECT rank, count(max_finite) FROM read_parquet('{root}/step_bucket=*/rank=*/*.parquet', "
                       f"hive_partitioning = true, union_by_name = true) GROUP BY rank ORDER BY rank").fetchall()
    assert found[1] == (1, 0) and found[0][1] > 0
