"""Incremental compaction: finished steps of the log become Hive-partitioned Parquet parts.

:class:`Compactor` keeps, per log file, how many of its rows are already in parts (the
manifest, :mod:`store.manifest`) and on each :meth:`Compactor.run_once` writes the rows of
steps that finished since: a step is finished when the file holds rows of a later step,
its ``step_end`` marker, or the end-of-stream marker (the writer closed). Rows are cut at
the first row of an unfinished step, so parts always hold a prefix ``[0, rows)`` of each
log file and the rest stays in the log (the tail the readers read).

Each pass writes, per log file and rank, one part per step bucket
(``step_bucket={B}/rank={R}/part-{log}-{first}.parquet``, one row group per step, rows
sorted by step and seq, zstd) and one ``_meta/rank={R}/…`` part with the stack and marker
rows; then the per-(rank, step) summary (``_summary.parquet``) and last the manifest,
each written under a temporary name and renamed. A part file not in the manifest (a pass
that died before writing the manifest) is removed by the next pass, which writes it again.
Passes over one Parquet directory take turns (``flock`` on ``_lock``).

Within one :class:`Compactor` the log files stay open as incremental readers
(:meth:`store.log_reader.LogReader.read_new`), so ``msprobe compact --follow`` reads each
byte of the log once; a fresh :class:`Compactor` reads each file not yet wholly compacted
from its start once.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union

import numpy as np
import pyarrow as pa

from store import schema as S
from store.errors import LogNotFoundError
from store.fileutil import FILE_MODE, make_dirs
from store.log_reader import Skipped, find_log_files, shift_seq
from store.manifest import (LOCK_NAME, LOG_FILE, META_DIR, SUMMARY_NAME, LogCoverage, Manifest, Part, load_manifest,
                            parquet_dir, save_manifest)
from store.select import PART_SCHEMA, TAIL_SCHEMA, FileRows, read_log_file, with_gone_logs

__all__ = ["CompactReport", "Compactor", "SUMMARY_COLUMNS", "follow", "summary_sql"]

#: columns of ``_summary.parquet`` and of the ``summary`` view
SUMMARY_COLUMNS = ("rank", "step", "call_rows", "tensors", "nan_tensors", "inf_tensors", "first_nan_seq",
                   "first_nan_name", "max_norm", "max_norm_name")


def summary_sql(source: str) -> str:
    """SQL of the per-(rank, step) summary of the log rows in relation ``source``:
    ``call_rows`` (call rows), ``tensors`` (tensor leaves), ``nan_tensors``/``inf_tensors``
    (tensor leaves holding NaN / ±Inf), ``first_nan_seq``/``first_nan_name`` (the first
    tensor leaf holding NaN, by seq), ``max_norm``/``max_norm_name`` (the largest finite
    Norm and its entry)."""
    tensor = f"{S.ROW} = '{S.ROW_LEAF}' AND {S.LEAF_KIND} = '{S.LEAF_TENSOR}'"
    return (
        f"SELECT {S.RANK}, {S.STEP}, count(*) FILTER (WHERE {S.ROW} = '{S.ROW_CALL}') AS call_rows, "
        f"count(*) FILTER (WHERE {tensor}) AS tensors, "
        f"count(*) FILTER (WHERE {tensor} AND {S.HAS_NAN}) AS nan_tensors, "
        f"count(*) FILTER (WHERE {tensor} AND {S.HAS_INF}) AS inf_tensors, "
        f"min({S.SEQ}) FILTER (WHERE {tensor} AND {S.HAS_NAN}) AS first_nan_seq, "
        f"arg_min({S.NAME}, {S.SEQ}) FILTER (WHERE {tensor} AND {S.HAS_NAN}) AS first_nan_name, "
        f"max({S.NORM}) FILTER (WHERE {tensor} AND isfinite({S.NORM})) AS max_norm, "
        f"arg_max({S.NAME}, {S.NORM}) FILTER (WHERE {tensor} AND isfinite({S.NORM})) AS max_norm_name "
        f"FROM {source} WHERE {S.ROW} IN ('{S.ROW_CALL}', '{S.ROW_LEAF}') GROUP BY {S.RANK}, {S.STEP}"
    )


def merge_summary_sql(source: str) -> str:
    """SQL merging summary rows of ``source`` that share (rank, step) (rows of one step
    compacted in two passes or from two log files)."""
    return (
        "SELECT rank, step, sum(call_rows)::BIGINT AS call_rows, sum(tensors)::BIGINT AS tensors, "
        "sum(nan_tensors)::BIGINT AS nan_tensors, sum(inf_tensors)::BIGINT AS inf_tensors, "
        "min(first_nan_seq) AS first_nan_seq, arg_min(first_nan_name, first_nan_seq) AS first_nan_name, "
        "max(max_norm) AS max_norm, arg_max(max_norm_name, max_norm) AS max_norm_name "
        f"FROM {source} GROUP BY rank, step"
    )


@dataclass(frozen=True)
class CompactReport:
    """What one compaction pass did.

    Attributes:
        written: the part files written (absolute paths), in writing order.
        rows: row count of each written part.
        skipped: unreadable parts of log files.
        pending: rows left in the log (steps not finished yet), over all files.
        archivable: names of the log files (closed segments and logs of ended processes)
            whose every row is in parts: readers no longer open them, so they may be
            moved away or deleted (docs/query.md, "Log segments"). Empty when the parts
            were written elsewhere than ``{dump_path}/.msprobe/parquet`` (readers do not
            look there).
    """

    written: tuple[Path, ...]
    rows: tuple[int, ...]
    skipped: tuple[Skipped, ...]
    pending: int = 0
    archivable: tuple[str, ...] = ()


class Compactor:
    """Writes the finished steps of the log under ``dump_path`` as Parquet parts.

    Args:
        dump_path: the dump directory (log under ``.msprobe/log/``).
        out: the Parquet directory; default ``{dump_path}/.msprobe/parquet`` (where the
            readers look). Created (mode 0o750) if missing.
    Raises:
        store.manifest.ManifestError: an existing manifest cannot be read.
    """

    def __init__(self, dump_path: Union[str, os.PathLike], out: Optional[Union[str, os.PathLike]] = None) -> None:
        self.dump_path = Path(dump_path)
        self.directory = parquet_dir(dump_path, out)
        self.manifest: Manifest = load_manifest(self.directory)
        self._open: dict[str, FileRows] = {}     # log file name -> rows read, from coverage.rows on

    def run_once(self) -> CompactReport:
        """Compact every step finished since the previous pass.

        Raises:
            LogNotFoundError: no log under ``dump_path``.
            OSError: a part, the summary or the manifest cannot be written.
        """
        files = find_log_files(self.dump_path)
        make_dirs(self.directory)
        with _exclusive(self.directory / LOCK_NAME):
            # another compactor may have written since this one last looked
            latest = load_manifest(self.directory)
            if latest != self.manifest:
                self.manifest = latest
                self._open.clear()
            return self._run_locked(files)

    def _run_locked(self, files: list) -> CompactReport:
        self._remove_orphans()
        written: list[Path] = []
        rows: list[int] = []
        skipped: list[Skipped] = []
        summaries: list[pa.Table] = []
        next_seq: dict = {}
        pending = 0
        for name, path in with_gone_logs(files, self.manifest):
            coverage = self.manifest.logs.get(name)
            if path is None:            # archived once wholly in parts: its seq still counts
                next_seq.update(coverage.next_seq)
                continue
            if coverage is not None and coverage.unchanged_in_parts(path):
                next_seq.update(coverage.next_seq)
                continue
            state = self._read(path, coverage, next_seq)
            skipped.extend(state.reader.skipped)
            start = coverage.rows if coverage is not None else 0
            table = state.table
            cut = start + _finished_prefix(table, state.reader.finished, self._finished_steps(state))
            new = table.slice(0, cut - start)
            # the rows left keep no reference to the (possibly memory-mapped) batches read
            rest = table.slice(cut - start)
            state.table = rest.take(pa.array(np.arange(rest.num_rows))) if rest.num_rows else TAIL_SCHEMA.empty_table()
            pending += state.table.num_rows
            if new.num_rows:
                for part, file in self._write_parts(new, name, start):
                    self.manifest.parts.append(part)
                    written.append(file)
                    rows.append(part.rows)
                summaries.append(_summary(new))
            seq_next = dict(coverage.next_seq) if coverage is not None else {}
            seq_next.update(state.next_seq)
            self.manifest.logs[name] = LogCoverage(
                rows=cut, read_rows=cut + state.table.num_rows, bytes=state.reader.offset,
                finished=state.reader.finished, seq_offsets=dict(state.seq_offsets), next_seq=seq_next,
                skipped=_kept_skips(coverage, state.reader.skipped))
            next_seq.update(seq_next)
            del new, table
            if self.manifest.logs[name].complete:
                del self._open[name]           # nothing more to read from this file
        if summaries:
            self._write_summary(summaries)
        save_manifest(self.directory, self.manifest)
        log_dir = self.dump_path / S.STORE_DIR / S.LOG_DIR
        # readers look for parts in the default directory only: with parts elsewhere (-o),
        # every log file stays needed
        default = self.directory.resolve() == parquet_dir(self.dump_path).resolve()
        archivable = tuple(sorted(name for name, coverage in self.manifest.logs.items()
                                  if default and coverage.complete and (log_dir / name).is_file()))
        return CompactReport(written=tuple(written), rows=tuple(rows), skipped=tuple(skipped), pending=pending,
                             archivable=archivable)

    # --- internals ---------------------------------------------------------------------
    def _read(self, path: Path, coverage: Optional[LogCoverage], next_seq: dict) -> FileRows:
        """The rows of ``path`` not yet in parts, reading only what was appended since the
        previous pass where the file is already open."""
        state = self._open.get(path.name)
        if state is None:
            state = read_log_file(path, dict(next_seq), coverage)
            state.table = state.table.slice(coverage.rows if coverage is not None else 0)
            self._open[path.name] = state
            return state
        batches = state.reader.read_new()
        if batches:
            more = pa.Table.from_batches(batches, schema=S.LOG_SCHEMA)
            file_next = dict(next_seq)
            file_next.update(state.next_seq)
            more = shift_seq(more, state.seq_offsets, file_next)
            for r in state.seq_offsets:
                if r in file_next:
                    state.next_seq[r] = max(state.next_seq.get(r, 0), file_next[r])
            more = more.append_column(TAIL_SCHEMA.field(LOG_FILE),
                                      pa.repeat(pa.scalar(path.name, pa.string()), more.num_rows))
            state.table = pa.concat_tables([state.table, more])
        return state

    @staticmethod
    def _finished_steps(state: FileRows) -> set:
        """Steps whose ``step_end`` marker was read (kept across passes)."""
        table = state.table
        if table.num_rows:
            row = table[S.ROW].to_numpy(zero_copy_only=False)
            kind = table[S.KIND].to_numpy(zero_copy_only=False)
            ends = (row == S.ROW_MARKER) & (kind == S.MARKER_STEP_END)
            state.step_ends |= set(table[S.STEP].to_numpy()[ends].tolist())
        return state.step_ends

    def _write_parts(self, rows: pa.Table, log_name: str, first_row: int):
        """Write ``rows`` (rows ``first_row ..`` of log file ``log_name``) as parts; yields
        (Part, absolute path) once each file is in place."""
        import pyarrow.compute as pc

        stem = log_name[: -len(S.LOG_SUFFIX)] if log_name.endswith(S.LOG_SUFFIX) else log_name
        bucket_size = self.manifest.step_bucket
        row_kind = rows[S.ROW].to_numpy(zero_copy_only=False)
        side = np.isin(row_kind, (S.ROW_STACK, S.ROW_MARKER))
        rank_col = rows[S.RANK].to_numpy()
        end_row = first_row + rows.num_rows
        for rank in np.unique(rank_col).tolist():
            in_rank = rank_col == rank
            meta_rows = rows.filter(pa.array(in_rank & side))
            if meta_rows.num_rows:
                rel = f"{META_DIR}/rank={rank}/part-{stem}-{first_row}.parquet"
                self._write_file(rel, [meta_rows])
                yield (Part(path=rel, rank=rank, steps=[-1, -1], rows=meta_rows.num_rows, tensors=0, nan=0, inf=0,
                            log_file=log_name, log_rows=[first_row, end_row]),
                       self.directory / rel)
            data = rows.filter(pa.array(in_rank & ~side))
            if not data.num_rows:
                continue
            data = data.take(pc.sort_indices(data, [(S.STEP, "ascending"), (S.SEQ, "ascending")]))
            steps = data[S.STEP].to_numpy()
            buckets = steps // bucket_size
            for b in np.unique(buckets).tolist():
                lo, hi = np.searchsorted(buckets, [b, b + 1])
                chunk = data.slice(lo, hi - lo)
                chunk_steps = steps[lo:hi]
                cuts = np.flatnonzero(chunk_steps[1:] != chunk_steps[:-1]) + 1
                bounds = [0, *cuts.tolist(), len(chunk_steps)]
                groups = [chunk.slice(a, z - a) for a, z in zip(bounds[:-1], bounds[1:])]
                rel = f"step_bucket={b}/rank={rank}/part-{stem}-{first_row}.parquet"
                self._write_file(rel, groups)
                tensor = (chunk[S.ROW].to_numpy(zero_copy_only=False) == S.ROW_LEAF) & (
                    chunk[S.LEAF_KIND].to_numpy(zero_copy_only=False) == S.LEAF_TENSOR)
                nan = tensor & chunk[S.HAS_NAN].fill_null(False).to_numpy(zero_copy_only=False)
                inf = tensor & chunk[S.HAS_INF].fill_null(False).to_numpy(zero_copy_only=False)
                yield (Part(path=rel, rank=rank, steps=[int(chunk_steps[0]), int(chunk_steps[-1])],
                            rows=chunk.num_rows, tensors=int(tensor.sum()), nan=int(nan.sum()), inf=int(inf.sum()),
                            log_file=log_name, log_rows=[first_row, end_row]),
                       self.directory / rel)

    def _write_file(self, rel: str, groups: list) -> None:
        """One Parquet file, one row group per table of ``groups`` (PART_SCHEMA, zstd)."""
        import pyarrow.parquet as pq

        target = self.directory / rel
        make_dirs(target.parent)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            with pq.ParquetWriter(tmp, PART_SCHEMA, compression="zstd") as writer:
                for group in groups:
                    table = group.select(PART_SCHEMA.names).cast(PART_SCHEMA)
                    writer.write_table(table, row_group_size=max(1, table.num_rows))
            os.chmod(tmp, FILE_MODE)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                tmp.unlink()

    def _write_summary(self, new: list) -> None:
        import duckdb
        import pyarrow.parquet as pq

        path = self.directory / SUMMARY_NAME
        tables = list(new)
        if path.exists():
            tables.insert(0, pq.read_table(path))
        con = duckdb.connect(":memory:")
        try:
            con.register("s", pa.concat_tables(tables, promote_options="permissive"))
            merged = con.sql(merge_summary_sql("s") + " ORDER BY rank, step").to_arrow_table()
        finally:
            con.close()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            pq.write_table(merged, tmp, compression="zstd")
            os.chmod(tmp, FILE_MODE)
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()

    def _remove_orphans(self) -> None:
        listed = {p.path for p in self.manifest.parts}
        for pattern in ("step_bucket=*/rank=*/*.parquet", f"{META_DIR}/rank=*/*.parquet",
                        "step_bucket=*/rank=*/.*.tmp", f"{META_DIR}/rank=*/.*.tmp"):
            for file in self.directory.glob(pattern):
                if file.relative_to(self.directory).as_posix() not in listed:
                    file.unlink()


@contextlib.contextmanager
def _exclusive(path: Path):
    """Hold an exclusive ``flock`` on ``path`` (created if missing): one compaction pass
    at a time per Parquet directory (``--follow`` beside a one-off ``msprobe compact``)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _summary(rows: pa.Table) -> pa.Table:
    import duckdb

    con = duckdb.connect(":memory:")
    try:
        con.register("rows_", rows)
        return con.sql(summary_sql("rows_")).to_arrow_table()
    finally:
        con.close()


def _finished_prefix(table: pa.Table, closed: bool, step_ends: set) -> int:
    """How many leading rows of ``table`` belong to finished steps (module docstring)."""
    if closed or table.num_rows == 0:
        return table.num_rows
    steps = table[S.STEP].to_numpy()
    last = int(steps.max())
    open_steps = [last] if last not in step_ends else []
    unfinished = np.isin(steps, open_steps)
    first = np.flatnonzero(unfinished)
    cut = int(first[0]) if len(first) else table.num_rows
    # stack and marker rows alone (step -1 stacks before the open step) wait for data rows
    row = table[S.ROW].slice(0, cut).to_numpy(zero_copy_only=False)
    return cut if np.isin(row, (S.ROW_CALL, S.ROW_LEAF)).any() else 0


def follow(dump_path: Union[str, os.PathLike], out: Optional[Union[str, os.PathLike]] = None, *,
           interval: float = 2.0, report: Optional[Callable[[CompactReport], None]] = None,
           should_stop: Callable[[], bool] = lambda: False) -> None:
    """Compact every ``interval`` seconds until every log file is closed and wholly in
    parts (the run ended), or ``should_stop()`` is true. Waits for the first log file.

    Raises:
        OSError: a part, the summary or the manifest cannot be written.
    """
    compactor = Compactor(dump_path, out)
    while not should_stop():
        try:
            result = compactor.run_once()
        except LogNotFoundError:
            time.sleep(interval)
            continue
        if report is not None:
            report(result)
        logs = compactor.manifest.logs
        if logs and all(c.complete for c in logs.values()) and result.pending == 0 and not result.skipped:
            return
        time.sleep(interval)


def _kept_skips(coverage: Optional[LogCoverage], skipped) -> list:
    """The damaged parts of a log file known so far (:attr:`LogCoverage.skipped`): those of
    earlier passes and of this one, by offset (this pass's wins). A torn tail (no end) is
    left out: the writer may still complete it, and a reader that reads the file sees it."""
    kept = {entry["offset"]: entry for entry in (coverage.skipped if coverage is not None else ())}
    for skip in skipped:
        if skip.end is not None:
            kept[skip.offset] = {"offset": skip.offset, "end": skip.end, "reason": skip.reason, "rows": skip.rows,
                                 "steps": list(skip.steps) if skip.steps is not None else None}
    return [kept[offset] for offset in sorted(kept)]
