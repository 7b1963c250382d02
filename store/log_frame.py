"""Checksummed Arrow IPC messages of the event log (log format 2).

A log file is an Arrow IPC *stream* (any Arrow reader reads it): the schema message, one
message per record batch, the end-of-stream marker. In format 2 (schema metadata
``msprobe.format = "2"``, ``msprobe.checksum = "crc32"``) every record batch message carries
the checksum of its own bytes in its custom metadata, under :data:`CHECKSUM_KEY`, as 8
lowercase hex digits. The checksum is CRC-32 (ISO-HDLC, the polynomial of zlib, gzip and
PNG) over the whole encapsulated message: continuation marker, metadata length, metadata
flatbuffer (with the 8 digits read as :data:`PLACEHOLDER`), padding and body. So every byte
of a batch is covered, the header that says how many rows and where each buffer is as
much as the values.

Why CRC-32: it detects every error burst of up to 32 bits (every single-bit flip, every
damaged aligned 4-byte word) with certainty, and others with probability 1 - 2**-32; it is
computed by ``isal`` (a dependency, also used for summary_mode md5) at tens of GB/s, and
:func:`zlib.crc32` gives the same value where ``isal`` is missing, so any reader can verify
any log. The digit text is fixed-width, so the writer serialises the message once with the
placeholder, computes the CRC and writes the digits over the placeholder in place.

Format 1 (``msprobe.format = "1"``) is the same stream without checksums; readers accept it
and call it unverified.
"""
from __future__ import annotations

import io
import re
from typing import BinaryIO, Iterable, Optional, Union

import pyarrow as pa

from store import schema as S

try:
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib gives the same values
    from zlib import crc32

__all__ = [
    "CHECKSUM_KEY", "END_OF_STREAM", "PLACEHOLDER", "MessageSealer", "crc32", "find_checksum",
    "message_checksum", "schema_message", "write_batches",
]

#: custom-metadata key of a format-2 record batch message: its CRC-32, 8 hex digits
CHECKSUM_KEY = b"msprobe.crc32"
#: what the checksum digits read as while the CRC is computed
PLACEHOLDER = b"00000000"
#: the Arrow IPC end-of-stream marker (continuation, metadata length 0)
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_PREFIX_SIZE = 8  # continuation marker + int32 metadata length
# a flatbuffer string of 8 characters: uint32 length 8, the characters, a NUL
_DIGITS = re.compile(rb"\x08\x00\x00\x00([0-9a-f]{8})\x00")
_CUSTOM = {CHECKSUM_KEY: PLACEHOLDER}


def schema_message() -> bytes:
    """The encapsulated schema message of :data:`store.schema.LOG_SCHEMA` (format 2), as a
    :class:`MessageSealer` writes it at the start of every log."""
    return bytes(S.LOG_SCHEMA.serialize())


def find_checksum(message: Union[bytes, memoryview], metadata_length: int) -> Optional[int]:
    """Offset of the 8 checksum digits inside ``message`` (an encapsulated IPC message
    starting at its continuation marker, whose metadata is ``metadata_length`` bytes), or
    None when its metadata holds no such string, or more than one."""
    metadata = bytes(message[_PREFIX_SIZE:_PREFIX_SIZE + metadata_length])
    found = [m.start(1) for m in _DIGITS.finditer(metadata)]
    return _PREFIX_SIZE + found[0] if len(found) == 1 else None


def message_checksum(message: Union[bytes, memoryview], digits_at: int) -> int:
    """CRC-32 of ``message`` with the 8 bytes at ``digits_at`` read as :data:`PLACEHOLDER`."""
    view = memoryview(message)
    value = crc32(view[:digits_at])
    value = crc32(PLACEHOLDER, value)
    return crc32(view[digits_at + len(PLACEHOLDER):], value)


class MessageSealer:
    """Serialises record batches of :data:`store.schema.LOG_SCHEMA` into format-2 IPC
    messages (see the module docstring).

    Args:
        compression: IPC buffer compression, None, ``"lz4"`` or ``"zstd"``.

    Not thread-safe (the log writer calls it under its lock).
    """

    def __init__(self, compression: Optional[str] = None) -> None:
        self._sink = io.BytesIO()
        options = pa.ipc.IpcWriteOptions(compression=compression)
        self._writer = pa.ipc.new_stream(self._sink, S.LOG_SCHEMA, options=options)
        self._schema_size: Optional[int] = len(schema_message())

    def seal(self, batch: pa.RecordBatch) -> memoryview:
        """The bytes of ``batch``'s IPC message, its checksum written in. The view stays
        valid until the next call.

        Raises:
            ValueError: the serialised metadata does not hold the placeholder once (a
                pyarrow that lays out custom metadata otherwise: nothing is written).
        """
        sink = self._sink
        sink.seek(0)
        sink.truncate()
        self._writer.write_batch(batch, custom_metadata=_CUSTOM)
        view = sink.getbuffer()
        if self._schema_size:  # the first write carries the schema message too
            view = view[self._schema_size:]
            self._schema_size = None
        metadata_length = int.from_bytes(view[4:8], "little")
        digits_at = find_checksum(view, metadata_length)
        if digits_at is None or view[digits_at:digits_at + 8] != PLACEHOLDER:
            raise ValueError("log writer: the checksum placeholder is not in the batch's metadata once")
        view[digits_at:digits_at + 8] = b"%08x" % message_checksum(view, digits_at)
        return view


def write_batches(sink: BinaryIO, batches: Iterable[pa.RecordBatch], compression: Optional[str] = None) -> None:
    """Write a complete format-2 log stream of ``batches`` (schema message, sealed batches,
    end-of-stream marker) to the binary file object ``sink``: a log built from rows at hand
    (tests, benchmarks), read as any log the writer made.

    Raises:
        ValueError / pyarrow.ArrowInvalid: a batch does not have :data:`~store.schema.LOG_SCHEMA`.
    """
    sealer = MessageSealer(compression)
    sink.write(schema_message())
    for batch in batches:
        if not batch.schema.equals(S.LOG_SCHEMA):
            raise ValueError("write_batches: a batch does not have the log schema")
        view = sealer.seal(batch)
        sink.write(view)
        del view
    sink.write(END_OF_STREAM)
