"""msprobe store: the framework-neutral event log, its export and its SQL views.

Imports no deep-learning framework (pyarrow, duckdb, numpy and the standard library
only). The SQL side lives in :mod:`store.query` (``from store.query import connect,
query``) and is not imported here, so importing ``store`` on the training path does not
load DuckDB.
"""
from __future__ import annotations

from store.errors import (
    ExportError,
    LogNotFoundError,
    QueryError,
    StoreError,
    StoreWriteError,
)
from store.export import ExportReport, export_debug, export_log, export_step
from store.log_reader import LogContents, LogReader, Skipped, read_log
from store.log_writer import LogWriter
from store.records import Call, Leaf, Marker, Stack

__all__ = [
    "Call",
    "ExportError",
    "ExportReport",
    "Leaf",
    "LogContents",
    "LogNotFoundError",
    "LogReader",
    "LogWriter",
    "Marker",
    "QueryError",
    "Skipped",
    "Stack",
    "StoreError",
    "StoreWriteError",
    "export_debug",
    "export_log",
    "export_step",
    "read_log",
]
