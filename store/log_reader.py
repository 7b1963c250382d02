"""Event log reader: incremental, verifying, and tolerant of torn or damaged parts.

:class:`LogReader` reads one log file written by :class:`store.log_writer.LogWriter`
message by message. It frames the Arrow IPC stream itself (continuation marker,
metadata length, then :func:`pyarrow.ipc.read_message`), so it knows where each complete
message ends and keeps that byte offset between calls: :meth:`LogReader.iter_new` yields
(and :meth:`LogReader.read_new` returns) only the batches appended since the previous call,
and :attr:`LogReader.skipped` lists what was not read as data.

Verification (log format 2, :mod:`store.log_frame`). Every record batch message carries
the CRC-32 of its own bytes; a batch is returned only when the CRC matches, so a damaged
batch is never read as data. A damaged message is skipped exactly: the reader looks for
the next message that verifies (the next continuation marker whose message parses and
whose CRC matches: a false match needs a 32-bit collision on a well-formed message) and
goes on from there. Each skipped part becomes a :class:`Skipped` with its byte range, the
rows its (unverified) header claims when it can be parsed, and the steps of the intact
batches around it. Logs of format 1 (no checksums) are read as before and flagged
:attr:`LogReader.verified` False; there, reading stops at the first message that cannot be
decoded.

Torn tail. A message that is incomplete at the end of the file (a process killed while
writing, or a live writer in the middle of a write) is reported as ``truncated``; the
reader's offset stays at its start, so a later ``read_new`` retries it. The reader never
raises on damaged input.

:func:`read_log` reads every log file under ``{dump_path}/.msprobe/log/`` into one table.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Optional, Union

import numpy as np
import pyarrow as pa

from store import log_frame as F
from store import schema as S
from store.errors import LogNotFoundError
from store.log_writer import parse_log_file_name

__all__ = ["LogContents", "LogReader", "Skipped", "expected_ranks", "find_log_files", "missing_ranks", "notices",
           "read_log"]

_CONTINUATION = 0xFFFFFFFF
_MARKER = b"\xff\xff\xff\xff"
_MAP_AT_LEAST = 16 << 20        # bytes: reads this large are memory-mapped
_PREFIX = struct.Struct("<Ii")
_V2_SCHEMA = F.schema_message()


class Skipped(NamedTuple):
    """A part of a log file that was not read as data.

    Attributes:
        path: the log file.
        offset: byte offset where the skipped part starts (-1: the whole file).
        reason: what was wrong, starting with ``truncated``, ``corrupt``, ``unreadable``
            or ``unsupported``, e.g. ``"corrupt: checksum mismatch (stored 1a2b3c4d,
            computed 99aa0c17)"``.
        end: byte offset just past the skipped part; None: the end of the file as read.
        rows: the rows the skipped batch message says it holds (its header is not
            verified, so this is a hint); None: unknown (no header could be parsed).
        steps: ``(after, before)``: the largest step of the intact batches before the
            skipped part and the smallest step of those after it (None: no such batch).
            Rows of a rank are written in step order, so the skipped rows belong to steps
            ``after`` to ``before``.
    """

    path: str
    offset: int
    reason: str
    end: Optional[int] = None
    rows: Optional[int] = None
    steps: Optional[tuple] = None

    def describe(self) -> str:
        """One line for people: ``skipped FILE at byte A (to byte B, 536 rows, steps 1 to
        2): REASON``."""
        details = []
        if self.end is not None and self.offset >= 0:
            details.append(f"to byte {self.end}")
        if self.rows is not None:
            details.append(f"{self.rows} rows by its header")
        if self.steps is not None:
            after, before = self.steps
            if after is None and before is None:
                pass
            elif after == before:
                details.append(f"step {after}")
            elif before is None:
                details.append(f"step {after} or later")
            elif after is None:
                details.append(f"step {before} or earlier")
            else:
                details.append(f"steps {after} to {before}")
        where = " (whole file)" if self.offset < 0 else f" at byte {self.offset}"
        extra = f" ({', '.join(details)})" if details else ""
        return f"skipped {self.path}{where}{extra}: {self.reason}"


class _Damage(Exception):
    """Internal: the message at the current offset cannot be read."""

    def __init__(self, reason: str, rows: Optional[int] = None) -> None:
        super().__init__(reason)
        self.rows = rows


def _mapped(handle: Any) -> Optional[mmap.mmap]:
    """``handle``'s file as a read-only memory map when it holds at least ``_MAP_AT_LEAST``
    bytes (log files are only ever appended to or replaced whole; the batches read from it
    keep the mapping alive); None: read it normally (a small file, or a file system that
    cannot map)."""
    try:
        if os.fstat(handle.fileno()).st_size < _MAP_AT_LEAST:
            return None
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


class LogReader:
    """Reads verified record batches from one log file, incrementally.

    Args:
        path: a ``.arrows`` log file (Arrow IPC stream of :data:`store.schema.LOG_SCHEMA`).

    Attributes:
        skipped: after each :meth:`read_new`, the parts of the file it did not read as
            data, as :class:`Skipped` in file order (empty when everything so far was
            readable).
        offset: byte offset just past the last message read or skipped for good (unit:
            bytes); a torn tail is not passed.
        finished: True once the end-of-stream marker was read at the end of the file.
        verified: True for a format-2 log (every returned batch matched its checksum),
            False for a format-1 log (no checksums), None before the schema was read.
    """

    @property
    def unfinished(self) -> bool:
        """Whether what was read ends cleanly after a batch but without the end-of-stream
        marker (no torn tail either): the writer stopped between two flushes."""
        return not self.finished and not any(s.end is None for s in self.skipped)

    def __init__(self, path: Union[str, os.PathLike]) -> None:
        self.path = Path(path)
        self.offset = 0
        self.finished = False
        self.verified: Optional[bool] = None
        self.skipped: list[Skipped] = []
        self._schema: Optional[pa.Schema] = None
        self._exact = False
        self._batches_read = 0
        self._last_step: Optional[int] = None  # largest step of the batches read so far
        self._since_skip = -1  # _batches_read when the last skip was recorded
        self._seen: dict[int, int] = {}  # (checksum, length) of each verified batch -> its offset
        self._last_key = 0  # that key for the batch _verified_batch returned last

    def read_new(self) -> list[pa.RecordBatch]:
        """Return the complete, verified record batches appended since the last call
        (:meth:`iter_new`, as a list).

        Batches carry exactly the columns of :data:`store.schema.LOG_SCHEMA`.
        Never raises on damaged input or an unreadable file: see :attr:`skipped`.
        """
        return list(self.iter_new())

    def iter_new(self) -> Iterator[pa.RecordBatch]:
        """Yield the complete, verified record batches appended since the last call, one
        at a time, in file order (a large file is memory-mapped: a batch holds no copy).

        :attr:`skipped` is reset when iteration starts and complete once the iterator is
        exhausted (the ``steps`` of a skip are filled in when the next batch is read);
        :attr:`offset` advances with each batch. Never raises on damaged input or an
        unreadable file.
        """
        self.skipped = []
        try:
            with open(self.path, "rb") as handle:
                data = _mapped(handle)
                base = 0
                if data is None:
                    handle.seek(self.offset)
                    data = handle.read()
                    base = self.offset
        except OSError as exc:
            self.skipped = [Skipped(str(self.path), self.offset, f"unreadable: {exc}")]
            return
        buffer = pa.py_buffer(data)
        pos = self.offset - base
        size = len(data)
        waiting = False  # the last skip still needs the first step after it
        while pos < size:
            if self.finished:
                self._skip(base + pos, base + size, f"corrupt: {size - pos} bytes after the end-of-stream marker", None)
                break
            try:
                consumed, batch = self._read_message(data, buffer, pos)
            except _Damage as damage:
                found = self._resync(data, buffer, pos) if self.verified is not False else None
                if found is None:
                    self._skip(base + pos, None, str(damage), damage.rows)
                    break
                next_pos, consumed, batch = found
                self._skip(base + pos, base + next_pos, str(damage), damage.rows)
                waiting = True
                pos = next_pos
                if batch is None:  # the end-of-stream marker, at the end of the file
                    self.finished = True
                elif self._schema is None:  # the schema message was unreadable: verified batches say format 2
                    self._schema, self._exact, self.verified = S.LOG_SCHEMA, True, True
            start = base + pos
            pos += consumed
            self.offset = base + pos
            if batch is not None and self.verified:
                first_at = self._copy_of(start, consumed)
                if first_at is not None:
                    self._skip(start, base + pos, f"corrupt: a second copy of the batch at byte {first_at}",
                               batch.num_rows)
                    waiting = True
                    continue
            if batch is not None:
                self._batches_read += 1
                first, self._last_step = _step_bounds(batch, self._last_step)
                if waiting and first is not None:
                    self._close_skips(first)
                    waiting = False
                yield batch
        self.offset = base + pos

    # --- internals -------------------------------------------------------------------
    def _skip(self, start: int, end: Optional[int], reason: str, rows: Optional[int]) -> None:
        """Record a skipped part (file offsets); one that starts where the previous one
        ends, with no batch between, extends it."""
        last = self.skipped[-1] if self.skipped else None
        if last is not None and last.end == start and self._since_skip == self._batches_read:
            self.skipped[-1] = last._replace(end=end)
            return
        self._since_skip = self._batches_read
        self.skipped.append(Skipped(str(self.path), start, reason, end, rows, (self._last_step, None)))

    def _copy_of(self, start: int, size: int) -> Optional[int]:
        """The offset of an earlier batch whose message bytes equal the ``size`` bytes at
        ``start`` (the batch :meth:`_verified_batch` returned last), else None (and the batch
        is remembered). A batch holds rows of distinct ``seq``, so an equal one is a copy
        (a block written twice); checksum and length pick the candidate, the bytes decide."""
        key = self._last_key
        earlier = self._seen.get(key)
        if earlier is None:
            self._seen[key] = start
            return None
        try:
            with open(self.path, "rb") as handle:
                handle.seek(earlier)
                before = handle.read(size)
                handle.seek(start)
                same = before == handle.read(size)
        except OSError:
            return None
        return earlier if same else None

    def _close_skips(self, step: int) -> None:
        """Give the skips still open the first step read after them."""
        self.skipped = [s._replace(steps=(s.steps[0], step)) if s.steps and s.steps[1] is None else s
                        for s in self.skipped]

    def _resync(self, data, buffer: pa.Buffer, pos: int, accept_end: bool = True):
        """The first verified message after the damaged one at ``pos``: ``(its position,
        bytes, batch)``, or ``(position, 8, None)`` for an end-of-stream marker that ends the
        file (``accept_end``), or None when no message after ``pos`` verifies (format 2
        only: the checksum is what tells a real message from bytes that look like one)."""
        size = len(data)
        candidate = pos
        while True:
            candidate = data.find(_MARKER, candidate + 1)
            if candidate < 0:
                return None
            if candidate + 8 == size and data[candidate:size] == F.END_OF_STREAM:
                if accept_end:
                    return candidate, 8, None
                return None
            length = _PREFIX.unpack_from(data, candidate)[1] if candidate + 8 <= size else -1
            if length <= 0 or length % 8 or candidate + 8 + length > size:
                continue
            try:
                consumed, batch = self._read_message(data, buffer, candidate, probe=True)
            except _Damage:
                continue
            if batch is not None:
                return candidate, consumed, batch

    def _read_message(self, data, buffer: pa.Buffer, pos: int, probe: bool = False) -> tuple[int, Optional[pa.RecordBatch]]:
        """Read the message at ``pos``: (bytes consumed, batch or None for schema/EOS).
        ``probe``: only a format-2 record batch is accepted (resynchronisation)."""
        remaining = len(data) - pos
        if remaining < _PREFIX.size:
            raise _Damage(f"truncated: incomplete message header ({remaining} of 8 bytes)")
        marker, length = _PREFIX.unpack_from(data, pos)
        if marker != _CONTINUATION:
            raise _Damage(f"corrupt: no message continuation marker (found 0x{marker:08x})")
        if length == 0:
            if self.verified and remaining > _PREFIX.size:
                raise _Damage(f"corrupt: an end-of-stream marker followed by {remaining - 8} bytes")
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
            text = _first_line(exc)
            kind = "truncated" if "Expected to be able to read" in text else "corrupt"
            raise _Damage(f"{kind}: {text}") from None
        consumed = source.tell()
        if self._schema is None and not probe:
            return consumed, self._read_schema(data, buffer, pos, consumed, message)
        if self.verified or probe:
            return consumed, self._verified_batch(data, pos, consumed, length, message)
        return consumed, self._unverified_batch(message)

    def _read_schema(self, data, buffer, pos: int, consumed: int, message) -> None:
        """Take the schema message at ``pos`` (the first of the file)."""
        if bytes(memoryview(data)[pos:pos + consumed]) == _V2_SCHEMA:
            self._schema, self._exact, self.verified = S.LOG_SCHEMA, True, True
            return None
        problem = None
        try:
            if message.type != "schema":
                problem = f"corrupt: expected a schema message, found {message.type!r}"
            else:
                found = pa.ipc.read_schema(message)
                metadata = found.metadata or {}
                version = metadata.get(S.FORMAT_KEY)
                if version in (None, b"1") and S.CHECKSUM_ALGORITHM_KEY not in metadata:
                    schema = self._check_schema(found)
                    self._schema = schema
                    self._exact = schema.equals(S.LOG_SCHEMA, check_metadata=False)
                    self.verified = False
                    return None
                if version == S.FORMAT_VERSION.encode():
                    problem = "corrupt: the schema message is not format 2's"
                else:
                    problem = (f"unsupported: log format version {(version or b'').decode(errors='replace')!r}; "
                               f"this reader reads versions {', '.join(map(repr, S.FORMAT_VERSIONS))}")
        except _Damage as damage:
            problem = str(damage)
        except (pa.ArrowException, OSError, ValueError, TypeError) as exc:
            problem = f"corrupt: schema message: {_first_line(exc)}"
        # not a schema this reader knows: a damaged format-2 schema message if a verified
        # batch follows (the batches prove the format), else unsupported
        if self._resync(data, buffer, pos, accept_end=False) is None:
            raise _Damage(problem)
        self._schema, self._exact, self.verified = S.LOG_SCHEMA, True, True
        raise _Damage(f"{problem} (a damaged format-2 schema message: the batches after it verify)")

    def _verified_batch(self, data, pos: int, consumed: int, length: int, message) -> pa.RecordBatch:
        """The batch of a format-2 message whose checksum matches; else :class:`_Damage`."""
        raw = memoryview(data)[pos:pos + consumed]
        digits_at = F.find_checksum(raw, length)
        if digits_at is None:
            raise _Damage("corrupt: no checksum in the message metadata", self._claimed_rows(message))
        stored = bytes(raw[digits_at:digits_at + 8]).decode()
        computed = F.message_checksum(raw, digits_at)
        if int(stored, 16) != computed:
            raise _Damage(f"corrupt: checksum mismatch (stored {stored}, computed {computed:08x})",
                          self._claimed_rows(message))
        if message.type != "record batch":
            raise _Damage(f"corrupt: unexpected {message.type!r} message")
        try:
            batch = pa.ipc.read_record_batch(message, S.LOG_SCHEMA)
            batch.validate(full=True)
        except (pa.ArrowException, OSError, ValueError, TypeError) as exc:
            raise _Damage(f"corrupt: batch {self._batches_read}: {_first_line(exc)}") from None
        self._last_key = computed | (consumed << 32)
        return batch

    @staticmethod
    def _claimed_rows(message) -> Optional[int]:
        """The row count a (damaged) record batch message's header claims, or None: from
        the decoded batch, else (a damaged body, which a compressed batch cannot be
        decoded without) from the header alone (:func:`_header_rows`)."""
        try:
            return pa.ipc.read_record_batch(message, S.LOG_SCHEMA).num_rows
        except Exception:  # noqa: BLE001 - a damaged header or body: read the header alone
            pass
        try:
            return _header_rows(message.metadata)
        except Exception:  # noqa: BLE001 - a damaged header: no count
            return None

    def _unverified_batch(self, message) -> pa.RecordBatch:
        """The batch of a format-1 message (no checksum): decoded and validated only."""
        try:
            if message.type != "record batch":
                raise _Damage(f"corrupt: unexpected {message.type!r} message")
            batch = pa.ipc.read_record_batch(message, self._schema)
            batch.validate(full=True)
            if not self._exact:
                batch = self._conform(batch)
        except _Damage:
            raise
        except (pa.ArrowException, OSError, ValueError, TypeError) as exc:
            raise _Damage(f"corrupt: batch {self._batches_read}: {_first_line(exc)}") from None
        return batch

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
        """A format-1 (or unversioned) stream's schema: versions only add nullable columns, so
        a column an older stream lacks reads as null (see :meth:`_conform`); columns are
        matched by name. A missing non-nullable column or another type is refused."""
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


_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_RECORD_BATCH_HEADER = 3  # MessageHeader union: NONE, Schema, DictionaryBatch, RecordBatch, ...


def _header_rows(metadata: pa.Buffer) -> Optional[int]:
    """The ``length`` (rows) of the ``RecordBatch`` header in an IPC message's metadata
    flatbuffer, read without the body; None when the metadata holds another header or
    says nothing or its length differs from its first column's (a damaged header). Layout
    from the Arrow format's ``Message.fbs`` (table ``Message``: field 1 ``header_type``,
    field 2 ``header``; table ``RecordBatch``: field 0 ``length``, default 0, field 1
    ``nodes``, a vector of 16-byte ``FieldNode`` structs ``(length, null_count)``) and the
    FlatBuffers binary format (root table offset, then per table a
    signed offset back to its vtable of 16-bit field offsets).

    Raises:
        struct.error: an offset points outside ``metadata``.
    """
    buf = memoryview(metadata)

    def field(table: int, index: int) -> Optional[int]:
        vtable = table - _I32.unpack_from(buf, table)[0]
        if 4 + 2 * index >= _U16.unpack_from(buf, vtable)[0]:
            return None
        offset = _U16.unpack_from(buf, vtable + 4 + 2 * index)[0]
        return table + offset if offset else None

    root = _I32.unpack_from(buf, 0)[0]
    kind = field(root, 1)
    if kind is None or buf[kind] != _RECORD_BATCH_HEADER:
        return None
    header = field(root, 2)
    if header is None:
        return None
    batch = header + _I32.unpack_from(buf, header)[0]
    length = field(batch, 0)
    rows = 0 if length is None else _I64.unpack_from(buf, length)[0]
    nodes = field(batch, 1)  # the field nodes: (length, null_count) per array, the first a column
    if nodes is None:
        return None
    nodes += _I32.unpack_from(buf, nodes)[0]
    if _I32.unpack_from(buf, nodes)[0] < 1 or _I64.unpack_from(buf, nodes + 4)[0] != rows:
        return None  # a top-level column has the batch's length: a damaged length field
    return rows if rows >= 0 else None


def _step_bounds(batch: pa.RecordBatch, largest: Optional[int]) -> tuple[Optional[int], Optional[int]]:
    """``(smallest, largest)`` step of ``batch``'s rows with a step (>= 0), the largest at
    least ``largest``; None where there is none."""
    steps = batch.column(S.STEP).to_numpy(zero_copy_only=False)
    steps = steps[steps >= 0]
    if not len(steps):
        return None, largest
    top = int(steps.max())
    return int(steps.min()), top if largest is None else max(top, largest)


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
        unverified: the files of log format 1, whose batches carry no checksum (read, but
            damage in them may go unnoticed).
        missing_ranks: ranks the markers say recorded (``world_size``, or the config's
            ``ranks``) that have no rows (:func:`missing_ranks`).
        unfinished: files that end cleanly after a batch but without the end-of-stream
            marker: the writer was killed (or still writes); a torn tail is in ``skipped``
            instead.
    """

    table: pa.Table
    stacks: dict[int, tuple[str, ...]]
    skipped: tuple[Skipped, ...] = ()
    files: tuple[Path, ...] = field(default=())
    row_files: Optional[pa.Array] = None
    unverified: tuple[str, ...] = ()
    missing_ranks: tuple[int, ...] = ()
    unfinished: tuple[str, ...] = ()

    def notices(self) -> list[str]:
        """What a command that read these logs must tell its user: one line per skipped
        part (:meth:`Skipped.describe`), per rank without a log, per unverified file, per
        unfinished file."""
        return notices(self.skipped, self.unverified, self.missing_ranks, self.unfinished)


def notices(skipped, unverified=(), missing_ranks=(), unfinished=()) -> list[str]:
    """Lines for people about ``skipped`` (:class:`Skipped`), ``unverified`` (paths of
    format-1 logs), ``missing_ranks`` and ``unfinished`` (paths of logs without an
    end-of-stream marker): the same wording in every command."""
    lines = [skip.describe() if isinstance(skip, Skipped) else str(skip) for skip in skipped]
    lines += [f"skipped rank {rank}: no readable log, although the run recorded it (world size or "
              f"config rank list in the markers)" for rank in missing_ranks]
    lines += [f"unverified {path}: log format 1 has no checksums; damage in it may go unnoticed"
              for path in unverified]
    lines += [f"unfinished {path}: no end-of-stream marker: the process writing it was killed or is still "
              f"running; rows it had not flushed are not in it" for path in unfinished]
    return lines


def missing_ranks(table: pa.Table) -> tuple[int, ...]:
    """The ranks that should have recorded but have no rows in ``table`` (log rows of
    every rank): the :func:`expected_ranks` of its markers less the ranks it holds; ()
    when the markers say nothing (a run without torch.distributed)."""
    import pyarrow.compute as pc  # offline only

    expected = expected_ranks(table)
    if not expected:
        return ()
    present = set(pc.unique(table[S.RANK]).to_pylist())
    return tuple(sorted(expected - present))


def expected_ranks(table: pa.Table) -> frozenset:
    """The ranks a run recorded, by the marker rows of ``table`` (any rows with the
    ``row`` and ``meta`` columns; other rows are ignored): the config's rank list
    (``ranks`` in a marker's ``meta``) where a marker carries one, else ranks ``0 ..
    world_size-1`` of the largest ``world_size``; empty when neither is known."""
    import json

    import pyarrow.compute as pc  # offline only

    markers = table.filter(pc.equal(table[S.ROW], S.scalar(S.ROW_MARKER, S.ROW)))
    world, listed = None, set()
    for text in markers[S.META].to_pylist():
        try:
            meta = json.loads(text) if text else {}
        except ValueError:
            continue
        if not isinstance(meta, dict):
            continue
        if isinstance(meta.get("world_size"), int):
            world = max(world or 0, meta["world_size"])
        if isinstance(meta.get("ranks"), list):
            listed.update(r for r in meta["ranks"] if isinstance(r, int))
    if listed:
        return frozenset(listed)
    return frozenset(range(world)) if world is not None else frozenset()


def log_file_order(path: Path) -> tuple:
    """Sort key of log files: rank, then creation time (from the file name), then pid; files
    with other names last."""
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
        (p for p in log_dir.glob("*" + S.LOG_SUFFIX) if p.is_file()), key=log_file_order
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
    files = find_log_files(dump_path)
    tables: list[pa.Table] = []
    skipped: list[Skipped] = []
    unverified: list[str] = []
    unfinished: list[str] = []
    stacks: dict[int, tuple[str, ...]] = {}
    next_seq: dict[int, int] = {}
    row_files: list[pa.Array] = []
    for index, path in enumerate(files):
        reader = LogReader(path)
        batches = reader.read_new()
        skipped.extend(reader.skipped)
        if reader.verified is False:
            unverified.append(str(path))
        if reader.unfinished:
            unfinished.append(str(path))
        if not batches:
            continue
        table = pa.Table.from_batches(batches, schema=S.LOG_SCHEMA)
        table = shift_seq(table, {}, next_seq)
        tables.append(table)
        row_files.append(pa.array(np.full(table.num_rows, index, dtype=np.int32)))
        add_stacks(stacks, table)
    if tables:
        table = pa.concat_tables(tables).combine_chunks()
        origin = pa.concat_arrays(row_files)
    else:
        table = S.LOG_SCHEMA.empty_table()
        origin = pa.array([], pa.int32())
    return LogContents(table=table, stacks=stacks, skipped=tuple(skipped), files=tuple(files), row_files=origin,
                       unverified=tuple(unverified), missing_ranks=missing_ranks(table),
                       unfinished=tuple(unfinished))


def add_stacks(stacks: dict, rows: pa.Table) -> dict:
    """Add to ``stacks`` (stack id -> frames) the frames of each stack row of ``rows`` (rows
    of :data:`store.schema.LOG_SCHEMA`, any kind) whose id is not in it yet: the first
    frames stored for an id (:class:`store.records.Stack`); returns ``stacks``."""
    from store import arrow_np

    side = arrow_np.select(rows, arrow_np.equals(rows[S.ROW], S.ROW_STACK))
    for stack_id, frames in zip(arrow_np.pylist(side[S.STACK_ID]), arrow_np.pylist(side[S.FRAMES])):
        if stack_id is not None and stack_id not in stacks:
            stacks[stack_id] = tuple(frames or ())
    return stacks


def shift_seq(table: pa.Table, offsets: dict, next_seq: dict) -> pa.Table:
    """``table`` with ``seq`` (>= 0) of each rank's rows raised by ``offsets[rank]``;
    ranks missing from ``offsets`` get ``next_seq.get(rank, 0)`` (and are added to
    ``offsets``). Afterwards ``next_seq[rank]`` is the largest shifted seq + 1."""
    if table.num_rows == 0:
        return table
    rank = table[S.RANK].to_numpy()
    seq = table[S.SEQ].to_numpy().copy()
    shifted = False
    for r in np.unique(rank).tolist():
        in_rank = (rank == r) & (seq >= 0)
        offset = offsets.setdefault(int(r), next_seq.get(int(r), 0))
        if offset:
            seq[in_rank] += offset
            shifted = True
        if in_rank.any():
            next_seq[int(r)] = int(seq[in_rank].max()) + 1
    if not shifted:
        return table
    return table.set_column(table.schema.get_field_index(S.SEQ), table.schema.field(S.SEQ), pa.array(seq, pa.int64()))
