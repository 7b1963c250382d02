"""SQL over the event log: DuckDB views ``tensors``, ``calls`` and ``stacks``.

The views are the public contract (design.md, section Store):

``tensors``
    one row per tensor leaf: rank, step, seq, name, api_type, direction (``'forward'``
    for api_forward/module_forward/debug_save and for kernel rows outside MindSpore's
    ``Gradients/`` scope, else ``'backward'``), io, arg, dtype,
    shape, numel, max, min, mean, norm, crc32, requires_grad, has_nan, has_inf,
    data_name.
``calls``
    one row per dump.json entry (call rows of one rank, step and name merged, as the
    exporter merges ``parameters_grad`` rows): rank, step, seq (the smallest), name,
    kind, parent, stack_id, is_recompute (each from the first row, by seq, where set).
    Rows of different log files are not merged: where two runs wrote into one dump path
    (msprobe warns), each run's calls stay rows of their own, as its tensors do in
    ``tensors`` (``seq`` tells them apart: a later file's rows come after an earlier one's).
``stacks``
    stack_id, depth (0 = innermost frame), frame.
``replicas``
    one row per tensor recorded by the ranks of one replica group, the ranks' CRC-32s
    and statistics side by side and whether they agree (:mod:`store.replicas`); the group
    is ranks ``0 .. world_size-1`` of the recorded world size, else the ranks in the log.

``summary``
    one row per (rank, step): call_rows, tensors, nan_tensors, inf_tensors, first_nan_seq,
    first_nan_name, max_norm, max_norm_name (:func:`store.parts.summary_sql`), from the
    compaction's ``_summary.parquet`` for compacted steps, computed from the log for the rest.

Where the views read from (:class:`store.select.StoreReader`): the Parquet parts written by
``msprobe compact`` (:mod:`store.manifest`), scanned lazily as pyarrow datasets (filters and
columns pushed into the scan; nothing copied into DuckDB), unioned with the rows of the log
not yet compacted. ``ranks``/``steps`` choose the part files and log files before anything
is read. The parts are scanned through pyarrow rather than DuckDB's ``read_parquet`` so
that DuckDB's own file access stays off (see below).

``seq`` orders the rows of one rank (see :class:`store.log_reader.LogContents`).
The connection is in-memory and read-only towards the file system: after setup,
``enable_external_access`` is off and the configuration is locked, so user SQL can neither
read nor write files (``COPY ... TO``, ``ATTACH``, ``read_csv`` fail).
"""
from __future__ import annotations

import os
from typing import Iterable, Optional, Sequence, Union

import duckdb
import numpy as np
import pyarrow as pa

from store import schema as S
from store.errors import QueryError
from store.log_reader import LogContents
from store.manifest import LOG_FILE, SUMMARY_NAME
from store.parts import merge_summary_sql, summary_sql
from store.select import TAIL_SCHEMA, StoreReader
from store.replicas import create_replicas_view, default_groups, log_source_sql, recorded_world_size

__all__ = ["VIEW_CALLS", "VIEW_STACKS", "VIEW_SUMMARY", "VIEW_TENSORS", "connect", "query", "set_replica_groups"]

VIEW_TENSORS = "tensors"
VIEW_CALLS = "calls"
VIEW_STACKS = "stacks"
# view-only column names (the other view columns are log columns of store.schema)
DIRECTION = "direction"
DEPTH = "depth"
FRAME = "frame"
FORWARD = "forward"
BACKWARD = "backward"

VIEW_SUMMARY = "summary"
_LOG_TABLE = "msprobe_log"
_SOURCES = ("msprobe_parts", "msprobe_meta", "msprobe_tail")
_SUMMARY_TABLE = "msprobe_summary_parts"


def _sql_list(values) -> str:
    return ", ".join("'" + value.replace("'", "''") + "'" for value in values)


def relation_exists(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether ``con`` holds a table or view named ``name`` (temporary ones included)."""
    return bool(con.execute("SELECT 1 FROM duckdb_tables() WHERE table_name = ? UNION ALL "
                            "SELECT 1 FROM duckdb_views() WHERE view_name = ?", [name, name]).fetchall())


def calls_sql(log: str, attributes: Sequence[str] = (S.KIND, S.PARENT, S.STACK_ID, S.IS_RECOMPUTE)) -> str:
    """The SELECT of the ``calls`` view over the relation ``log`` (log columns): one row per
    (rank, step, name, log file) with the entry's first ``seq`` and ``attributes``, each
    from the first call row where it is set (``arg_min`` skips NULL arguments)."""
    picked = "".join(f"arg_min({a}, {S.SEQ}) AS {a}, " for a in attributes)
    return (f"SELECT {S.RANK}, {S.STEP}, min({S.SEQ}) AS {S.SEQ}, {S.NAME}, {picked.rstrip(', ')} "
            f"FROM {log} WHERE {S.ROW} = '{S.ROW_CALL}' GROUP BY {S.RANK}, {S.STEP}, {S.NAME}, {LOG_FILE}")


def _create_views(con: duckdb.DuckDBPyConnection, sources: list, steps, ranks=None, groups=None) -> None:
    """The views over ``sources`` (registered relations of :data:`_SOURCES`); ``ranks``:
    the ranks present when known without a scan (default: read from the call rows);
    ``groups``: the replica groups (default: from the recorded world size)."""
    columns = ", ".join(TAIL_SCHEMA.names)
    selects = []
    for name in sources:
        where = ""
        if name == "msprobe_parts" and steps is not None:
            where = f" WHERE {S.STEP} IN ({', '.join(str(s) for s in sorted(steps)) or 'NULL'})"
        selects.append(f"SELECT {columns} FROM {name}{where}")
    con.execute(f"CREATE VIEW {_LOG_TABLE} AS " + " UNION ALL ".join(selects))
    log = _LOG_TABLE
    tensor_columns = ", ".join(
        [S.RANK, S.STEP, S.SEQ, S.NAME, S.API_TYPE]
        + [
            f"CASE WHEN {S.KIND} IN ({_sql_list(S.FORWARD_KINDS)}) THEN '{FORWARD}' "
            f"WHEN {S.KIND} = '{S.KERNEL}' AND NOT regexp_matches({S.NAME}, '{S.KERNEL_BACKWARD_RE}') "
            f"THEN '{FORWARD}' ELSE '{BACKWARD}' END AS {DIRECTION}"
        ]
        + [S.IO, S.ARG, S.DTYPE, S.SHAPE, S.NUMEL, S.MAX, S.MIN, S.MEAN, S.NORM, S.CRC32,
           S.REQUIRES_GRAD, S.HAS_NAN, S.HAS_INF, S.DATA_NAME]
    )
    con.execute(
        f"CREATE VIEW {VIEW_TENSORS} AS SELECT {tensor_columns} FROM {log} "
        f"WHERE {S.ROW} = '{S.ROW_LEAF}' AND {S.LEAF_KIND} = '{S.LEAF_TENSOR}'"
    )
    con.execute(f"CREATE VIEW {VIEW_CALLS} AS {calls_sql(log)}")
    # a stack id names the same frames wherever it is interned (store.records.Stack)
    con.execute(
        f"CREATE VIEW {VIEW_STACKS} AS SELECT {S.STACK_ID}, "
        f"CAST(generate_subscripts({S.FRAMES}, 1) - 1 AS INTEGER) AS {DEPTH}, unnest({S.FRAMES}) AS {FRAME} "
        f"FROM (SELECT {S.STACK_ID}, arg_min({S.FRAMES}, {LOG_FILE}) AS {S.FRAMES} FROM {log} "
        f"WHERE {S.ROW} = '{S.ROW_STACK}' AND {S.STACK_ID} IS NOT NULL GROUP BY {S.STACK_ID})"
    )
    con.execute(
        f"CREATE VIEW {VIEW_SUMMARY} AS SELECT * FROM (" + merge_summary_sql(
            f"(SELECT * FROM {_SUMMARY_TABLE} UNION ALL BY NAME "
            f"{summary_sql('msprobe_tail')})") + ") ORDER BY rank, step"
    )
    if groups is not None:
        set_replica_groups(con, groups)
        return
    if ranks is None:
        ranks = [r for (r,) in con.execute(f"SELECT DISTINCT {S.RANK} FROM {log} WHERE {S.ROW} = '{S.ROW_CALL}'"
                                           ).fetchall()]
    # markers are in the _meta parts and the tail: the step parts are not scanned for them
    markers = " UNION ALL ".join(f"SELECT {S.ROW}, {S.META} FROM {n}" for n in sources if n != "msprobe_parts")
    # a log with no readable row (every batch damaged or torn) still gets a replicas view:
    # an empty one, of rank 0
    set_replica_groups(con, default_groups(recorded_world_size(con, f"({markers}) AS msprobe_markers"),
                                           ranks or [0]))


def set_replica_groups(con: duckdb.DuckDBPyConnection, groups, *, tol: float = 0.0) -> None:
    """Redefine the ``replicas`` view of a connection from :func:`connect` for the rank
    groups ``groups`` (e.g. ``[[0, 1], [2, 3]]``) and the statistics tolerance ``tol``
    (see :func:`store.replicas.create_replicas_view`, which raises ValueError for bad
    values)."""
    create_replicas_view(con, log_source_sql(_LOG_TABLE, VIEW_CALLS), groups, tol=tol)


def _contents_tail(contents: LogContents) -> pa.Table:
    """An already read log as tail rows (``log_file``: the file's name, or its index)."""
    table = contents.table
    origin = contents.row_files
    if origin is None or len(origin) != table.num_rows:
        origin = pa.array(np.zeros(table.num_rows, dtype=np.int32))
    names = [p.name for p in contents.files] or ["0"]
    index = np.asarray(origin.to_numpy(zero_copy_only=False), dtype=np.int64)
    if len(names) <= int(index.max(initial=0)):
        names = [str(i) for i in range(int(index.max(initial=0)) + 1)]
    files = pa.DictionaryArray.from_arrays(pa.array(index, pa.int32()), pa.array(names, pa.string())).cast(pa.string())
    return table.append_column(TAIL_SCHEMA.field(LOG_FILE), files)


def _summary_parts(reader: StoreReader) -> pa.Table:
    """The compacted steps' rows of ``_summary.parquet`` for the reader's selection."""
    import pyarrow.parquet as pq

    path = reader.directory / SUMMARY_NAME
    empty = pa.table({c: pa.array([], t) for c, t in (("rank", pa.int32()), ("step", pa.int32()))})
    if not reader.manifest.parts or not path.exists():
        return empty
    filters = []
    if reader.ranks is not None:
        filters.append(("rank", "in", sorted(reader.ranks)))
    if reader.steps is not None:
        filters.append(("step", "in", sorted(reader.steps)))
    return pq.read_table(path, filters=filters or None)


def connect(
    dump_path: Union[str, os.PathLike], *, contents: LogContents | None = None,
    ranks: Optional[Iterable[int]] = None, steps: Optional[Iterable[int]] = None,
    reader: Optional[StoreReader] = None, groups: Optional[Iterable[Iterable[int]]] = None,
) -> duckdb.DuckDBPyConnection:
    """Open an in-memory DuckDB connection with the views over the store of ``dump_path``.

    Args:
        dump_path: the dump directory (log under ``.msprobe/log/``, parts under
            ``.msprobe/parquet/``).
        contents: an already read log (used instead of reading ``dump_path``; no parts).
        ranks: ranks to read (None: all); other ranks' files are not opened.
        steps: steps to read (None: all); stack and marker rows are read for every step.
        reader: an already opened :class:`store.select.StoreReader` (``ranks``/``steps``
            are then its own).
        groups: the rank groups of the ``replicas`` view (None: ranks ``0 .. world_size-1``
            of the recorded world size, which needs a scan of the markers).
    Returns:
        A connection where ``tensors``, ``calls``, ``stacks``, ``replicas`` and ``summary``
        are defined; external access is disabled and the configuration locked. The
        connection keeps the Arrow data it scans alive.
    Raises:
        LogNotFoundError: no log and no parts under ``dump_path``.
    """
    sources: dict = {}
    summary = None
    if contents is not None:
        reader = None
        sources["msprobe_tail"] = _contents_tail(contents)
        chosen_steps = None
    else:
        if reader is None:
            reader = StoreReader(dump_path, ranks=ranks, steps=steps)
        for name, meta in (("msprobe_parts", False), ("msprobe_meta", True)):
            dataset = reader.dataset(meta=meta)
            if dataset is not None:
                sources[name] = dataset
        sources["msprobe_tail"] = reader.tail
        summary = _summary_parts(reader)
        chosen_steps = reader.steps
    con = duckdb.connect(":memory:")
    try:
        for name, source in sources.items():
            con.register(name, source)
        con.register(_SUMMARY_TABLE, summary if summary is not None else pa.table(
            {"rank": pa.array([], pa.int32()), "step": pa.array([], pa.int32())}))
        _create_views(con, [n for n in _SOURCES if n in sources], chosen_steps,
                      reader.rank_values() if reader is not None else None,
                      None if groups is None else [list(g) for g in groups])
        con.execute("SET enable_progress_bar = false")   # DuckDB's own bar would print into results
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


def run_sql(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    """Run ``sql`` on a connection from :func:`connect`; returns the result (an empty
    table for statements without a result).

    Raises:
        QueryError: DuckDB rejected or failed the query; the message is DuckDB's.
    """
    try:
        relation = con.sql(sql)
        if relation is None:
            return pa.table({})
        return relation.to_arrow_table()
    except duckdb.Error as exc:
        raise QueryError(f"query failed: {exc}") from exc


def query(dump_path: Union[str, os.PathLike], sql: str, *, ranks: Optional[Iterable[int]] = None,
          steps: Optional[Iterable[int]] = None, notices: Optional[list] = None) -> pa.Table:
    """Run one SQL statement over the views of ``dump_path`` (see module docstring).

    Example: ``query(p, "SELECT name, max FROM tensors WHERE has_nan ORDER BY seq LIMIT 1")``
    gives the first tensor holding NaN. ``ranks``/``steps`` restrict every view to those
    ranks and steps, and only their files are read.

    Args:
        notices: a list that gets one line per part of the log not read as data (damaged
            batches, torn tails, unverified files: :meth:`store.log_reader.LogContents.notices`).
    Raises:
        LogNotFoundError: no log under ``dump_path``.
        QueryError: the SQL is invalid or fails; the message is DuckDB's.
    """
    reader = StoreReader(dump_path, ranks=ranks, steps=steps)
    if notices is not None:
        notices.extend(reader.notices())
    con = connect(dump_path, reader=reader)
    try:
        return run_sql(con, sql)
    finally:
        con.close()
