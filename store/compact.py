"""``msprobe compact``: the finished steps of the event log as Hive-partitioned Parquet.

The Arrow IPC log stays the source of truth (design.md, section Store); compaction adds,
under ``{dump_path}/.msprobe/parquet/`` (or another directory), Parquet parts of the steps
finished since the previous run, a manifest and a per-(rank, step) summary. Layout:
:mod:`store.manifest`; how steps are cut and parts written: :mod:`store.parts`. Compacting
again writes only new steps; nothing under ``.msprobe/log/`` is touched.

The parts need only a Parquet reader: DuckDB ``read_parquet(..., hive_partitioning=true)``,
pyarrow datasets, Polars, Spark (``spark.read.parquet``), Trino... See docs/distributed.md.
"""
from __future__ import annotations

import os
from typing import Optional, Union

from store.manifest import PARQUET_DIR
from store.parts import CompactReport, Compactor, follow

__all__ = ["PARQUET_DIR", "CompactReport", "compact", "follow"]


def compact(dump_path: Union[str, os.PathLike], out: Optional[Union[str, os.PathLike]] = None) -> CompactReport:
    """Write the steps of the log under ``dump_path`` finished since the last compaction.

    Args:
        dump_path: the dump directory (log under ``.msprobe/log/``).
        out: Parquet directory; default ``{dump_path}/.msprobe/parquet`` (where ``msprobe
            query`` and the other readers look for parts). Created (mode 0o750) if missing.
    Returns:
        :class:`store.parts.CompactReport` (the parts written by this run).
    Raises:
        LogNotFoundError: no log under ``dump_path``.
        store.manifest.ManifestError: the existing manifest cannot be read.
        OSError: the output directory or a file cannot be written.

    Example: after a closed run of ranks 0 and 1 with steps 0..2,
    ``duckdb.sql("SELECT rank, count(*) FROM read_parquet('.../parquet/step_bucket=*/rank=*/*.parquet',
    hive_partitioning=true) GROUP BY rank")`` counts the call and leaf rows of each rank.
    """
    return Compactor(dump_path, out).run_once()
