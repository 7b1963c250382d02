"""Named exceptions of the ``store`` package, all in one place.

Every exception derives from :class:`StoreError`, so a caller can catch the whole family.
"""
from __future__ import annotations


class StoreError(Exception):
    """Base class of every error raised by ``store``."""


class StoreWriteError(StoreError, OSError):
    """The log writer could not write (disk full, permission lost, bad record).

    Raised once, from the call that failed; the writer is a no-op afterwards
    (:attr:`store.log_writer.LogWriter.failed` is True). ``__cause__`` holds the original
    exception.
    """


class LogNotFoundError(StoreError, FileNotFoundError):
    """``dump_path`` does not exist or holds no event log (``.msprobe/log/*.arrows``)."""


class ExportError(StoreError, ValueError):
    """Rows or metadata handed to the exporter are unusable (the message names the field)."""


class QueryError(StoreError, ValueError):
    """A SQL query failed; the message carries DuckDB's own message."""


class PayloadDamagedError(StoreError, ValueError):
    """A payload shard is truncated or corrupted, or lacks the referenced key: the message
    names the shard and the key. The exporter skips that tensor file and goes on."""
