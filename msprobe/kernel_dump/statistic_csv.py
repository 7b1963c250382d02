"""MindSpore's statistic dump (``saved_data: "statistic"``, GPU and Ascend): ``statistic.csv``.

One file per iteration directory. The header (MindSpore 2.x, ``libmindspore_tools``) is the
fixed columns ``Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape``
followed by one column per configured ``statistic_category``: ``Max Value``, ``Min Value``,
``Avg Value``, ``Count``, ``Negative Zero Count``, ``Positive Zero Count``, ``NaN Count``,
``Negative Inf Count``, ``Positive Inf Count``, ``Zero Count``, ``MD5``, ``L2Norm Value``.
One row per tensor: ``IO`` is ``input`` or ``output``, ``Slot`` its index, ``Shape`` a
bracketed list of ints (``(2,3)``; ``()`` for a 0-dim tensor), ``Data Type`` a dtype name
in any case (``float32`` and ``Float32`` both become the log's ``Float32``).

:func:`read_statistic_csv` maps each row to the statistics of the log
(:class:`StatRow`): Max/Min/Avg/L2Norm → max/min/mean/norm; ``NaN Count`` > 0 → has_nan;
an inf count > 0 → has_inf (without counts: from Max/Min being NaN/inf). Columns a file
lacks give None. MindSpore computes these on the device in the tensor's own precision, so
they may differ in the last bits from float64 over the same values; ``max_finite`` /
``min_finite`` are not available from this file.
"""
from __future__ import annotations

import csv
import math
import os
import re
from dataclasses import dataclass
from typing import Optional, Union

__all__ = ["StatRow", "read_statistic_csv", "ms_dtype_name", "REQUIRED_COLUMNS", "STATISTIC_CATEGORIES"]

REQUIRED_COLUMNS = ("Op Type", "Op Name", "IO", "Slot", "Data Type", "Shape")
#: the ``statistic_category`` msprobe asks MindSpore for (everything the log can hold)
STATISTIC_CATEGORIES = ("max", "min", "avg", "l2norm", "count", "nan count", "negative inf count",
                        "positive inf count")

_DTYPES = {
    "bool": "Bool", "int8": "Int8", "int16": "Int16", "int32": "Int32", "int64": "Int64",
    "uint8": "UInt8", "uint16": "UInt16", "uint32": "UInt32", "uint64": "UInt64",
    "float16": "Float16", "float32": "Float32", "float64": "Float64", "bfloat16": "BFloat16",
    "complex64": "Complex64", "complex128": "Complex128",
}
_INT = re.compile(r"-?\d+")


def ms_dtype_name(name: str) -> str:
    """MindSpore's dtype spelling (``Float32``) of a statistic.csv ``Data Type`` (``float32``);
    an unknown name is returned unchanged."""
    return _DTYPES.get(name.strip().lower(), name.strip())


@dataclass(frozen=True, slots=True)
class StatRow:
    """One row of statistic.csv in the log's terms (None: column absent or empty)."""

    op_type: str
    op_name: str
    timestamp: Optional[int]
    io: str
    slot: int
    dtype: str
    shape: tuple[int, ...]
    numel: int
    max: Optional[float]
    min: Optional[float]
    mean: Optional[float]
    norm: Optional[float]
    has_nan: Optional[bool]
    has_inf: Optional[bool]


def _float(row: dict, column: str) -> Optional[float]:
    text = (row.get(column) or "").strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _count(row: dict, column: str) -> Optional[int]:
    value = _float(row, column)
    return None if value is None or math.isnan(value) else int(value)


def read_statistic_csv(path: Union[str, os.PathLike]) -> list[StatRow]:
    """The rows of one statistic.csv, in file order.

    Raises:
        ValueError: the header lacks one of :data:`REQUIRED_COLUMNS`, or a row's ``IO``,
            ``Slot`` or ``Shape`` is malformed (the message names the file and line).
        OSError: the file cannot be read.
    """
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh, skipinitialspace=True)
        header = [h.strip() for h in (reader.fieldnames or [])]
        missing = [c for c in REQUIRED_COLUMNS if c not in header]
        if missing:
            raise ValueError(f"{path}: not a MindSpore statistic.csv: missing column(s) {', '.join(missing)}")
        reader.fieldnames = header
        out = []
        for row in reader:
            where = f"{path}, line {reader.line_num}"
            io = (row.get("IO") or "").strip().lower()
            slot = (row.get("Slot") or "").strip()
            if io not in ("input", "output") or not slot.isdigit():
                raise ValueError(f"{where}: IO {row.get('IO')!r} / Slot {row.get('Slot')!r}: "
                                 f"expected input|output and an int")
            shape_text = (row.get("Shape") or "").strip()
            if not shape_text or shape_text[0] not in "([" or shape_text[-1] not in ")]":
                raise ValueError(f"{where}: Shape {shape_text!r}: expected a bracketed list of ints such as (2,3)")
            shape = tuple(int(d) for d in _INT.findall(shape_text))
            numel = _count(row, "Count")
            if numel is None:
                numel = math.prod(shape)
            mx, mn = _float(row, "Max Value"), _float(row, "Min Value")
            nan_count = _count(row, "NaN Count")
            inf_counts = [c for c in (_count(row, "Negative Inf Count"), _count(row, "Positive Inf Count"))
                          if c is not None]
            extremes = [v for v in (mx, mn) if v is not None]
            has_nan = nan_count > 0 if nan_count is not None else (
                any(math.isnan(v) for v in extremes) if extremes else None)
            has_inf = sum(inf_counts) > 0 if inf_counts else (
                any(math.isinf(v) for v in extremes) if extremes else None)
            ts_text = (row.get("Timestamp") or "").strip()
            ts = int(ts_text) if ts_text.isdigit() else None     # microseconds: beyond float precision
            out.append(StatRow(op_type=(row.get("Op Type") or "").strip(), op_name=(row.get("Op Name") or "").strip(),
                               timestamp=ts, io=io, slot=int(slot), dtype=ms_dtype_name(row.get("Data Type") or ""),
                               shape=shape, numel=numel, max=mx, min=mn, mean=_float(row, "Avg Value"),
                               norm=_float(row, "L2Norm Value"), has_nan=has_nan, has_inf=has_inf))
        return out
