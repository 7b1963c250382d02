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

``seq`` orders the rows of one rank (see :class:`store.log_reader.LogContents`).
The connection is in-memory and read-only towards the file system: after setup,
``enable_external_access`` is off and the configuration is locked, so user SQL can neither
read nor write files (``COPY ... TO``, ``ATTACH``, ``read_csv`` fail).
"""
from __future__ import annotations

import os
from typing import Optional, Union

import duckdb
import numpy as np
import pyarrow as pa

from store import schema as S
from store.errors import QueryError
from store.log_reader import LogContents, read_log
from store.replicas import create_replicas_view, default_groups, log_source_sql, recorded_world_size

__all__ = ["VIEW_CALLS", "VIEW_STACKS", "VIEW_TENSORS", "connect", "query", "set_replica_groups"]

VIEW_TENSORS = "tensors"
VIEW_CALLS = "calls"
VIEW_STACKS = "stacks"
# view-only column names (the other view columns are log columns of store.schema)
DIRECTION = "direction"
DEPTH = "depth"
FRAME = "frame"
FORWARD = "forward"
BACKWARD = "backward"

_LOG_TABLE = "msprobe_log"
_FILE_COLUMN = "msprobe_file"  # index of the log file a row came from (not in any view)
_STACK_TABLE = "msprobe_stack_frames"


def _sql_list(values) -> str:
    return ", ".join("'" + value.replace("'", "''") + "'" for value in values)


def _create_views(con: duckdb.DuckDBPyConnection) -> None:
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
    # arg_min skips NULL arguments: each attribute comes from the first row where it is set
    con.execute(
        f"CREATE VIEW {VIEW_CALLS} AS SELECT {S.RANK}, {S.STEP}, min({S.SEQ}) AS {S.SEQ}, "
        f"{S.NAME}, arg_min({S.KIND}, {S.SEQ}) AS {S.KIND}, "
        f"arg_min({S.PARENT}, {S.SEQ}) AS {S.PARENT}, "
        f"arg_min({S.STACK_ID}, {S.SEQ}) AS {S.STACK_ID}, "
        f"arg_min({S.IS_RECOMPUTE}, {S.SEQ}) AS {S.IS_RECOMPUTE} "
        f"FROM {log} WHERE {S.ROW} = '{S.ROW_CALL}' "
        f"GROUP BY {S.RANK}, {S.STEP}, {S.NAME}, {_FILE_COLUMN}"
    )
    con.execute(
        f"CREATE VIEW {VIEW_STACKS} AS SELECT {S.STACK_ID}, {DEPTH}, {FRAME} FROM {_STACK_TABLE}"
    )
    ranks = [r for (r,) in con.execute(f"SELECT DISTINCT {S.RANK} FROM {log}").fetchall()]
    # a log with no readable row (every batch damaged or torn) still gets a replicas view:
    # an empty one, of rank 0
    set_replica_groups(con, default_groups(recorded_world_size(con, log), ranks or [0]))


def set_replica_groups(con: duckdb.DuckDBPyConnection, groups, *, tol: float = 0.0) -> None:
    """Redefine the ``replicas`` view of a connection from :func:`connect` for the rank
    groups ``groups`` (e.g. ``[[0, 1], [2, 3]]``) and the statistics tolerance ``tol``
    (see :func:`store.replicas.create_replicas_view`, which raises ValueError for bad
    values)."""
    create_replicas_view(con, log_source_sql(_LOG_TABLE, VIEW_CALLS), groups, tol=tol)


def _stack_table(contents: LogContents) -> pa.Table:
    ids, depths, frames = [], [], []
    for stack_id, stack_frames in contents.stacks.items():
        for depth, frame in enumerate(stack_frames):
            ids.append(stack_id)
            depths.append(depth)
            frames.append(frame)
    return pa.table(
        {
            S.STACK_ID: pa.array(ids, pa.int64()),
            DEPTH: pa.array(depths, pa.int32()),
            FRAME: pa.array(frames, pa.string()),
        }
    )


def connect(
    dump_path: Union[str, os.PathLike], *, contents: LogContents | None = None
) -> duckdb.DuckDBPyConnection:
    """Open an in-memory DuckDB connection with the views over the log of ``dump_path``.

    Args:
        dump_path: the dump directory (log under ``.msprobe/log/``).
        contents: an already read log (skips reading ``dump_path`` again).
    Returns:
        A connection where ``tensors``, ``calls`` and ``stacks`` are defined; external
        access is disabled and the configuration locked.
    Raises:
        LogNotFoundError: no log under ``dump_path``.
    """
    if contents is None:
        contents = read_log(dump_path)
    con = duckdb.connect(":memory:")
    try:
        log = contents.table
        files = contents.row_files
        if files is None or len(files) != log.num_rows:
            files = pa.array(np.zeros(log.num_rows, dtype=np.int32))
        log = log.append_column(_FILE_COLUMN, files)
        for table_name, table in ((_LOG_TABLE, log), (_STACK_TABLE, _stack_table(contents))):
            con.register("msprobe_source", table)
            con.execute(f"CREATE TABLE {table_name} AS SELECT * FROM msprobe_source")
            con.unregister("msprobe_source")
        _create_views(con)
        con.execute("SET enable_progress_bar = false")   # DuckDB's own bar would print into results
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


def _to_arrow(relation) -> pa.Table:
    if hasattr(relation, "to_arrow_table"):
        return relation.to_arrow_table()
    return relation.arrow()  # duckdb < 1.4


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
        return _to_arrow(relation)
    except duckdb.Error as exc:
        raise QueryError(f"query failed: {exc}") from exc


def query(dump_path: Union[str, os.PathLike], sql: str, *, notices: Optional[list] = None) -> pa.Table:
    """Run one SQL statement over the views of ``dump_path`` (see module docstring).

    Example: ``query(p, "SELECT name, max FROM tensors WHERE has_nan ORDER BY seq LIMIT 1")``
    gives the first tensor holding NaN.

    Args:
        notices: a list that gets one line per part of the log not read as data (damaged
            batches, torn tails, unverified files: :meth:`store.log_reader.LogContents.notices`).
    Raises:
        LogNotFoundError: no log under ``dump_path``.
        QueryError: the SQL is invalid or fails; the message is DuckDB's.
    """
    contents = read_log(dump_path)
    if notices is not None:
        notices.extend(contents.notices())
    con = connect(dump_path, contents=contents)
    try:
        return run_sql(con, sql)
    finally:
        con.close()
