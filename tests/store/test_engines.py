"""The compacted store read by engines without msprobe: DuckDB and Polars over the Hive
layout give the rows the views give (the recipes of docs/distributed.md)."""
from __future__ import annotations

import dataclasses

import duckdb
import pytest

from store.compact import compact
from store.log_writer import LogWriter
from store.query import query

pl = pytest.importorskip("polars")

# docs/distributed.md, "Parquet for cluster engines": first step and tensor where the ranks'
# Norms differ, in each engine's dialect
DUCKDB_SQL = """
SELECT step, name, io, arg, min(CASE WHEN rank = 0 THEN seq END) AS first_seq,
       list(norm ORDER BY rank) AS norms
FROM read_parquet('{root}/step_bucket=*/rank=*/*.parquet', hive_partitioning = true)
WHERE row = 'leaf' AND leaf_kind = 'tensor'
GROUP BY step, name, io, arg
HAVING count(DISTINCT rank) > 1 AND max(norm) <> min(norm)
ORDER BY step, first_seq, io, arg LIMIT 1
"""


def _dump(tmp_path, sample):
    dump = tmp_path / "d"
    for rank in (0, 1, 2):
        sample.write_scenario(dump, rank=rank, meta={**sample.META_MIX, "rank_dir": f"rank{rank}"})
    return dump


def test_polars_scans_the_hive_layout_like_the_views(tmp_path, sample):
    dump = _dump(tmp_path, sample)
    out = tmp_path / "pq"
    compact(dump, out)
    frame = (pl.scan_parquet(f"{out}/step_bucket=*/rank=*/*.parquet", hive_partitioning=True)
             .filter((pl.col("row") == "leaf") & (pl.col("leaf_kind") == "tensor"))
             .filter((pl.col("rank") == 1) & (pl.col("step") == 0))
             .select("rank", "step", "seq", "name", "io", "arg", "norm", "has_nan")
             .sort("seq", "io", "arg").collect())
    views = query(dump, "SELECT rank, step, seq, name, io, arg, norm, has_nan FROM tensors "
                        "WHERE rank = 1 AND step = 0 ORDER BY seq, io, arg")
    assert frame.height == views.num_rows == 17
    assert repr(frame.rows()) == repr([tuple(r.values()) for r in views.to_pylist()])
    per_rank = (pl.scan_parquet(f"{out}/step_bucket=*/rank=*/*.parquet", hive_partitioning=True)
                .group_by("rank").agg(pl.len().alias("n")).sort("rank").collect())
    # every call and leaf row of the log, per rank, and nothing from _meta/ or _summary.parquet
    counts = query(dump, "SELECT rank, count(*) AS n FROM msprobe_log WHERE row IN ('call', 'leaf') "
                         "GROUP BY rank ORDER BY rank").to_pylist()
    assert per_rank.to_dicts() == [{"rank": c["rank"], "n": c["n"]} for c in counts]


def test_duckdb_recipe_finds_the_first_differing_norm(tmp_path, sample):
    dump = _dump(tmp_path, sample)
    compact(dump)
    root = dump / ".msprobe" / "parquet"
    # every rank recorded the same events: nothing differs
    assert duckdb.sql(DUCKDB_SQL.format(root=root)).fetchall() == []
    # a fourth rank whose Linear input Norm differs
    events = sample.scenario({**sample.META_MIX, "rank_dir": "rank3"})
    call = events[0][2]
    assert call.name == "Functional.linear.0.forward" and call.leaves[0].norm == 3.0
    events[0][2] = dataclasses.replace(call, leaves=(call.leaves[0].replace(norm=5.0),) + call.leaves[1:])
    with LogWriter(dump, 3) as writer:
        for step in events:
            sample.write_events(writer, step)
    compact(dump)
    (row,) = duckdb.sql(DUCKDB_SQL.format(root=root)).fetchall()
    assert row[:4] == (0, "Functional.linear.0.forward", "input_args", "0")
    assert row[5] == [3.0, 3.0, 3.0, 5.0]


SPARK_SQL = """
SELECT step, name, io, arg, min(CASE WHEN rank = 0 THEN seq END) AS first_seq,
       transform(sort_array(collect_list(struct(rank, norm))), x -> x.norm) AS norms
FROM tensors GROUP BY step, name, io, arg
HAVING count(DISTINCT rank) > 1 AND max(norm) <> min(norm)
ORDER BY step, first_seq, io, arg LIMIT 1
"""


def test_spark_reads_the_directory_and_runs_the_docs_query(tmp_path, sample):
    """Runs only where pyspark (and a Java runtime) is installed."""
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    dump = _dump(tmp_path, sample)
    events = sample.scenario({**sample.META_MIX, "rank_dir": "rank3"})
    call = events[0][2]
    events[0][2] = dataclasses.replace(call, leaves=(call.leaves[0].replace(norm=5.0),) + call.leaves[1:])
    with LogWriter(dump, 3) as writer:
        for step in events:
            sample.write_events(writer, step)
    compact(dump)
    try:
        spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    except Exception as exc:  # noqa: BLE001 - no Java runtime
        pytest.skip(f"Spark does not start here: {exc}")
    try:
        log = spark.read.parquet(str(dump / ".msprobe" / "parquet"))
        assert {"rank", "step_bucket"} <= set(log.columns)
        expected = query(dump, "SELECT count(*) AS n FROM msprobe_log WHERE row IN ('call', 'leaf')").to_pylist()
        assert log.count() == expected[0]["n"]          # the step parts only: _meta/, _summary hidden
        log.filter("row = 'leaf' AND leaf_kind = 'tensor'").createOrReplaceTempView("tensors")
        (row,) = spark.sql(SPARK_SQL).collect()
        assert (row.step, row.name, row.io, row.arg, list(row.norms)) == (
            0, "Functional.linear.0.forward", "input_args", "0", [3.0, 3.0, 3.0, 5.0])
    finally:
        spark.stop()
