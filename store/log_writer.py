"""Append-only event log writer: one Arrow IPC stream per writer (process and rank) and segment.

The writer takes the typed records of :mod:`store.records` and appends them to
``{dump_path}/.msprobe/log/rank{rank}.{pid}.{time_ns}.arrows`` as record batches of
:data:`store.schema.LOG_SCHEMA` (design.md, section Store), each message carrying the
CRC-32 of its bytes (log format 2, :mod:`store.log_frame`). Nothing is ever rewritten:
a batch, once flushed, stays as written; a process killed mid-write leaves a torn tail
that :class:`store.log_reader.LogReader` skips.

Hot path. ``append`` only assigns a sequence number and keeps a reference to the frozen
record (a handful of list appends, independent of the number of leaves); the records are
turned into columns (one Python list per column, then one Arrow array per column; a column
of nulls only is ``pa.nulls``, the same bytes) when a batch is flushed: when ``flush_rows``
rows are pending, when ``flush_interval_s`` has passed since the last flush (checked on each
append, and by the flush timer), and on :meth:`LogWriter.flush`, :meth:`LogWriter.take_step`
and :meth:`LogWriter.close`.

Flush timer. A process that records and then stalls (a collective that never returns, a
deadlock) makes no further append, yet its last rows are the ones that explain the stall.
Each writer (with ``0 < flush_interval_s < inf``) has one daemon thread that wakes
``flush_interval_s`` after the last flush and, if rows are pending, flushes them under the
writer's lock: the same code path as any flush, so a kill during it leaves a torn tail like
any other. A row appended at time ``t`` is therefore in the file (handed to the operating
system, not fsynced) by about ``t + flush_interval_s`` whether or not another append
comes. The thread adds nothing to ``append``; it wakes about once per
``flush_interval_s`` at most, never keeps the process alive, holds only a weak reference to the
writer (a writer dropped without ``close`` is collected, and its thread ends), and ends at
:meth:`LogWriter.close` (which joins it: nothing is written after ``close`` returns) or at
the writer's first fault. Where no thread can be started, flushes happen on appends only.

Live export. Each flushed batch is kept (its call, leaf and marker rows), until its step
is taken: :meth:`LogWriter.take_step` returns a step's rows as an Arrow table for the
step's files (:class:`store.export.StepFiles`).

Segments. With ``segment_bytes`` set, :meth:`LogWriter.end_segment_if_due` (called at a
step's end, once the step's rows were taken) ends the file once it holds at least that many
bytes (counted before IPC compression, see ``LogWriter``): the stream gets its end-of-stream marker and is closed, and the next flush opens a
new file (a new ``time_ns`` in its name). Each segment is a log file like any other: its
``seq`` counts from 0, and it repeats every stack row the writer wrote before (written with
its first batch), so a segment can be read, compacted and archived on its own. Readers
order a rank's files by name (:func:`store.log_reader.find_log_files`) and shift ``seq``
across them, as they do for the files of several processes.

Row conventions (see :mod:`store.schema` for the columns):

- ``call`` and ``leaf`` rows of one :class:`~store.records.Call` share its ``seq``; leaf
  rows repeat the call's ``step``, ``kind``, ``name`` and ``api_type`` so that the query
  views need no join. ``path`` holds the compact JSON list of components
  (``[0,"k"]``), ``arg`` the components joined with ``"."`` (``"0.k"``; ``""`` for ``()``).
- ``stack`` rows carry ``step = -1`` and ``seq = -1`` (a stack belongs to no step); each
  ``stack_id`` is written at most once per log file (segment).
- ``marker`` rows get a ``seq`` like calls and carry ``meta`` as compact JSON text.
- Within one batch the rows are grouped by kind: call rows, then leaf rows (in append
  order, so a call's leaves keep their order), stack rows, marker rows. ``seq`` restores
  the append order across kinds.

Faults. An ``OSError`` (disk full, permission lost, the log file deleted: checked with
``fstat`` at each flush) or a record Arrow cannot convert is raised once, as
:class:`store.errors.StoreWriteError`, from the call that hit it (a fault of the flush
timer: from the next ``append*``, ``flush``, ``take_step*`` or ``close``); the writer is a
no-op afterwards (:attr:`LogWriter.failed`), and what it flushed before stays
readable. Rows appended before a write fault stay available to :meth:`LogWriter.take_step`;
those of a batch Arrow could not convert are dropped with it.

The writer is thread-safe (hooks may fire on autograd worker threads). It writes only
from the process that created it: in a forked child (a DataLoader worker forked while
recording) flushes and ``close`` drop the rows instead of writing them, so a child can
never interleave bytes into the parent's log. The child gets a fresh lock and no pending
rows (the parent's flush timer may have held the lock, mid-flush, when the process forked).
"""
from __future__ import annotations

import errno
import functools
import json
import os
import threading
import time
import weakref
from pathlib import Path
from typing import BinaryIO, Callable, Literal, Optional, Union

import pyarrow as pa

from store import schema as S
from store.errors import StoreWriteError
from store.fileutil import FILE_MODE, make_dirs
from store.bg_fsync import BackgroundFsync
from store.log_frame import END_OF_STREAM, MessageSealer, schema_message
from store.log_names import log_file_name, other_process_logs, parse_log_file_name
from store.records import LEAF_FIELDS, Call, Leaf, Marker, Stack
import numpy as np

from store import arrow_np


__all__ = ["COMPRESSIONS", "LogWriter", "log_file_name", "parse_log_file_name", "other_process_logs"]

COMPRESSIONS = (None, "lz4", "zstd")

#: the leaf columns copied verbatim from the Leaf fields (all but ``path``: its columns
#: PATH and ARG are derived), in :data:`store.schema.LEAF_FIELDS` order
_LEAF_COLUMN_NAMES = tuple(name for name in LEAF_FIELDS if name != S.PATH)
_LEAF_COLUMN_INDEX = tuple(LEAF_FIELDS.index(name) for name in _LEAF_COLUMN_NAMES)
_PATH_INDEX = LEAF_FIELDS.index(S.PATH)


#: leaves transposed per ``zip`` in :func:`_leaf_values`
_TRANSPOSE_CHUNK = 32


def _leaf_values(leaves: list[Leaf]) -> tuple[list, list]:
    """``(paths, columns)``: the ``path`` of every leaf, and the values of the
    :data:`_LEAF_COLUMN_NAMES` fields of ``leaves``, one new list per column in that order.

    ``zip`` transposes the leaf tuples (about four times as fast as reading the
    attributes), :data:`_TRANSPOSE_CHUNK` leaves at a time: ``zip(*leaves)`` holds one
    iterator per leaf until it ends, objects the garbage collector counts as allocations,
    and a batch of 500 leaves then started a young collection in most flushes (1.75 of
    the 3.45 per step of the encoder benchmark at L1, ~0.4 ms each).

    Raises:
        ValueError: ``leaves`` holds something of another length than a :class:`Leaf`.
        TypeError: ``leaves`` holds something that is not iterable.
    """
    fields: list[list] = [[] for _ in LEAF_FIELDS]
    for start in range(0, len(leaves), _TRANSPOSE_CHUNK):
        chunk = tuple(zip(*leaves[start:start + _TRANSPOSE_CHUNK], strict=True))
        if len(chunk) != len(LEAF_FIELDS):
            raise ValueError(f"log writer: a leaf record has {len(chunk)} fields, not {len(LEAF_FIELDS)}")
        for column, values in zip(fields, chunk):
            column += values
    return fields[_PATH_INDEX], [fields[i] for i in _LEAF_COLUMN_INDEX]

_COMPACT = (",", ":")

#: (name, type) of every log column, in schema order (iterating ``LOG_SCHEMA`` makes new
#: Field objects each time)
_COLUMNS = tuple((field.name, field.type) for field in S.LOG_SCHEMA)
#: all-null columns of a few rows, by (column name, rows): immutable arrays, shared by every
#: writer (a flush of a lone marker, at start() and step(), leaves 28 of 34 columns empty)
_NULLS: dict[tuple[str, int], pa.Array] = {}


def _null_column(name: str, arrow_type: pa.DataType, n: int) -> pa.Array:
    """An all-null array of ``n`` rows for the log column ``name`` of type ``arrow_type``:
    ``pa.nulls``, which writes the same IPC bytes as ``pa.array`` of Nones for every column
    type but list<string> (``frames``, which gets ``pa.array`` of Nones); cached for ``n``
    up to 8."""
    key = (name, n)
    array = _NULLS.get(key)
    if array is None:
        array = pa.array([None] * n, type=arrow_type) if name == S.FRAMES else pa.nulls(n, arrow_type)
        if n <= 8:
            _NULLS[key] = array
    return array


def _stop_syncer(syncer: BackgroundFsync, pid: int) -> None:
    """Let ``syncer``'s thread end (a writer garbage-collected without :meth:`LogWriter.close`);
    nothing in a forked child (the thread and its lock are the parent's)."""
    if os.getpid() == pid:
        syncer.stop(join=False)


def _flush_timer(ref: "weakref.ref[LogWriter]", stop: threading.Event, interval: float) -> None:
    """Body of a writer's flush-timer thread (see the module docstring): every time it
    wakes, :meth:`LogWriter._timer_tick` flushes rows older than ``interval`` (unit: s) and
    says how long to sleep. Ends when ``stop`` is set, the writer was collected, or the tick
    says so (closed, failed)."""
    wait: Optional[float] = interval
    while not stop.wait(min(wait, threading.TIMEOUT_MAX)):
        writer = ref()
        if writer is None:
            return
        wait = writer._timer_tick()
        del writer  # no strong reference while sleeping: a dropped writer is collected
        if wait is None:
            return


def _stop_timer(stop: threading.Event) -> None:
    """Let a flush-timer thread end (a writer garbage-collected without :meth:`LogWriter.close`)."""
    stop.set()


def _forget_in_child(ref: "weakref.ref[LogWriter]") -> None:
    """After ``fork()``, in the child: a fresh lock (another thread of the parent, the flush
    timer for one, may have held it mid-flush) and no pending rows (the child writes none)."""
    writer = ref()
    if writer is not None:
        writer._forget_in_child()


def _open_private(path: str) -> BinaryIO:
    """Create ``path`` exclusively with mode 0o640 (umask-independent), open for writing."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise


class LogWriter:
    """Appends calls, stacks and markers of one rank to an Arrow IPC stream log.

    Args:
        dump_path: the dump directory; the log goes to ``{dump_path}/.msprobe/log/``
            (directories created with mode 0o750, the file with 0o640, lazily at the
            first flush: nothing is created before rows exist).
        rank: global rank written into every row (column ``rank``).
        flush_rows: flush when this many rows are pending (unit: rows; a call with
            ``k`` leaves is ``1 + k`` rows). Must be >= 1.
        flush_interval_s: flush pending rows once this long has passed since the last
            flush (unit: s): on an append, and on the flush timer's thread when no append
            comes (see the module docstring; 0: every append flushes, no thread). Must be
            >= 0.
        compression: IPC buffer compression, None (default), ``"lz4"`` or ``"zstd"``.
            Statistics rows take about 265 bytes uncompressed, 68 with lz4, 36 with zstd
            (which costs about 3 us more per row at flush). Readers need no option. The
            recorder passes the ``MSPROBE_LOG_COMPRESSION`` setting
            (:func:`store.log_names.log_compression`, default ``"lz4"``).
        owner_pid: the process whose records these are, written into the log file's name
            (default: this process; the writer process of :mod:`store.writer_process`
            names its log after the training process it serves).
        segment_bytes: end the log file at a step's end once it holds at least this many
            bytes (unit: bytes; with ``compression``, the bytes of its batches before
            compression, so a segment holds the same rows, and a reader decompresses it
            into about as much memory, as an uncompressed one; see Segments in the module
            docstring; None or 0: one file for the writer's life). Must be >= 0.
        _open: test seam; ``_open(path) -> binary file object`` creates the log file.

    Raises:
        ValueError: ``flush_rows < 1``, ``flush_interval_s < 0``, ``segment_bytes < 0`` or
            an unknown ``compression``.

    Example::

        with LogWriter("/tmp/dump", rank=0) as writer:
            seq = writer.append(Call(step=0, kind="api_forward", name="Torch.add.0.forward",
                                     api_type="Torch", keys=("output",), leaves=(...)))
            rows = writer.take_step(0)   # the rows of step 0 (for the step's files)
    """

    def __init__(
        self,
        dump_path: Union[str, os.PathLike],
        rank: int,
        *,
        flush_rows: int = 512,
        flush_interval_s: float = 0.5,
        compression: Optional[Literal["lz4", "zstd"]] = None,
        owner_pid: Optional[int] = None,
        segment_bytes: Optional[int] = None,
        _open: Optional[Callable[[str], BinaryIO]] = None,
    ) -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(
                f"compression: got {compression!r}; allowed: {', '.join(map(repr, COMPRESSIONS))}"
            )
        if int(flush_rows) < 1:
            raise ValueError(f"flush_rows: got {flush_rows!r}; allowed: an int >= 1")
        if not float(flush_interval_s) >= 0:
            raise ValueError(f"flush_interval_s: got {flush_interval_s!r}; allowed: a float >= 0")
        if segment_bytes is not None and not int(segment_bytes) >= 0:
            raise ValueError(f"segment_bytes: got {segment_bytes!r}; allowed: None or an int >= 0")
        self._segment_bytes = int(segment_bytes or 0)
        self._file_bytes = 0  # bytes of the current log file (its batches before IPC compression)
        self._paths: list[Path] = []  # every log file (segment) this writer opened, in order
        self._repeated_stacks = 0  # pending stack rows that only repeat stacks for a new segment
        self._log_dir = Path(dump_path) / S.STORE_DIR / S.LOG_DIR
        self._rank = int(rank)
        self._flush_rows = int(flush_rows)
        self._flush_interval_s = float(flush_interval_s)
        self._open = _open if _open is not None else _open_private
        self._compression = compression
        self._owner_pid = owner_pid
        self._lock = threading.Lock()
        self._seq = 0
        # pending records, turned into columns at flush
        self._calls: list[Call] = []
        self._call_seqs: list[int] = []
        self._leaves: list[Leaf] = []
        self._leaf_owner: list[int] = []  # index into self._calls
        self._new_stacks: list[Stack] = []
        self._markers: list[Marker] = []
        self._marker_seqs: list[int] = []
        self._marker_meta: list[str] = []
        self._pending_rows = 0
        self._last_flush = time.monotonic()
        # state kept across flushes
        self._stacks: dict[int, tuple[str, ...]] = {}
        self._retained: list[_Part] = []  # flushed, not yet taken (see take_step)
        self._keys_text: dict[tuple[str, ...], str] = {}
        self._path_text: dict[tuple, tuple[str, str]] = {}
        self._path: Optional[Path] = None
        self._file: Optional[BinaryIO] = None
        self._sealer: Optional[MessageSealer] = None  # serialises checksummed batch messages
        self._syncer = BackgroundFsync("msprobe-log-fsync")  # background step-end fsync
        # a writer dropped without close(): its helper thread ends too (not in a forked child)
        weakref.finalize(self, _stop_syncer, self._syncer, os.getpid()).atexit = False
        self._failed = False
        self._closed = False
        self._pid = os.getpid()  # a forked child never writes (see the module docstring)
        self._timer_error: Optional[StoreWriteError] = None  # a fault of the flush timer, not yet raised
        self._timer_stop = threading.Event()
        self._timer: Optional[threading.Thread] = None
        if 0 < self._flush_interval_s < float("inf"):
            timer = threading.Thread(target=_flush_timer, name="msprobe-log-flush", daemon=True,
                                     args=(weakref.ref(self), self._timer_stop, self._flush_interval_s))
            try:
                timer.start()
                self._timer = timer
            except RuntimeError:  # no thread left: flushes happen on appends only
                pass
            weakref.finalize(self, _stop_timer, self._timer_stop).atexit = False
        os.register_at_fork(after_in_child=functools.partial(_forget_in_child, weakref.ref(self)))

    # --- properties ------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """The rank written into every row."""
        return self._rank

    @property
    def path(self) -> Optional[Path]:
        """The log file, or None before the first flush created it."""
        return self._path

    @property
    def paths(self) -> tuple[Path, ...]:
        """Every log file (segment) this writer opened, in order."""
        return tuple(self._paths)

    @property
    def failed(self) -> bool:
        """True after a write fault: every further call is a no-op."""
        return self._failed

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    # --- appending -------------------------------------------------------------------
    def append(self, call: Call) -> int:
        """Append one call and its leaves; returns the call's ``seq``.

        ``seq`` counts from 0 per log file (segment), shared with markers (stacks take none).
        Returns -1 (and records nothing) once the writer has failed or is closed.

        Raises:
            StoreWriteError: a flush triggered by this append failed (once per writer).
            TypeError: ``call.leaves`` is one :class:`Leaf` (itself a tuple of its fields)
                instead of a tuple of leaves; nothing is recorded.
        """
        leaves = call.leaves
        if leaves.__class__ is Leaf:
            raise TypeError(f"log writer: call {call.name!r}: leaves is one Leaf, not a tuple of leaves "
                            "(write leaves=(leaf,))")
        with self._lock:
            if self._failed or self._closed:
                self._raise_timer_error()
                return -1
            seq = self._seq
            self._seq = seq + 1
            index = len(self._calls)
            self._calls.append(call)
            self._call_seqs.append(seq)
            if leaves:
                self._leaves.extend(leaves)
                self._leaf_owner.extend([index] * len(leaves))
            self._pending_rows += 1 + len(leaves)
            self._maybe_flush()
            return seq

    def append_stack(self, stack: Stack) -> None:
        """Append an interned stack (row ``stack``, ``step = seq = -1``) unless this
        writer already has its ``stack_id`` (a new segment repeats every stack the writer
        has, see Segments in the module docstring).

        Raises:
            StoreWriteError: a flush triggered by this append failed (once per writer).
        """
        with self._lock:
            if self._failed or self._closed or stack.stack_id in self._stacks:
                self._raise_timer_error()
                return
            self._stacks[stack.stack_id] = tuple(stack.frames)
            self._new_stacks.append(stack)
            self._pending_rows += 1
            self._maybe_flush()

    def append_marker(self, marker: Marker) -> int:
        """Append a session marker; ``meta`` is stored as compact JSON text (values JSON
        cannot represent are written as ``str(value)``). Returns its ``seq`` (-1 once
        failed or closed).

        Raises:
            StoreWriteError: a flush triggered by this append failed (once per writer).
        """
        with self._lock:
            if self._failed or self._closed:
                self._raise_timer_error()
                return -1
            seq = self._seq
            self._seq = seq + 1
            self._markers.append(marker)
            self._marker_seqs.append(seq)
            self._marker_meta.append(json.dumps(marker.meta, separators=_COMPACT, default=str))
            self._pending_rows += 1
            self._maybe_flush()
            return seq

    # --- flushing --------------------------------------------------------------------
    def flush(self, fsync: bool = False, *, background: bool = False) -> None:
        """Write pending rows as one record batch and flush the file object.

        Args:
            fsync: also ``os.fsync`` the log file (step end).
            background: with ``fsync``, run the fsync on the writer's helper thread
                (:class:`store.bg_fsync.BackgroundFsync`, through a duplicate of the file
                descriptor) and return at once; the next background fsync and
                :meth:`close` wait for it and raise its failure. Where no descriptor or
                thread can be had (``EMFILE``, no thread left), the fsync is done here.
        Raises:
            StoreWriteError: the write failed (once per writer; no-op afterwards).
        """
        with self._lock:
            if self._failed or self._closed:
                self._raise_timer_error()
                return
            self._flush_locked(fsync and not background)
            if fsync and background and self._file is not None and os.getpid() == self._pid:
                self._join_sync()
                fd = -1
                try:
                    fd = os.dup(self._file.fileno())
                    self._syncer.submit(fd)
                    return
                except (OSError, RuntimeError):  # no descriptor or no helper thread left
                    if fd >= 0:
                        os.close(fd)
                try:  # then the fsync is done here, as without ``background``
                    os.fsync(self._file.fileno())
                except OSError as exc:
                    raise self._fail(exc, "syncing") from exc

    def _join_sync(self) -> None:
        """Wait for the background fsync; raise its failure (StoreWriteError, once)."""
        error = self._syncer.wait()
        if error is not None:
            raise self._fail(error, "syncing")

    def take_step(self, step: Optional[int] = None, *, fsync: bool = False) -> pa.Table:
        """Flush, then return and forget the rows of ``step`` written by this writer.

        The writer keeps every flushed call, leaf and marker row in memory until it is
        taken (statistics rows only, small). Stack rows are not returned: use
        :meth:`stacks`. Together they are what :func:`store.export.export_step` needs, so
        live and offline export see the same rows.

        Args:
            step: the step to take; None takes the rows of every step (debug level).
            fsync: fsync the log file during the flush.
        Returns:
            A table with :data:`~store.schema.LOG_SCHEMA`: the call, leaf and marker rows
            of ``step``, in write order within each flush (the flushed batches, or the
            rows of ``step`` selected from a batch that holds other steps too: a column
            may hold several chunks).
        Raises:
            StoreWriteError: the flush failed (once per writer). The rows stay retained:
                call ``take_step`` again to get them.
        """
        with self._lock:
            if self._failed or self._closed:
                self._raise_timer_error()
            else:
                self._flush_locked(fsync)
            tables = [part.rows() for part in self._split_retained(step)]
        return pa.concat_tables(tables) if tables else S.LOG_SCHEMA.empty_table()

    def drop_step_rows(self, step: int) -> None:
        """Forget the retained rows of ``step`` without handing them out: the caller is done
        with the step (its last :meth:`take_step` came before rows that were flushed
        later, such as the ``step_end`` marker, which would otherwise stay retained for the
        writer's life: one small batch per step). Pending rows are not flushed; nothing is
        written.

        Args:
            step: the step whose retained rows are forgotten (rows of other steps, also in
                the same flushed batch, are kept).
        Raises:
            TypeError: ``step`` is not an integer (None included).
        """
        with self._lock:
            self._split_retained(int(step))

    def _split_retained(self, step: Optional[int]) -> list["_Part"]:
        """Remove the rows of ``step`` (every step when None) from the retained parts and
        return them, as parts in flush order; under ``_lock``."""
        taken, kept = [], []
        for part in self._retained:
            mine, other = part.split(step)
            if mine is not None:
                taken.append(mine)
            if other is not None:
                kept.append(other)
        self._retained = kept
        return taken

    def end_segment_if_due(self) -> bool:
        """End the current log file if it holds at least ``segment_bytes`` bytes (see
        Segments in the module docstring). Call at a step's end, after the step's rows were
        taken (:meth:`take_step`, :meth:`drop_step_rows`): a file is ended only when no row
        is pending or retained, so a step never spans two files. Returns whether it ended
        one.

        Raises:
            StoreWriteError: flushing, syncing or closing the file failed (once per writer).
        """
        with self._lock:
            if (self._failed or self._closed or not self._segment_bytes or self._file is None
                    or self._file_bytes < self._segment_bytes or self._pending_rows or self._retained
                    or os.getpid() != self._pid):
                return False
            self._join_sync()
            self._end_file("ending the segment", fsync=True)
            self._file_bytes = 0
            self._seq = 0
            # the next segment repeats every stack (written with its first batch)
            self._new_stacks = [Stack(stack_id=k, frames=v) for k, v in self._stacks.items()]
            self._repeated_stacks = len(self._new_stacks)
            self._pending_rows = self._repeated_stacks
            return True

    def stacks(self) -> dict[int, tuple[str, ...]]:
        """Every stack appended to this writer so far: ``{stack_id: frames}``."""
        with self._lock:
            return dict(self._stacks)

    def close(self) -> None:
        """Flush with fsync, end the stream and close the file. Idempotent.

        Raises:
            StoreWriteError: the final write failed, or the flush timer's did and was not
                raised yet (only if no fault was raised before).
        """
        try:
            self._close()
        finally:
            self._join_timer()  # after the lock is released: its last tick may wait for it

    def _close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._timer_stop.set()
            if os.getpid() != self._pid:  # a forked child: the helper threads are the parent's
                return
            if self._failed:
                self._syncer.stop()
                self._raise_timer_error()
                return
            try:
                self._join_sync()
            finally:
                self._syncer.stop()
            self._flush_locked(True)
            self._end_file("closing", fsync=False)   # the flush fsynced the rows

    def _end_file(self, doing: str, *, fsync: bool) -> None:
        """Write the end-of-stream marker (when a stream was opened), flush, fsync with
        ``fsync``, and close the current log file; under ``_lock``.

        Raises:
            StoreWriteError: any of it failed (``doing`` names the operation).
        """
        try:
            if self._sealer is not None:
                self._file.write(END_OF_STREAM)
            if self._file is not None:
                self._file.flush()
                if fsync:
                    os.fsync(self._file.fileno())
                self._file.close()
        except Exception as exc:  # noqa: BLE001 - any fault becomes one StoreWriteError
            raise self._fail(exc, doing) from exc
        finally:
            self._sealer = None
            self._file = None

    def __enter__(self) -> "LogWriter":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # --- internals -------------------------------------------------------------------
    def _join_timer(self) -> None:
        """Wait for the flush timer's thread to end (after ``_timer_stop`` was set)."""
        timer = self._timer
        if timer is not None and timer is not threading.current_thread():
            timer.join()

    def _timer_tick(self) -> Optional[float]:
        """One wake-up of the flush timer: flush the pending rows if the last flush is at
        least ``flush_interval_s`` old. Returns the seconds until the next check, or None
        when the thread should end (closed, failed, a forked child's copy). A fault is kept
        for the next call into the writer to raise (:meth:`_raise_timer_error`)."""
        with self._lock:
            if self._closed or self._failed or os.getpid() != self._pid:
                return None
            due = self._last_flush + self._flush_interval_s - time.monotonic()
            if due > 0:
                return due
            if self._pending_rows:
                try:
                    self._flush_locked(False)
                except StoreWriteError as exc:
                    self._timer_error = exc
                    return None
            return self._flush_interval_s

    def _raise_timer_error(self) -> None:
        """Raise the flush timer's fault if it was not raised yet (under ``_lock``)."""
        error, self._timer_error = self._timer_error, None
        if error is not None:
            raise error

    def _forget_in_child(self) -> None:
        """See :func:`_forget_in_child` (in a forked child only)."""
        self._lock = threading.Lock()
        self._timer = None
        self._calls, self._call_seqs, self._leaves, self._leaf_owner = [], [], [], []
        self._new_stacks = []
        self._markers, self._marker_seqs, self._marker_meta = [], [], []
        self._pending_rows = 0

    def _maybe_flush(self) -> None:
        if (
            self._pending_rows >= self._flush_rows
            or time.monotonic() - self._last_flush >= self._flush_interval_s
        ):
            self._flush_locked(False)

    def _flush_locked(self, fsync: bool) -> None:
        self._last_flush = time.monotonic()
        if os.getpid() != self._pid:  # forked child: the file belongs to the parent
            if self._pending_rows:
                self._build_batch()  # drops the child's rows
            return
        if self._file is None and self._repeated_stacks and self._pending_rows == self._repeated_stacks:
            return  # only the stacks a new segment repeats: the segment opens with its first row
        try:
            part = self._build_batch() if self._pending_rows else None
        except Exception as exc:  # noqa: BLE001 - a record Arrow cannot convert
            raise self._fail(exc, "converting records") from exc
        try:
            if part is not None:
                self._retained.append(part)
                if self._sealer is None:
                    self._open_stream()
                self._repeated_stacks = 0
                message = self._sealer.seal(part.batch)
                try:
                    self._file.write(message)
                    # segments are sized by the rows' bytes before compression (the
                    # memory a reader decompresses a file into)
                    self._file_bytes += message.nbytes if self._compression is None else part.batch.nbytes
                finally:
                    message.release()
            if self._file is not None:
                self._file.flush()
                if fsync:
                    os.fsync(self._file.fileno())
                if os.fstat(self._file.fileno()).st_nlink == 0:
                    raise FileNotFoundError(errno.ENOENT, "the log file was deleted while being written")
        except Exception as exc:  # noqa: BLE001 - disk full, permission lost, ...
            raise self._fail(exc, "writing") from exc

    def _open_stream(self) -> None:
        make_dirs(self._log_dir, own_levels=2)
        path = self._log_dir / log_file_name(self._rank, self._owner_pid or os.getpid(), time.time_ns())
        self._file = self._open(str(path))
        self._path = path
        self._paths.append(path)
        header = schema_message()
        self._file.write(header)
        self._file_bytes = len(header)
        self._sealer = MessageSealer(self._compression)

    def _fail(self, exc: BaseException, doing: str) -> StoreWriteError:
        self._failed = True
        self._syncer.stop(join=False)  # no more background fsyncs: the thread ends
        self._timer_stop.set()  # nor timed flushes
        try:
            if self._file is not None:
                self._file.close()
        except Exception:  # noqa: BLE001 - already failing; the first error is reported
            pass
        self._sealer = None
        self._file = None
        where = self._path if self._path is not None else self._log_dir
        return StoreWriteError(
            f"msprobe log writer (rank {self._rank}) failed while {doing} {where}: "
            f"{type(exc).__name__}: {exc}; recording to the log stops, rows flushed before "
            "stay readable"
        )

    def _path_columns(self, path: tuple) -> tuple[str, str]:
        cached = self._path_text.get(path)
        if cached is None:
            cached = (
                json.dumps(list(path), separators=_COMPACT),
                ".".join(str(part) for part in path),
            )
            self._path_text[path] = cached
        return cached

    def _paths_columns(self, paths: list[tuple]) -> list[tuple[str, str]]:
        """:meth:`_path_columns` of every leaf path (cache hits without a call each)."""
        get = self._path_text.get
        try:
            return [get(path) or self._path_columns(path) for path in paths]
        except TypeError:  # an unhashable path (a list): key the cache by its tuple
            return [self._path_columns(tuple(path)) for path in paths]

    def _keys_column(self, keys: tuple[str, ...]) -> str:
        cached = self._keys_text.get(keys)
        if cached is None:
            cached = json.dumps(list(keys), separators=_COMPACT)
            self._keys_text[keys] = cached
        return cached

    def _build_batch(self) -> "_Part":
        """Turn the pending records into one record batch (rows: calls, leaves, stacks,
        markers) and clear them."""
        calls, call_seqs = self._calls, self._call_seqs
        leaves, owner = self._leaves, self._leaf_owner
        stacks = self._new_stacks
        markers, marker_seqs, marker_meta = self._markers, self._marker_seqs, self._marker_meta
        self._calls, self._call_seqs, self._leaves, self._leaf_owner = [], [], [], []
        self._new_stacks = []
        self._markers, self._marker_seqs, self._marker_meta = [], [], []
        self._pending_rows = 0

        nc, nl, ns, nm = len(calls), len(leaves), len(stacks), len(markers)
        n = nc + nl + ns + nm
        steps = frozenset(m.step for m in markers).union(c.step for c in calls)  # leaves: their calls' steps
        owners = [calls[i] for i in owner]

        # the values of the call rows and of the leaf rows, one list per column; padded with
        # None into the batch's columns
        call_cols: dict[str, list] = {
            S.STEP: [c.step for c in calls],
            S.SEQ: call_seqs,
            S.KIND: [c.kind for c in calls],
            S.NAME: [c.name for c in calls],
            S.API_TYPE: [c.api_type for c in calls],
            S.PARENT: [c.parent for c in calls],
            S.IS_RECOMPUTE: [c.is_recompute for c in calls],
            S.KEYS: [self._keys_column(tuple(c.keys)) for c in calls],
            S.STACK_ID: [c.stack_id for c in calls],
        }
        leaf_cols: dict[str, list] = {
            S.STEP: [c.step for c in owners],
            S.SEQ: [call_seqs[i] for i in owner],
            S.KIND: [c.kind for c in owners],
            S.NAME: [c.name for c in owners],
            S.API_TYPE: [c.api_type for c in owners],
        }
        if nl:
            leaf_paths, leaf_columns = _leaf_values(leaves)
            paths = self._paths_columns(leaf_paths)
            leaf_cols[S.PATH] = [p[0] for p in paths]
            leaf_cols[S.ARG] = [p[1] for p in paths]
            leaf_cols.update(zip(_LEAF_COLUMN_NAMES, leaf_columns))
        stack_cols: dict[str, list] = {
            S.STEP: [-1] * ns, S.SEQ: [-1] * ns, S.STACK_ID: [s.stack_id for s in stacks],
            S.FRAMES: [list(s.frames) for s in stacks],
        }
        marker_cols: dict[str, list] = {
            S.STEP: [m.step for m in markers], S.SEQ: marker_seqs, S.KIND: [m.kind for m in markers],
            S.META: marker_meta,
        }
        sections = ((call_cols, nc), (leaf_cols, nl), (stack_cols, ns), (marker_cols, nm))
        arrays = []
        for name, arrow_type in _COLUMNS:
            if name == S.RANK:
                values = [self._rank] * n
            elif name == S.ROW:
                values = [S.ROW_CALL] * nc + [S.ROW_LEAF] * nl + [S.ROW_STACK] * ns + [S.ROW_MARKER] * nm
            else:
                present = [rows[name] for rows, count in sections if count and name in rows]
                if all(map(all_none, present)):
                    arrays.append(_null_column(name, arrow_type, n))
                    continue
                values = []
                for rows, count in sections:
                    if count:
                        values += rows[name] if name in rows else [None] * count
            arrays.append(pa.array(values, type=arrow_type))
        batch = pa.RecordBatch.from_arrays(arrays, schema=S.LOG_SCHEMA)
        return _Part(batch, nc + nl, ns, steps)


def all_none(values: list) -> bool:
    """True when every item of the non-empty list ``values`` is None (the ends first: cheap
    for a column with values)."""
    return values[0] is None and values[-1] is None and values.count(None) == len(values)


class _Part:
    """One flushed batch kept for :meth:`LogWriter.take_step`: its rows are ``entry_rows``
    call and leaf rows, ``ns`` stack rows, then marker rows; ``steps``: the steps of its
    call, leaf and marker rows."""

    __slots__ = ("batch", "entry_rows", "ns", "steps")

    def __init__(self, batch: pa.RecordBatch, entry_rows: int, ns: int, steps: frozenset) -> None:
        self.batch, self.entry_rows, self.ns, self.steps = batch, entry_rows, ns, steps

    def rows(self) -> pa.Table:
        """The call, leaf and marker rows of the batch (stack rows left out), in order."""
        batch, cut = self.batch, self.entry_rows
        if not self.ns:
            return pa.Table.from_batches([batch])
        tail = cut + self.ns
        return pa.Table.from_batches([batch.slice(0, cut), batch.slice(tail, batch.num_rows - tail)])

    def split(self, step: Optional[int]) -> tuple[Optional["_Part"], Optional["_Part"]]:
        """``(taken, kept)``: parts holding the non-stack rows of ``step`` (every step when
        None) and the other non-stack rows, each None when there is none."""
        if self.batch.num_rows == self.ns:
            return None, None
        if step is None or self.steps == {int(step)}:
            return self, None
        if int(step) not in self.steps:
            return None, self
        rows = self.rows()
        take = arrow_np.values(rows.column(S.STEP)) == int(step)
        return (self._subset(rows, take, frozenset({int(step)})),
                self._subset(rows, ~take, self.steps - {int(step)}))

    @staticmethod
    def _subset(rows: pa.Table, mask: np.ndarray, steps: frozenset) -> "_Part":
        table = arrow_np.select(rows, mask).combine_chunks()
        batches = table.to_batches()
        batch = batches[0] if batches else pa.RecordBatch.from_pylist([], schema=S.LOG_SCHEMA)
        return _Part(batch, batch.num_rows, 0, steps)
