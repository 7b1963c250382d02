"""The training process's end of the writer process (:mod:`store.writer_process`).

:class:`WriterClient` takes the records a session emits, keeps them as plain tuples and
hands them to the rank's writer process in frames (at ``flush_rows`` rows, after
``flush_interval_s``, and at every export request), through a pipe. On the training thread
a record costs a tuple and a list append; a frame costs one ``pickle.dumps`` and one pipe
write. The writer process builds the Arrow log and writes the step files.

Guarantees:

* **Bounded memory, back-pressure.** Frames not yet acknowledged by the writer process
  (written to its log) are kept, at most ``max_unacked`` of them; past that, the sender
  waits for the writer process.
* **Writer process gone** (killed, crashed, never started): the first call that notices
  raises :class:`WriterGone` with every message the writer process had not acknowledged,
  in order, so that the caller writes them itself; nothing handed over before is lost
  (what the writer acknowledged is in its log file).
* **Write faults** of the writer process (disk full, permission lost) are raised once, as
  :class:`store.errors.StoreWriteError`, by the next call.
* **Training process killed**: the writer process reads to the end of its input and
  closes the log; what was handed over (at most ``flush_interval_s`` old) is kept.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Optional, Union

from store.errors import StoreWriteError
from store.records import Call, Marker, Stack
from store.writer_process import CALL, END_STEP, EXPORT, HELLO, MARKER, PROTOCOL, QUIT, STACK, SYNC, encode_frame

__all__ = ["WriterClient", "WriterGone", "writer_command"]

_STORE_ROOT = str(Path(__file__).resolve().parent.parent)  # the directory holding package ``store``


def writer_command() -> list[str]:
    """The writer process's command line: this interpreter in isolated mode (``-I``: no
    current directory, ``PYTHON*`` variables or user site on its path, so that a ``store``
    package of the user's cannot stand in for this one), importing ``store`` from where
    this process imported it."""
    code = (f"import sys; sys.path.insert(0, {_STORE_ROOT!r}); "
            "from store.writer_process import main; main()")
    return [sys.executable, "-I", "-c", code]


class WriterGone(Exception):
    """The writer process ended without being asked to.

    Attributes:
        messages: the messages it had not acknowledged, in order (see
            :mod:`store.writer_process` for their form).
        status: its exit status (None when unknown).
    """

    def __init__(self, messages: list, status: Optional[int]) -> None:
        super().__init__(f"the msprobe writer process ended (exit status {status})")
        self.messages = messages
        self.status = status


def _timer(ref: "weakref.ref[WriterClient]", stop: threading.Event, interval: float) -> None:
    while not stop.wait(interval):
        client = ref()
        if client is None:
            return
        client._tick()
        del client


def _read_answers(ref: "weakref.ref[WriterClient]", stream) -> None:
    for raw in stream:
        client = ref()
        if client is None:
            return
        client._answer(raw.decode("utf-8", "replace").rstrip("\n"))
        del client
    client = ref()
    if client is not None:
        client._answer(None)


class WriterClient:
    """Hands one rank's records to a writer process it starts.

    Args:
        dump_path: the dump directory (the writer process writes the log and the step files there).
        rank: the global rank.
        flush_rows: rows per frame (a call with ``k`` leaves is ``1 + k`` rows). Must be >= 1.
        flush_interval_s: a frame is sent at most this long after its first record (unit: s;
            the bound on what a killed training process loses). Must be > 0.
        max_unacked: frames handed over but not yet written that are kept (back-pressure
            beyond). Must be >= 1.
        segment_bytes: the writer process's log segment size (unit: bytes; 0: one log file;
            :class:`store.log_writer.LogWriter`). Must be >= 0.
        compression: the writer process's log IPC compression: None, ``"lz4"`` or
            ``"zstd"`` (:class:`store.log_writer.LogWriter`).
        command: the writer process's command line (default: :func:`writer_command`; a
            test seam).

    Raises:
        ValueError: an argument out of range.
        WriterGone: the writer process could not be started (``messages`` empty).
    """

    def __init__(self, dump_path: Union[str, os.PathLike], rank: int, *, flush_rows: int = 512,
                 flush_interval_s: float = 0.5, max_unacked: int = 64, segment_bytes: int = 0,
                 compression: Optional[str] = None, command: Optional[list] = None) -> None:
        if (int(flush_rows) < 1 or not float(flush_interval_s) > 0 or int(max_unacked) < 1
                or int(segment_bytes) < 0 or compression not in (None, "lz4", "zstd")):
            raise ValueError(f"WriterClient: flush_rows={flush_rows!r} (>= 1), flush_interval_s="
                             f"{flush_interval_s!r} (> 0), max_unacked={max_unacked!r} (>= 1), "
                             f"segment_bytes={segment_bytes!r} (>= 0), compression={compression!r} "
                             f"(None, 'lz4', 'zstd')")
        self._segment_bytes = int(segment_bytes)
        self._compression = compression
        self._flush_rows = int(flush_rows)
        self._interval = float(flush_interval_s)
        self._max_unacked = int(max_unacked)
        self._lock = threading.Lock()
        self._answered = threading.Condition(self._lock)
        self._pending: list = []
        self._rows = 0
        self._first = 0.0  # monotonic time of the oldest pending record
        self._sent = 0  # frames sent (after the hello)
        self._acked = 0
        self._unacked: list[tuple[int, list]] = []  # (frame number, messages)
        self._synced: set = set()
        self._tokens = 0
        self._fault: Optional[str] = None
        self._fault_raised = False
        self._gone = False
        self._closed = False
        self._pid = os.getpid()
        try:
            self._proc = subprocess.Popen(command or writer_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self._proc.stdin.write(encode_frame([(HELLO, PROTOCOL, {
                "dump_path": os.fspath(dump_path), "rank": int(rank), "owner_pid": os.getpid(),
                "flush_interval_s": self._interval, "segment_bytes": self._segment_bytes,
                "compression": self._compression})]))
            self._proc.stdin.flush()
        except (OSError, ValueError) as exc:
            raise WriterGone([], None) from exc
        _widen_pipe(self._proc.stdin)
        ref = weakref.ref(self)
        self._reader = threading.Thread(target=_read_answers, args=(ref, self._proc.stdout),
                                        name="msprobe-writer-answers", daemon=True)
        self._reader.start()
        self._stop = threading.Event()
        threading.Thread(target=_timer, args=(ref, self._stop, self._interval / 2),
                         name="msprobe-writer-frames", daemon=True).start()
        weakref.finalize(self, _abandon, self._proc, self._stop, self._pid).atexit = False

    # --- records ------------------------------------------------------------------------
    def append(self, call: Call) -> None:
        """Hand over one call with its leaves.

        Raises:
            WriterGone: the writer process ended (see the class docstring); its
                ``messages`` end with this call.
            StoreWriteError: the writer process failed to write (once).
        """
        with self._lock:
            leaves = call.leaves  # as plain tuples: pickled without a Python-level __reduce__ per leaf
            # store.writer_process.CALL_FIELDS, written out: attrgetter(*CALL_FIELDS) costs
            # 0.1-0.2 us more per call on the training thread (tests/store/test_field_table.py)
            self._add((CALL, call.step, call.kind, call.name, call.api_type, call.parent, call.stack_id,
                       call.is_recompute, call.keys, tuple(map(tuple, leaves))), 1 + len(leaves))
            if self._rows >= self._flush_rows:
                self._send()

    def append_stack(self, stack: Stack) -> None:
        """Hand over an interned stack (raises as :meth:`append`)."""
        with self._lock:
            self._add((STACK, stack.stack_id, tuple(stack.frames)), 1)

    def append_marker(self, marker: Marker) -> None:
        """Hand over a session marker (raises as :meth:`append`)."""
        with self._lock:
            self._add((MARKER, marker.step, marker.kind, dict(marker.meta)), 1)

    def export(self, step: int, meta: dict, emitted: bool) -> None:
        """Ask for step ``step``'s files (:meth:`store.export.StepFiles.export`), after
        every record handed over before; sent at once, not waited for (see :meth:`wait`).
        Raises as :meth:`append`."""
        self._request((EXPORT, step, dict(meta), bool(emitted)))

    def end_step(self, step: int) -> None:
        """Tell the writer process step ``step`` is over (fsync of the log, next exporter).
        Raises as :meth:`append`."""
        self._request((END_STEP, step))

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait until everything handed over so far is in the log and every step file asked
        for is written. Returns False when ``timeout`` (s) passed first.

        Raises:
            WriterGone, StoreWriteError: as :meth:`append`.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._check()
            self._tokens += 1
            token = self._tokens
            self._pending.append((SYNC, token))
            self._send()
            while token not in self._synced:
                self._check()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._answered.wait(left if left is not None else 1.0)
            self._synced.discard(token)
            self._check()
            return True

    def close(self, timeout: Optional[float] = 300.0) -> None:
        """Send what is pending, let the writer process close the log and end; wait for it
        at most ``timeout`` s (it goes on alone after that: nothing is lost). Idempotent.

        Raises:
            WriterGone: the writer process had ended before (``messages`` to write).
            StoreWriteError: it failed to write and that was not raised yet.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
            if os.getpid() != self._pid:
                return
            self._check()
            self._pending.append((QUIT,))
            self._send()
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return
        self._reader.join(timeout=5)
        with self._lock:
            self._check()  # a write fault not raised yet (a closed client is never "gone")

    @property
    def pid(self) -> int:
        """The writer process's pid."""
        return self._proc.pid

    # --- internals (under _lock unless said otherwise) ---------------------------------------
    def _add(self, message: tuple, rows: int) -> None:
        """Queue ``message``, then raise what the writer process reported (the message is
        then among :class:`WriterGone`'s, or dropped after a write fault)."""
        if not self._pending:
            self._first = time.monotonic()
        self._pending.append(message)
        self._rows += rows
        if self._gone or (self._fault is not None and not self._fault_raised):
            self._check()

    def _request(self, message: tuple) -> None:
        with self._lock:
            self._add(message, 0)
            self._send()

    def _check(self) -> None:
        if self._gone:
            raise self._gone_error()
        if self._fault is not None and not self._fault_raised:
            self._fault_raised = True
            raise StoreWriteError(f"the msprobe writer process failed: {self._fault}")

    def _gone_error(self) -> WriterGone:
        messages = [m for _, frame in self._unacked for m in frame] + self._pending
        self._unacked, self._pending, self._rows = [], [], 0
        try:
            status = self._proc.wait(1.0)
        except subprocess.TimeoutExpired:
            status = None
        return WriterGone([m for m in messages if m[0] not in (SYNC, QUIT)], status)

    def _send(self) -> None:
        if not self._pending or os.getpid() != self._pid:
            return
        while len(self._unacked) >= self._max_unacked and not self._gone:
            self._answered.wait(1.0)  # back-pressure: the writer process is behind
            if self._proc.poll() is not None:
                self._gone = True
        if self._gone:
            raise self._gone_error()
        frame, self._pending, self._rows = self._pending, [], 0
        self._sent += 1
        self._unacked.append((self._sent, frame))
        try:
            self._proc.stdin.write(encode_frame(frame))
            self._proc.stdin.flush()
        except (OSError, ValueError):  # broken pipe: the writer process is gone
            self._gone = True
            raise self._gone_error() from None

    def _tick(self) -> None:
        """Flush timer (its own thread): send pending records older than the interval. A
        writer process found gone here is reported by the next call from the session."""
        if not self._lock.acquire(timeout=self._interval):
            return
        try:
            if self._pending and not self._closed and time.monotonic() - self._first >= self._interval:
                try:
                    self._send()
                except WriterGone as gone:  # keep the messages for the next call to raise
                    self._pending = gone.messages
                    self._gone = True
        finally:
            self._lock.release()

    def _answer(self, line: Optional[str]) -> None:
        """One answer line of the writer process (reader thread); None at its end."""
        with self._lock:
            if line is None:
                if not self._closed:
                    self._gone = True
            elif line.startswith("A "):
                self._acked = int(line[2:])
                while self._unacked and self._unacked[0][0] <= self._acked:
                    self._unacked.pop(0)
            elif line.startswith("W "):
                self._synced.add(int(line[2:]))
            elif line.startswith("F "):
                self._fault = line[2:]
            self._answered.notify_all()


_F_SETPIPE_SZ = 1031  # Linux fcntl: set a pipe's capacity


def _widen_pipe(stream) -> None:
    """Give the pipe to the writer process 1 MiB of room (Linux; the default 64 KiB holds
    less than one frame, so each write would wait for the writer process to take the
    previous frame). Elsewhere, or where refused, the pipe stays as it is."""
    try:
        import fcntl

        fcntl.fcntl(stream.fileno(), _F_SETPIPE_SZ, 1 << 20)
    except (ImportError, OSError, ValueError):
        pass


def _abandon(proc: subprocess.Popen, stop: threading.Event, pid: int) -> None:
    """A client dropped without :meth:`WriterClient.close`: close the pipe, so that the writer
    process closes the log and ends on its own."""
    stop.set()
    if os.getpid() == pid:
        try:
            proc.stdin.close()
        except OSError:
            pass
