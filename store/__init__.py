"""msprobe store: the framework-neutral event log, its export and its SQL views.

Imports no deep-learning framework (pyarrow, duckdb, numpy and the standard library
only). The names below are imported at first use: importing ``store`` or one of its
pyarrow-free modules (``store.records``, ``store.schema``, ``store.writer_client``) on the
training path loads neither pyarrow nor DuckDB.
"""
from __future__ import annotations

import importlib

# name -> module: imported at first use (PEP 562), so that a training process that only
# hands records to its writer process (store.writer_client) does not load pyarrow
_EXPORTS = {
    "ExportError": "store.errors", "LogNotFoundError": "store.errors", "QueryError": "store.errors",
    "StoreError": "store.errors", "StoreWriteError": "store.errors",
    "ExportReport": "store.export", "export_debug": "store.export", "export_log": "store.export",
    "export_step": "store.export",
    "LogContents": "store.log_reader", "LogReader": "store.log_reader", "Skipped": "store.log_reader",
    "read_log": "store.log_reader",
    "LogWriter": "store.log_writer",
    "Call": "store.records", "Leaf": "store.records", "Marker": "store.records", "Stack": "store.records",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'store' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
