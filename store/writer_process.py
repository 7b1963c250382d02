"""The writer process: one per rank, behind the training process (design.md, Data flow).

Started by :class:`store.writer_client.WriterClient` (the command line:
:func:`store.writer_client.writer_command`).
It reads the records the training process hands over on its standard input, appends them
to the rank's Arrow log (:class:`store.log_writer.LogWriter`, the log file named after the
training process) and writes each step's files (:class:`store.export.StepFiles`) when
the training process asks for them at ``stop()`` and ``step()``. Everything the training
thread used to do after building a record (Arrow columns, batches, CRC-32, ``dump.json``
text, file writes) happens here.

Protocol (version :data:`PROTOCOL`; both ends are the same installation, started with the
same interpreter). Standard input carries frames: a 4-byte little-endian length, then a
pickle (protocol 5) of a list of messages, each a tuple whose first item says what it is:

* ``(CALL, *fields)``: the fields of :class:`store.records.Call` in their order
  (:data:`CALL_FIELDS`: ``step, kind, name, api_type, parent, stack_id, is_recompute, keys,
  leaves``), each leaf a plain tuple of :data:`store.schema.LEAF_FIELDS`;
* ``(STACK, stack_id, frames)``, ``(MARKER, step, kind, meta)``;
* ``(EXPORT, step, meta, emitted)``: write step ``step``'s files (:meth:`StepFiles.export`);
* ``(END_STEP, step)``: the step is over (:meth:`StepFiles.end_step`);
* ``(SYNC, token)``: answer ``token`` once everything before it is done;
* ``(QUIT,)``: close the log (fsync) and exit.

The first frame holds one message, ``(HELLO, PROTOCOL, options)`` with ``options`` a dict:
``dump_path``, ``rank``, ``owner_pid``, ``flush_interval_s``, ``segment_bytes`` (0 when
absent), ``compression`` (the log's IPC compression, None when absent). Every frame is one Arrow
batch of the log (the client cuts frames at ``flush_rows`` rows or ``flush_interval_s``).

Standard output carries one line per answer: ``A {n}`` when frame ``n`` (counted from 1
after the hello) is written to the log and its files (if it asked for them) are written;
``W {token}`` for a ``SYNC``; ``F {message}`` when writing failed (the process then reads
and drops everything until ``QUIT`` or end of input, so that the training process never
blocks on it). End of input without ``QUIT`` (the training process died) closes the log
the same way: what was handed over stays in the log. ``SIGINT`` is ignored (a Ctrl-C in
the terminal reaches the whole process group; the training process decides).
"""
from __future__ import annotations

import os
import pickle
import queue
import signal
import struct
import sys
import threading
from dataclasses import fields
from typing import BinaryIO, TextIO

from store.records import Call, Marker, Stack, make_leaf

PROTOCOL = 1
HELLO, CALL, STACK, MARKER, EXPORT, END_STEP, SYNC, QUIT = range(8)
HEADER = struct.Struct("<I")
#: the fields a CALL message carries after its tag: those of :class:`store.records.Call`, in order
CALL_FIELDS = tuple(field.name for field in fields(Call))
#: frames read ahead of the one being written (bounded: back-pressure beyond)
FRAMES_AHEAD = 32

__all__ = ["PROTOCOL", "HELLO", "CALL", "CALL_FIELDS", "STACK", "MARKER", "EXPORT", "END_STEP", "SYNC", "QUIT", "HEADER",
           "encode_frame", "message_record", "serve"]


def message_record(message: tuple):
    """The :class:`store.records.Call`, ``Stack`` or ``Marker`` a ``CALL``, ``STACK`` or
    ``MARKER`` message carries; None for the other messages."""
    tag = message[0]
    if tag == CALL:
        values = dict(zip(CALL_FIELDS, message[1:]))
        values["leaves"] = tuple(map(make_leaf, values["leaves"]))
        return Call(**values)
    if tag == STACK:
        return Stack(stack_id=message[1], frames=message[2])
    if tag == MARKER:
        return Marker(step=message[1], kind=message[2], meta=message[3])
    return None


def encode_frame(messages: list) -> bytes:
    """One frame: the length header and the pickle of ``messages`` (see the module docstring)."""
    body = pickle.dumps(messages, protocol=5)
    return HEADER.pack(len(body)) + body


def _read_frame(stream: BinaryIO):
    """The next frame's messages, or None at end of input (a torn last frame included)."""
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    (size,) = HEADER.unpack(head)
    body = stream.read(size)
    if len(body) < size:
        return None
    return pickle.loads(body)


def _pump(stream: BinaryIO, frames: queue.Queue) -> None:
    while True:
        messages = _read_frame(stream)
        frames.put(messages)
        if messages is None:
            return


def serve(stream: BinaryIO, answers: TextIO) -> int:
    """Run the writer on ``stream`` (frames) until ``QUIT`` or end of input; answers go to
    ``answers``. Returns the process exit status (0; 2 for a protocol mismatch).

    Raises nothing for write faults: they are answered with ``F`` (see the module docstring).
    """
    from store.log_writer import LogWriter
    from store.export import StepFiles

    hello = _read_frame(stream)
    if not hello or hello[0][0] != HELLO or hello[0][1] != PROTOCOL:
        print(f"msprobe writer process: protocol mismatch: {hello!r:.200}", file=sys.stderr)
        return 2
    options = hello[0][2]
    writer = LogWriter(options["dump_path"], options["rank"], owner_pid=options["owner_pid"],
                       flush_rows=1 << 62, flush_interval_s=float("inf"),
                       segment_bytes=options.get("segment_bytes", 0), compression=options.get("compression"))
    files = StepFiles(writer, options["dump_path"])
    failed = False
    count = 0

    def say(line: str) -> None:
        answers.write(line + "\n")
        answers.flush()

    def fail(exc: BaseException) -> None:
        nonlocal failed
        failed = True
        say(f"F {type(exc).__name__}: {exc}".replace("\n", " "))

    # frames are read on a thread, up to FRAMES_AHEAD ahead of the one being written, so that
    # the training process's pipe writes rarely wait for the writer's work
    frames: queue.Queue = queue.Queue(maxsize=FRAMES_AHEAD)
    threading.Thread(target=_pump, args=(stream, frames), name="msprobe-writer-input", daemon=True).start()
    while True:
        messages = frames.get()
        if messages is None:
            break
        count += 1
        quit_ = False
        for message in messages:
            tag = message[0]
            if tag == SYNC:
                say(f"W {message[1]}")
                continue
            if tag == QUIT:
                quit_ = True
                break
            if failed:
                continue
            try:
                if tag == CALL:
                    writer.append(message_record(message))
                elif tag == STACK:
                    writer.append_stack(message_record(message))
                elif tag == MARKER:
                    writer.append_marker(message_record(message))
                elif tag == EXPORT:
                    files.export(message[1], message[2], message[3])
                elif tag == END_STEP:
                    files.end_step(message[1])
            except Exception as exc:  # noqa: BLE001 - any fault is answered, once
                fail(exc)
        if not failed:
            try:
                writer.flush()
            except Exception as exc:  # noqa: BLE001
                fail(exc)
        say(f"A {count}")
        if quit_:
            break
    try:
        writer.close()
    except Exception as exc:  # noqa: BLE001
        if not failed:
            fail(exc)
    return 0


def main() -> int:
    """The process entry point: serve standard input, then end at once (the input thread
    may still be blocked reading from the training process)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Arrow's pool: the system allocator, which returns freed memory (msprobe.core.arrow_pool)
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    status = serve(sys.stdin.buffer, sys.stdout)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    main()
