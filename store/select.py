"""What a reader loads: the Parquet parts of the selected ranks and steps, plus the log tail.

:class:`StoreReader` is the one entry point of every offline reader (query, export,
report, check-ranks, compare). Given ``ranks`` and ``steps`` it

- takes from the manifest (:mod:`store.manifest`) only the part files whose rank and step
  range match, as a lazy :class:`pyarrow.dataset.Dataset` (nothing is read until a scan
  asks for it; filters and column selections are pushed into the scan);
- reads from the log only the files of the selected ranks (the rank is in the log file's
  name) that are not wholly in parts, and of those only the rows past what the parts hold
  (the *tail*), keeping the rows of the selected steps plus every stack and marker row.

So memory depends on what is selected and on the uncompacted tail, not on the size of the
run. Without a manifest (``msprobe compact`` never ran) the tail is the whole log of the
selected ranks.

The parts are a copy of the log: where the manifest is unreadable, the log is read instead;
where a selected part file is missing (deleted by hand), its log file is read whole
instead of that file's parts. Each such fallback is one line of :meth:`StoreReader.notices`
(``read from the log: ...``); a missing part whose log file is gone too is a
:class:`store.log_reader.Skipped` (the rows are lost).

``seq`` is shifted per rank across files exactly as :func:`store.log_reader.read_log`
does (the offsets of compacted files come from the manifest), so rows from parts and from
the tail order alike. Every row carries :data:`store.manifest.LOG_FILE`, the name of its log
file (the ``calls`` view keeps two runs written into one dump path apart by it).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Union

import numpy as np
import pyarrow as pa

from store import schema as S
from store.errors import LogNotFoundError
from store.log_reader import LogReader, Skipped, find_log_files, log_file_order, shift_seq
from store.log_reader import notices as notice_lines
from store.log_writer import parse_log_file_name
from store.manifest import LOG_FILE, LogCoverage, Manifest, ManifestError, load_manifest, parquet_dir

__all__ = ["PART_SCHEMA", "TAIL_SCHEMA", "FileRows", "StoreReader", "read_log_file", "with_gone_logs"]

#: columns of a Parquet part (``rank`` lives in the Hive path)
PART_SCHEMA = pa.schema([f for f in S.LOG_SCHEMA if f.name != S.RANK] + [pa.field(LOG_FILE, pa.string())],
                        metadata=S.LOG_SCHEMA.metadata)
#: columns of the tail and of every row a reader returns: the log's plus ``log_file``
TAIL_SCHEMA = pa.schema(list(S.LOG_SCHEMA) + [pa.field(LOG_FILE, pa.string())], metadata=S.LOG_SCHEMA.metadata)
#: Hive partition columns of the step parts and of the ``meta/`` parts
STEP_PARTITIONS = pa.schema([pa.field("step_bucket", pa.int32()), pa.field(S.RANK, pa.int32())])
META_PARTITIONS = pa.schema([pa.field(S.RANK, pa.int32())])
_SIDE_ROWS = (S.ROW_STACK, S.ROW_MARKER)


@dataclass
class FileRows:
    """Every readable row of one log file, ``seq`` shifted (see module docstring).

    Attributes:
        path: the log file.
        table: :data:`TAIL_SCHEMA` rows in file order.
        reader: the :class:`store.log_reader.LogReader` that read them (``offset``,
            ``finished``, ``skipped``); reading on with ``read_new`` gives later rows.
        seq_offsets: ``{rank: offset}`` added to ``seq`` >= 0.
        next_seq: ``{rank: largest shifted seq + 1}`` over the file's rows.
        step_ends: steps whose ``step_end`` marker was read (kept by the compactor).
    """

    path: Path
    table: pa.Table
    reader: LogReader
    seq_offsets: dict = field(default_factory=dict)
    next_seq: dict = field(default_factory=dict)
    step_ends: set = field(default_factory=set)


def _with_log_file(table: pa.Table, name: str) -> pa.Table:
    return table.append_column(TAIL_SCHEMA.field(LOG_FILE), pa.repeat(pa.scalar(name, pa.string()), table.num_rows))


def read_log_file(path: Path, next_seq: dict, coverage: Optional[LogCoverage] = None) -> FileRows:
    """Read one log file with :class:`store.log_reader.LogReader` (damaged tails skipped, see
    ``reader.skipped``) and shift its ``seq`` (the manifest's offsets where the file is in
    it, else past ``next_seq``, which is updated)."""
    reader = LogReader(path)
    batches = reader.read_new()
    table = pa.Table.from_batches(batches, schema=S.LOG_SCHEMA) if batches else S.LOG_SCHEMA.empty_table()
    offsets = dict(coverage.seq_offsets) if coverage is not None else {}
    file_next = dict(next_seq)
    table = _with_log_file(shift_seq(table, offsets, file_next), path.name)
    own = {r: file_next[r] for r in offsets if r in file_next}
    next_seq.update(own)
    return FileRows(path=path, table=table, reader=reader, seq_offsets=offsets, next_seq=own)


def _mask(table: pa.Table, ranks: Optional[frozenset], steps: Optional[frozenset]) -> Optional[np.ndarray]:
    """Rows of the selected ranks and steps (stack and marker rows: any step); None: all."""
    if ranks is None and steps is None:
        return None
    keep = np.ones(table.num_rows, bool)
    if ranks is not None:
        keep &= np.isin(table[S.RANK].to_numpy(), list(ranks))
    if steps is not None:
        row = table[S.ROW].to_numpy(zero_copy_only=False)
        keep &= np.isin(table[S.STEP].to_numpy(), list(steps)) | np.isin(row, _SIDE_ROWS)
    return keep


def with_gone_logs(files: Iterable[Path], manifest: Manifest,
                   ranks: Optional[frozenset] = None) -> list[tuple[str, Optional[Path]]]:
    """``(name, path)`` of the log files ``files`` and, with ``path`` None, of the log files
    the manifest covers that are no longer there (segments archived after compaction) of
    ``ranks`` (None: all), in log file order (:func:`store.log_reader.log_file_order`). A
    reader shifts ``seq`` across a rank's files in this order: a file that is gone still
    shifts the files after it by its ``next_seq``."""
    here = {path.name: path for path in files}
    names = set(here) | {name for name in manifest.logs
                         if name not in here and (ranks is None or _file_rank(Path(name)) in ranks)}
    return [(name, here.get(name)) for name in sorted(names, key=lambda name: log_file_order(Path(name)))]


def _file_rank(path: Path) -> Optional[int]:
    parsed = parse_log_file_name(path.name)
    return None if parsed is None else parsed[0]


class StoreReader:
    """The selected rows of one dump path: Parquet parts (lazy) plus the log tail (in memory).

    Args:
        dump_path: the dump directory (log under ``.msprobe/log/``, parts under
            ``.msprobe/parquet/``).
        ranks: ranks to read (None: all).
        steps: steps to read (None: all); stack and marker rows are read for every step.
        parquet: the Parquet directory when not the default.
    Attributes:
        manifest: the :class:`store.manifest.Manifest` (empty when never compacted).
        tail: :data:`TAIL_SCHEMA` rows of the selection not in parts (chunked, file order).
        skipped: unreadable parts of the log files read.
        unverified: paths of the log files read that are format 1 (no checksums).
        unfinished: paths of the log files read that have no end-of-stream marker.
        recovered: one line per fallback to the log (unreadable manifest, missing part)
            and one naming selected ranks with neither a log file nor a part.
        files: the log files of the selected ranks.
    Raises:
        LogNotFoundError: ``dump_path`` holds neither a log nor compacted parts.
        store.manifest.ManifestError: the manifest is unreadable and there is no log.
    """

    def __init__(self, dump_path: Union[str, os.PathLike], *, ranks: Optional[Iterable[int]] = None,
                 steps: Optional[Iterable[int]] = None,
                 parquet: Optional[Union[str, os.PathLike]] = None) -> None:
        self.dump_path = Path(dump_path)
        self.ranks = None if ranks is None else frozenset(int(r) for r in ranks)
        self.steps = None if steps is None else frozenset(int(s) for s in steps)
        self.directory = parquet_dir(dump_path, parquet)
        self.skipped: list[Skipped] = []
        self.unverified: list[str] = []
        self.unfinished: list[str] = []
        self.recovered: list[str] = []
        self._absent: frozenset = frozenset()  # selected ranks with no file at all (named in recovered)
        self._markers: Optional[pa.Table] = None   # markers(), read once
        no_log = None
        try:
            files = find_log_files(dump_path)
        except LogNotFoundError as exc:
            files, no_log = None, exc
        try:
            self.manifest: Manifest = load_manifest(self.directory)
        except ManifestError as exc:
            if files is None:
                raise
            self.manifest = Manifest()
            self.recovered.append(f"read from the log: {exc}")
        if files is None:
            if not self.manifest.parts:
                raise no_log
            files = []
        self.files = tuple(f for f in files if self.ranks is None or _file_rank(f) is None
                           or _file_rank(f) in self.ranks)
        if self.ranks is not None:
            present = {_file_rank(f) for f in files} | {p.rank for p in self.manifest.parts}
            absent = sorted(self.ranks - present)
            if absent and None not in present:
                self._absent = frozenset(absent)
                shown = ", ".join(map(str, sorted(present))) or "none"
                self.recovered.append(f"selected rank{'s' if len(absent) > 1 else ''} "
                                      f"{', '.join(map(str, absent))}: not in {str(self.dump_path)!r} "
                                      f"(ranks there: {shown})")
        self._drop_missing_parts()
        self.tail = self._read_tail()

    def notices(self) -> list[str]:
        """One line for people per part of the selected log files not read as data, per
        unverified (format 1) file, per unfinished file, per recorded rank without a
        readable row (:meth:`missing_ranks`; the wording of :func:`store.log_reader.notices`),
        per fallback from the parts to the log or selected rank not in the dump
        (:attr:`recovered`), then one for selected steps that match nothing (:meth:`unmatched`)."""
        return (self.recovered + notice_lines(self.skipped, self.unverified, self.missing_ranks(), self.unfinished)
                + self.unmatched())

    def markers(self) -> pa.Table:
        """The marker rows of the selection (columns ``row`` and ``meta``): those of the
        ``_meta`` parts and of the tail; the step parts are not read."""
        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        if self._markers is not None:
            return self._markers
        tables = []
        meta = self.dataset(meta=True)
        if meta is not None:
            tables.append(meta.to_table(columns=[S.ROW, S.META], filter=ds.field(S.ROW) == S.ROW_MARKER))
        tail = self.tail.select([S.ROW, S.META])
        tables.append(tail.filter(pc.equal(tail[S.ROW], S.scalar(S.ROW_MARKER, S.ROW))))
        self._markers = pa.concat_tables([t.cast(tables[-1].schema) for t in tables])
        return self._markers

    def missing_ranks(self) -> tuple[int, ...]:
        """The selected ranks the run recorded (:func:`store.log_reader.expected_ranks` of
        the marker rows in the ``_meta`` parts and the tail) that have no readable row: their
        log file is gone, empty or wholly damaged. A selected rank with no file at all is
        left out (:attr:`recovered` names it)."""
        from store.log_reader import expected_ranks

        expected = expected_ranks(self.markers())
        if self.ranks is not None:
            expected &= self.ranks
        return tuple(sorted(expected - set(self.rank_values()) - self._absent))

    def unmatched(self) -> list[str]:
        """A line for the selected steps with no call rows in the selected ranks (a typo in
        ``--step``; what it selects reads as empty); [] where every selected step is there.
        Selected ranks without any file are named in :attr:`recovered`."""
        if self.steps is None:
            return []
        absent = sorted(self.steps - set(self.step_values()))
        if not absent:
            return []
        return [f"selected step(s) {_listed(absent)} not in the recording under {self.dump_path}"
                + (" (of the selected ranks)" if self.ranks is not None else "")]

    def _drop_missing_parts(self) -> None:
        """Take out of :attr:`manifest` the selected parts whose file is missing: the log
        file they came from is then read whole (all its parts dropped); where that log file
        is gone too, the part's rows are lost (a :class:`Skipped` with offset -1)."""
        chosen = self.manifest.select(self.ranks, self.steps) + self.manifest.select(self.ranks, None, meta=True)
        missing = [p for p in chosen if not (self.directory / p.path).is_file()]
        if not missing:
            return
        logs_here = {f.name for f in self.files}
        reread = {p.log_file for p in missing if p.log_file in logs_here}
        lost = set()
        for part in missing:
            where = "stack and marker rows" if part.steps[0] < 0 else f"steps {part.steps[0]} to {part.steps[1]}"
            what = f"Parquet part {str(self.directory / part.path)!r} (rank {part.rank}, {where}, {part.rows} rows)"
            if part.log_file in reread:
                self.recovered.append(f"read from the log: {what} is missing; its log file {part.log_file} "
                                      f"is read whole instead (msprobe compact does not rewrite it)")
            else:
                lost.add(part.path)
                self.skipped.append(Skipped(
                    str(self.directory / part.path), -1,
                    f"missing: {what}, and its log file {part.log_file} is gone too",
                    rows=part.rows, steps=None if part.steps[0] < 0 else tuple(part.steps)))
        logs = dict(self.manifest.logs)
        for name in reread:
            old = logs.get(name) or LogCoverage()
            logs[name] = LogCoverage(seq_offsets=dict(old.seq_offsets), next_seq=dict(old.next_seq))
        parts = [p for p in self.manifest.parts if p.log_file not in reread and p.path not in lost]
        self.manifest = Manifest(parts=parts, logs=logs, step_bucket=self.manifest.step_bucket,
                                 format=self.manifest.format, version=self.manifest.version)

    def _read_tail(self) -> pa.Table:
        tables, next_seq = [], {}
        for name, path in with_gone_logs(self.files, self.manifest, self.ranks):
            coverage = self.manifest.logs.get(name)
            if path is None:            # moved away once wholly in parts: its seq still counts
                next_seq.update(coverage.next_seq)
                continue
            if coverage is not None and coverage.unchanged_in_parts(path):
                next_seq.update(coverage.next_seq)
                self.skipped += _stored_skips(path, coverage)
                continue
            rows = read_log_file(path, next_seq, coverage)
            self.skipped.extend(rows.reader.skipped)
            if rows.reader.verified is False:
                self.unverified.append(str(path))
            if rows.reader.unfinished:
                self.unfinished.append(str(path))
            table = rows.table.slice(coverage.rows if coverage is not None else 0)
            keep = _mask(table, self.ranks, self.steps)
            if keep is not None:
                table = table.filter(pa.array(keep))
            elif coverage is not None and coverage.rows:
                # a copy of the uncompacted rows: the file's other (memory-mapped) batches go
                table = table.take(pa.array(np.arange(table.num_rows)))
            if table.num_rows:
                tables.append(table)
        here = {path.name for path in self.files}
        log_dir = self.dump_path / S.STORE_DIR / S.LOG_DIR
        for name, coverage in sorted(self.manifest.logs.items()):
            rank = _file_rank(Path(name))
            if name not in here and (self.ranks is None or rank in self.ranks) and not (log_dir / name).exists():
                self.skipped += _stored_skips(log_dir / name, coverage)   # the log file is gone: its parts stay
        return pa.concat_tables(tables) if tables else TAIL_SCHEMA.empty_table()

    def narrowed(self, *, ranks: Optional[Iterable[int]] = None,
                 steps: Optional[Iterable[int]] = None, tail: bool = True) -> "StoreReader":
        """This selection narrowed to ``ranks`` and ``steps`` (each intersected with this
        reader's own; None: unchanged), without reading anything again.

        The result shares the manifest and the lists of notices; its :attr:`tail` holds the
        rows of this tail that match (stack and marker rows of every step, as always), its
        :meth:`dataset` the parts of the narrower selection. A reader that steps through a
        run one step (or rank group) at a time narrows one reader per step: memory is one
        step's rows plus this reader's tail (empty once the run is compacted).
        ``tail=False``: the result's tail is empty (not filtered: for a caller that takes
        the tail's rows of each step itself, from an index built once).
        """
        import copy

        sub = copy.copy(self)
        sub._markers = None
        if ranks is not None:
            chosen = frozenset(int(r) for r in ranks)
            sub.ranks = chosen if self.ranks is None else self.ranks & chosen
        if steps is not None:
            chosen = frozenset(int(s) for s in steps)
            sub.steps = chosen if self.steps is None else self.steps & chosen
        sub.files = tuple(f for f in self.files if sub.ranks is None or _file_rank(f) is None
                          or _file_rank(f) in sub.ranks)
        if not tail:
            sub.tail = TAIL_SCHEMA.empty_table()
            return sub
        keep = _mask(self.tail, sub.ranks, sub.steps)
        sub.tail = self.tail if keep is None else self.tail.filter(pa.array(keep))
        return sub

    # --- parts -------------------------------------------------------------------------
    def part_files(self, *, meta: bool = False, ranks=None) -> list[str]:
        """Absolute paths of the selected part files (``meta``: the stack/marker parts)."""
        chosen = self.ranks if ranks is None else frozenset(ranks) & (self.ranks or frozenset(ranks))
        return [str(self.directory / p.path) for p in self.manifest.select(chosen, self.steps, meta=meta)]

    def dataset(self, *, meta: bool = False, ranks=None, dictionary: Iterable[str] = ()):
        """A lazy :class:`pyarrow.dataset.Dataset` over the selected part files, in
        :data:`PART_SCHEMA` plus the partition columns (a column an older part lacks reads
        as null); None when no part is selected. String columns named in ``dictionary``
        read dictionary-encoded (``dictionary<int32, string>``: columns of few distinct
        values such as ``name`` or ``io`` decode about twice as fast)."""
        import pyarrow.dataset as ds

        files = self.part_files(meta=meta, ranks=ranks)
        if not files:
            return None
        partitions = META_PARTITIONS if meta else STEP_PARTITIONS
        schema = _dictionary_schema(pa.schema(list(PART_SCHEMA) + list(partitions)), dictionary)
        fmt = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=set(dictionary)))
        return ds.dataset(files, schema=schema, format=fmt, partition_base_dir=str(self.directory),
                          partitioning=ds.partitioning(partitions, flavor="hive"))

    def rank_values(self) -> list[int]:
        """The ranks with rows in the selection, sorted."""
        found = {p.rank for p in self.manifest.select(self.ranks, None, meta=False)}
        found |= {p.rank for p in self.manifest.select(self.ranks, None, meta=True)}
        if self.tail.num_rows:
            found |= set(np.unique(self.tail[S.RANK].to_numpy()).tolist())
        return sorted(found)

    def step_values(self) -> list[int]:
        """The steps with call rows in the selection, sorted (from the compaction's summary
        and the tail: no part is read)."""
        import pyarrow.parquet as pq

        from store.manifest import SUMMARY_NAME

        found: set = set()
        summary = self.directory / SUMMARY_NAME
        if self.manifest.parts and summary.exists():
            table = pq.read_table(summary, columns=[S.RANK, S.STEP, "call_rows"])
            keep = table["call_rows"].to_numpy() > 0
            if self.ranks is not None:
                keep &= np.isin(table[S.RANK].to_numpy(), list(self.ranks))
            found |= set(table[S.STEP].to_numpy()[keep].tolist())
        if self.tail.num_rows:
            row = self.tail[S.ROW].to_numpy(zero_copy_only=False)
            found |= set(np.unique(self.tail[S.STEP].to_numpy()[row == S.ROW_CALL]).tolist())
        if self.steps is not None:
            found &= self.steps
        return sorted(int(s) for s in found)

    def table(self, columns: Optional[Iterable[str]] = None, *, side_rows: bool = True,
              dictionary: Iterable[str] = ()) -> pa.Table:
        """Every selected row (parts, then the tail; chunked, not sorted), with the columns
        of :data:`TAIL_SCHEMA`, or only ``columns`` (names of :data:`TAIL_SCHEMA`, in its
        order; the parts read nothing else). Memory: the whole selection; prefer
        :meth:`rank_table` or SQL over the views.

        Args:
            columns: the columns to read (None: all).
            side_rows: False leaves out the stack and marker rows (the ``_meta`` parts are
                not read): the call and leaf rows of the selected steps only, e.g. of one
                step of a reader :meth:`narrowed` to it.
            dictionary: string columns returned dictionary-encoded (see :meth:`dataset`).
        Raises:
            KeyError: a name in ``columns`` or ``dictionary`` is not a column of
                :data:`TAIL_SCHEMA`.
        """
        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        wanted = set(TAIL_SCHEMA.names if columns is None else columns)
        unknown = (wanted | set(dictionary)) - set(TAIL_SCHEMA.names)
        if unknown:
            raise KeyError(f"columns: {sorted(unknown)} not in the log's columns {TAIL_SCHEMA.names}")
        schema = _dictionary_schema(pa.schema([f for f in TAIL_SCHEMA if f.name in wanted],
                                              metadata=TAIL_SCHEMA.metadata), dictionary)
        tables = []
        for meta in ((True, False) if side_rows else (False,)):
            dataset = self.dataset(meta=meta, dictionary=dictionary)
            if dataset is None:
                continue
            condition = None
            if self.steps is not None and not meta:
                condition = ds.field(S.STEP).isin(sorted(self.steps))
            tables.append(dataset.to_table(columns=schema.names, filter=condition).cast(schema))
        tail = self.tail
        if not side_rows and tail.num_rows:
            tail = tail.filter(pc.invert(pc.is_in(tail[S.ROW], pa.array(_SIDE_ROWS))))
        tail = tail.select(schema.names)
        tables.append(tail.cast(schema) if dictionary else tail)
        return pa.concat_tables(tables)

    def rank_table(self, rank: int) -> pa.Table:
        """Every selected row of ``rank`` (:data:`TAIL_SCHEMA`; parts first, then the tail;
        not sorted)."""
        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        tables = []
        for meta in (True, False):
            dataset = self.dataset(meta=meta, ranks=[rank])
            if dataset is None:
                continue
            condition = ds.field(S.RANK) == rank
            if self.steps is not None and not meta:
                condition &= ds.field(S.STEP).isin(sorted(self.steps))
            table = dataset.to_table(filter=condition)
            tables.append(table.select(TAIL_SCHEMA.names).cast(TAIL_SCHEMA))
        if self.tail.num_rows:
            tables.append(self.tail.filter(pc.equal(self.tail[S.RANK], S.scalar(rank, S.RANK))))
        return pa.concat_tables(tables) if tables else TAIL_SCHEMA.empty_table()


def _dictionary_schema(schema: pa.Schema, dictionary: Iterable[str]) -> pa.Schema:
    """``schema`` with the string fields named in ``dictionary`` dictionary-encoded."""
    chosen = set(dictionary)
    if not chosen:
        return schema
    return pa.schema([pa.field(f.name, pa.dictionary(pa.int32(), f.type), f.nullable) if f.name in chosen else f
                      for f in schema], metadata=schema.metadata)


def _stored_skips(path: Path, coverage: LogCoverage) -> list:
    """The damaged parts compaction recorded for the log file ``path`` (not read again)."""
    return [Skipped(str(path), int(e["offset"]), str(e["reason"]), e.get("end"), e.get("rows"),
                    tuple(e["steps"]) if e.get("steps") is not None else None) for e in coverage.skipped]


def _listed(values: list, most: int = 10) -> str:
    text = ", ".join(str(v) for v in values[:most])
    return text + (f", ... ({len(values)} in all)" if len(values) > most else "")
