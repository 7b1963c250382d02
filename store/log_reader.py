"""Event log reader: incremental, and tolerant of a torn or damaged tail.

:class:`LogReader` reads one log file written by :class:`store.log_writer.LogWriter`
message by message. It frames the Arrow IPC stream itself (continuation marker,
metadata length, then :func:`pyarrow.ipc.read_message`), so it knows where each complete
message ends and keeps that byte offset between calls: :meth:`LogReader.read_new`
returns only the batches appended since the previous call.

Damage. Reading stops at the first message that is incomplete (a process killed while
writing: "torn tail") or invalid (garbage bytes, a corrupted header, a batch that fails
validation). Everything before it is returned; :attr:`LogReader.skipped` describes the
rest as a :class:`Skipped` ``(path, offset, reason)`` with the byte offset where the
unreadable part starts. An incomplete tail may still be completed by a live writer, so a
later ``read_new`` retries from that offset. The reader never raises on damaged input.

:func:`read_log` reads every log file under ``{dump_path}/.msprobe/log/`` into one table.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Optional, Union

import numpy as np
import pyarrow as pa

from store import schema as S
from store.errors import LogNotFoundError
from store.log_writer import parse_log_file_name

__all__ = ["LogContents", "LogReader", "Skipped", "find_log_files", "read_log"]

_CONTINUATION = 0xFFFFFFFF
_MAP_AT_LEAST = 16 << 20        # bytes: reads this large are memory-mapped
_PREFIX = struct.Struct("<Ii")


class Skipped(NamedTuple):
    """A part of a log file that could not be read.

    Attributes:
        path: the log file.
        offset: byte offset where the unreadable part starts (-1: the whole file).
        reason: what was wrong, e.g. ``"truncated: incomplete message (12 of 536 bytes)"``.
    """

    path: str
    offset: int
    reason: str


class _Damage(Exception):
    """Internal: the message at the current offset cannot be read."""


def _mapped(handle: Any, offset: int) -> Optional[memoryview]:
    """The bytes of ``handle``'s file from ``offset`` as a read-only memory map when there are
    at least ``_MAP_AT_LEAST`` of them (log files are only ever appended to or replaced whole;
    the batches read from it keep the mapping alive); None: read them normally (a small read,
    or a file system that cannot map)."""
    try:
        if os.fstat(handle.fileno()).st_size - offset < _MAP_AT_LEAST:
            return None
        return memoryview(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ))[offset:]
    except (OSError, ValueError):
        return None


class LogReader:
    """Reads record batches from one log file, incrementally.

    Args:
        path: a ``.arrows`` log file (Arrow IPC stream of :data:`store.schema.LOG_SCHEMA`).

    Attributes:
        skipped: after each :meth:`read_new`, the unreadable tail of the file as a list of
            at most one :class:`Skipped` (empty when everything so far was readable).
        offset: byte offset just past the last complete message read (unit: bytes).
        finished: True once the end-of-stream marker was read (the writer closed).
    """

    def __init__(self, path: Union[str, os.PathLike]) -> None:
        self.path = Path(path)
        self.offset = 0
        self.finished = False
        self.skipped: list[Skipped] = []
        self._schema: Optional[pa.Schema] = None
        self._exact = False
        self._batches_read = 0

    def read_new(self) -> list[pa.RecordBatch]:
        """Return the complete record batches appended since the last call.

        Batches carry exactly the columns of :data:`store.schema.LOG_SCHEMA`.
        Never raises on damaged input or an unreadable file: see :attr:`skipped`.
        """
        self.skipped = []
        try:
            with open(self.path, "rb") as handle:
                data = _mapped(handle, self.offset)
                if data is None:
                    handle.seek(self.offset)
                    data = handle.read()
        except OSError as exc:
            self.skipped = [Skipped(str(self.path), self.offset, f"unreadable: {exc}")]
            return []
        buffer = pa.py_buffer(data)
        batches: list[pa.RecordBatch] = []
        pos = 0
        size = len(data)
        while pos < size:
            if self.finished:
                self._skip(pos, f"corrupt: {size - pos} bytes after the end-of-stream marker")
                break
            try:
                consumed, batch = self._read_message(data, buffer, pos)
            except _Damage as damage:
                self._skip(pos, str(damage))
                break
            pos += consumed
            if batch is not None:
                batches.append(batch)
                self._batches_read += 1
        self.offset += pos
        return batches

    # --- internals -------------------------------------------------------------------
    def _skip(self, pos: int, reason: str) -> None:
        self.skipped = [Skipped(str(self.path), self.offset + pos, reason)]

    def _read_message(
        self, data: Union[bytes, memoryview], buffer: pa.Buffer, pos: int
    ) -> tuple[int, Optional[pa.RecordBatch]]:
        """Read the message at ``pos``: (bytes consumed, batch or None for schema/EOS)."""
        remaining = len(data) - pos
        if remaining < _PREFIX.size:
            raise _Damage(f"truncated: incomplete message header ({remaining} of 8 bytes)")
        marker, length = _PREFIX.unpack_from(data, pos)
        if marker != _CONTINUATION:
            raise _Damage(f"corrupt: no message continuation marker (found 0x{marker:08x})")
        if length == 0:
            self.finished = True
            return _PREFIX.size, None
        if length < 0 or length % 8:
            raise _Damage(f"corrupt: invalid message metadata length {length}")
        if remaining < _PREFIX.size + length:
            raise _Damage(
                f"truncated: incomplete message metadata "
                f"({remaining - _PREFIX.size} of {length} bytes)"
            )
        source = pa.BufferReader(buffer.slice(pos))
        try:
            message = pa.ipc.read_message(source)
        except (pa.ArrowException, OSError, EOFError, ValueError) as exc:
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            kind = "truncated" if "Expected to be able to read" in text else "corrupt"
            raise _Damage(f"{kind}: {text}") from None
        consumed = source.tell()
        try:
            if self._schema is None:
                if message.type != "schema":
                    raise _Damage(f"corrupt: expected a schema message, found {message.type!r}")
                self._schema = self._check_schema(pa.ipc.read_schema(message))
                self._exact = self._schema.equals(S.LOG_SCHEMA, check_metadata=True)
                return consumed, None
            if message.type != "record batch":
                raise _Damage(f"corrupt: unexpected {message.type!r} message")
            batch = pa.ipc.read_record_batch(message, self._schema)
            batch.validate(full=True)
            if not self._exact:
                batch = self._conform(batch)
        except _Damage:
            raise
        except (pa.ArrowException, OSError, ValueError, TypeError) as exc:
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise _Damage(f"corrupt: batch {self._batches_read}: {text}") from None
        return consumed, batch

    def _conform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Select and cast the columns of a batch whose stream schema is compatible with,
        but not identical to, LOG_SCHEMA (other column order, extra columns, nullability)."""
        arrays = []
        for expected in S.LOG_SCHEMA:
            if batch.schema.get_field_index(expected.name) < 0:   # an older version's batch
                arrays.append(pa.nulls(batch.num_rows, expected.type))
                continue
            column = batch.column(expected.name)
            try:
                if not column.type.equals(expected.type):
                    column = column.cast(expected.type)
            except (pa.ArrowException, ValueError, TypeError) as exc:
                raise _Damage(f"corrupt: batch {self._batches_read}: column {expected.name!r}: {exc}") from None
            if not expected.nullable and column.null_count:
                raise _Damage(
                    f"corrupt: batch {self._batches_read}: nulls in non-nullable column {expected.name!r}"
                )
            arrays.append(column)
        return pa.RecordBatch.from_arrays(arrays, schema=S.LOG_SCHEMA)

    @staticmethod
    def _check_schema(found: pa.Schema) -> pa.Schema:
        """Accept this format version and older ones: versions only add nullable columns,
        so a column an older stream lacks reads as null (see :meth:`_conform`); columns are
        matched by name. A newer version, or a missing non-nullable column, is refused."""
        version = (found.metadata or {}).get(S.FORMAT_KEY)
        if version is not None and version != S.FORMAT_VERSION.encode():
            text = version.decode(errors="replace")
            if not (text.isdigit() and int(text) < int(S.FORMAT_VERSION)):
                raise _Damage(
                    f"unsupported: log format version {text!r}; "
                    f"this reader reads versions up to {S.FORMAT_VERSION!r}"
                )
        if found.equals(S.LOG_SCHEMA):
            return found
        problems = []
        for expected in S.LOG_SCHEMA:
            index = found.get_field_index(expected.name)
            if index < 0:
                if not expected.nullable:
                    problems.append(f"missing column {expected.name!r}")
            elif not found.field(index).type.equals(expected.type):
                problems.append(
                    f"column {expected.name!r}: expected {expected.type}, got {found.field(index).type}"
                )
        if problems:
            raise _Damage("unsupported: incompatible schema: " + "; ".join(problems))
        return found


@dataclass(frozen=True)
class LogContents:
    """Everything readable under one dump path.

    Attributes:
        table: all rows of all log files (any rank), :data:`store.schema.LOG_SCHEMA`.
            Files are taken in creation order per rank; when a rank has several files
            (restarted process, several writers) the ``seq`` of each later file is
            shifted past the previous file's largest ``seq``, so ``seq`` orders the rows of
            a rank across files. Stack rows keep ``seq = -1``.
        stacks: ``{stack_id: frames}`` (innermost first); the first file holding an id wins.
        skipped: unreadable parts of files.
        files: the log files read, in reading order.
        row_files: for each row of ``table``, the index in ``files`` of the file it came
            from (int32; None: unknown, as for a table built by hand). The ``calls`` view
            keeps the calls of two files apart (two runs pointed at one dump path).
    """

    table: pa.Table
    stacks: dict[int, tuple[str, ...]]
    skipped: tuple[Skipped, ...] = ()
    files: tuple[Path, ...] = field(default=())
    row_files: Optional[pa.Array] = None


def _file_order(path: Path) -> tuple:
    parsed = parse_log_file_name(path.name)
    if parsed is None:
        return (1, 0, 0, 0, path.name)
    rank, pid, time_ns = parsed
    return (0, rank, time_ns, pid, path.name)


def find_log_files(dump_path: Union[str, os.PathLike]) -> list[Path]:
    """The log files under ``{dump_path}/.msprobe/log/``, ordered by rank, then creation
    time (from the file name).

    Raises:
        LogNotFoundError: ``dump_path`` is not a directory, or holds no log file.
    """
    root = Path(dump_path)
    if not root.is_dir():
        raise LogNotFoundError(f"dump path {str(root)!r} does not exist or is not a directory")
    log_dir = root / S.STORE_DIR / S.LOG_DIR
    files = sorted(
        (p for p in log_dir.glob("*" + S.LOG_SUFFIX) if p.is_file()), key=_file_order
    ) if log_dir.is_dir() else []
    if not files:
        raise LogNotFoundError(
            f"no msprobe log found in {str(root)!r} (expected {S.STORE_DIR}/{S.LOG_DIR}/"
            f"*{S.LOG_SUFFIX}); was it written by msprobe with this dump_path?"
        )
    return files


def read_log(dump_path: Union[str, os.PathLike]) -> LogContents:
    """Read every log file under ``{dump_path}/.msprobe/log/`` (every rank).

    Returns:
        :class:`LogContents`; damaged tails are skipped and listed in ``skipped``.
    Raises:
        LogNotFoundError: ``dump_path`` is not a directory, or holds no log file.
    """
    import pyarrow.compute as pc  # offline only; kept out of the recording process

    files = find_log_files(dump_path)
    tables: list[pa.Table] = []
    skipped: list[Skipped] = []
    stacks: dict[int, tuple[str, ...]] = {}
    next_seq: dict[int, int] = {}
    row_files: list[pa.Array] = []
    for index, path in enumerate(files):
        reader = LogReader(path)
        batches = reader.read_new()
        skipped.extend(reader.skipped)
        if not batches:
            continue
        table = pa.Table.from_batches(batches, schema=S.LOG_SCHEMA)
        table = _shift_seq(table, next_seq)
        tables.append(table)
        row_files.append(pa.array(np.full(table.num_rows, index, dtype=np.int32)))
        stack_rows = table.filter(pc.equal(table[S.ROW], S.scalar(S.ROW_STACK, S.ROW)))
        for stack_id, frames in zip(
            stack_rows[S.STACK_ID].to_pylist(), stack_rows[S.FRAMES].to_pylist()
        ):
            if stack_id is not None and stack_id not in stacks:
                stacks[stack_id] = tuple(frames or ())
    if tables:
        table = pa.concat_tables(tables).combine_chunks()
        origin = pa.concat_arrays(row_files)
    else:
        table = S.LOG_SCHEMA.empty_table()
        origin = pa.array([], pa.int32())
    return LogContents(table=table, stacks=stacks, skipped=tuple(skipped), files=tuple(files), row_files=origin)


def _shift_seq(table: pa.Table, next_seq: dict[int, int]) -> pa.Table:
    """Shift ``seq`` of each rank's rows past what earlier files of that rank used."""
    import pyarrow.compute as pc  # offline only (see read_log)

    ranks = pc.unique(table[S.RANK]).to_pylist()
    seq = table[S.SEQ]
    shifted = False
    for rank in ranks:
        in_rank = pc.and_(pc.equal(table[S.RANK], S.scalar(rank, S.RANK)), pc.greater_equal(seq, S.scalar(0, S.SEQ)))
        offset = next_seq.get(rank, 0)
        if offset:
            seq = pc.if_else(in_rank, pc.add(seq, S.scalar(offset, S.SEQ)), seq)
            shifted = True
        largest = pc.max(pc.filter(seq, in_rank)).as_py()
        if largest is not None:
            next_seq[rank] = largest + 1
    if not shifted:
        return table
    index = table.schema.get_field_index(S.SEQ)
    return table.set_column(index, S.LOG_SCHEMA.field(S.SEQ), seq.cast(pa.int64()))
