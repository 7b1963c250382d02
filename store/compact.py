"""``msprobe compact``: a Parquet copy of the event log, one file per rank.

The Arrow IPC log stays the source of truth (design.md, section Store): compaction reads
it with :func:`store.log_reader.read_log` (torn tails skipped, ``seq`` made increasing per
rank across files) and writes ``rank{R}.parquet`` files holding exactly those rows, in
:data:`store.schema.LOG_SCHEMA` (format version in the schema metadata), to
``{dump_path}/.msprobe/parquet/`` or another directory. Each file is written under a
temporary name and renamed, so a reader never sees half a file; compacting again rewrites
the copy from the log (idempotent). Nothing under ``.msprobe/log/`` is touched.

The files need only a Parquet reader: DuckDB ``read_parquet``, pyarrow, pandas, Spark
(``spark.read.parquet``), Trino... See docs/distributed.md for the queries.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union


from store import schema as S
from store.fileutil import FILE_MODE, make_dirs
from store.log_reader import Skipped, read_log

__all__ = ["PARQUET_DIR", "CompactReport", "compact"]

PARQUET_DIR = "parquet"


@dataclass(frozen=True)
class CompactReport:
    """What :func:`compact` did: ``written`` Parquet files (one per rank, by rank) with
    their row counts in ``rows``; ``skipped`` unreadable parts of log files."""

    written: tuple[Path, ...]
    rows: tuple[int, ...]
    skipped: tuple[Skipped, ...]


def compact(dump_path: Union[str, os.PathLike], out: Optional[Union[str, os.PathLike]] = None) -> CompactReport:
    """Write the log under ``dump_path`` as ``rank{R}.parquet`` files.

    Args:
        dump_path: the dump directory (log under ``.msprobe/log/``).
        out: output directory; default ``{dump_path}/.msprobe/parquet``. Created (mode
            0o750) if missing.
    Returns:
        :class:`CompactReport`.
    Raises:
        LogNotFoundError: no log under ``dump_path``.
        OSError: the output directory or a file cannot be written.

    Example: a run of ranks 0 and 1 gives ``rank0.parquet`` and ``rank1.parquet``;
    ``duckdb.sql("SELECT count(*) FROM read_parquet('.../rank*.parquet')")`` counts the
    rows of both.
    """
    import pyarrow.compute as pc  # offline only: loaded when compaction runs
    import pyarrow.parquet as pq

    contents = read_log(dump_path)
    out_dir = make_dirs(Path(out) if out is not None else Path(dump_path) / S.STORE_DIR / PARQUET_DIR)
    table = contents.table
    written: list[Path] = []
    rows: list[int] = []
    for rank in sorted(pc.unique(table[S.RANK]).to_pylist()):
        part = table.filter(pc.equal(table[S.RANK], S.scalar(rank, S.RANK)))
        target = out_dir / f"rank{rank}.parquet"
        tmp = out_dir / f".rank{rank}.parquet.{os.getpid()}.tmp"
        try:
            pq.write_table(part, tmp, compression="zstd")
            os.chmod(tmp, FILE_MODE)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                tmp.unlink()
        written.append(target)
        rows.append(part.num_rows)
    return CompactReport(written=tuple(written), rows=tuple(rows), skipped=contents.skipped)
