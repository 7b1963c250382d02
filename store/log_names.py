"""Names of the log files: ``rank{rank}.{pid}.{time_ns}.arrows`` under
``{dump_path}/.msprobe/log/`` (pid: the training process whose records a file holds), the
logs of other processes found there, and the log's settings from the environment (segment
size, IPC compression). Standard library only (the training process reads them and checks
for earlier runs' logs without loading pyarrow)."""
from __future__ import annotations

import math
import os
import re
import time
from pathlib import Path
from typing import Optional, Union

from store import schema as S

__all__ = ["COMPRESSION_ALLOWED", "COMPRESSION_ENV", "DEFAULT_COMPRESSION", "SEGMENT_ALLOWED", "SEGMENT_ENV",
           "log_compression", "log_file_name", "other_process_logs", "parse_log_file_name", "segment_bytes"]

#: environment variable: the size (MiB) at which a log file is ended at the next step's end
#: and a new one begun (see ``store.log_writer``, Segments); ``0``: one file per process
SEGMENT_ENV = "MSPROBE_LOG_SEGMENT_MB"
#: the segment size (MiB) when :data:`SEGMENT_ENV` is not set
DEFAULT_SEGMENT_MB = 256
#: what :data:`SEGMENT_ENV` accepts, for error messages
SEGMENT_ALLOWED = f"a number of MiB >= 0 (0: one log file per process; unset: {DEFAULT_SEGMENT_MB})"

#: environment variable: the Arrow IPC buffer compression of the log's record batches,
#: ``none``, ``lz4`` (LZ4 frame) or ``zstd`` (see ``store.log_writer``, ``compression``);
#: readers need no setting (each batch message says how its buffers are compressed)
COMPRESSION_ENV = "MSPROBE_LOG_COMPRESSION"
#: the compression when :data:`COMPRESSION_ENV` is not set (docs/performance.md, IPC
#: compression of the log: what it costs and saves)
DEFAULT_COMPRESSION: Optional[str] = "lz4"
#: the values :data:`COMPRESSION_ENV` accepts, for error messages
COMPRESSION_ALLOWED = ("none", "lz4", "zstd")


def log_file_name(rank: int, pid: int, time_ns: int) -> str:
    """Name of a log file: ``rank{rank}.{pid}.{time_ns}.arrows``.

    >>> log_file_name(3, 4242, 17)
    'rank3.4242.17.arrows'
    """
    return f"rank{rank}.{pid}.{time_ns}{S.LOG_SUFFIX}"


_LOG_FILE_NAME = re.compile(r"^rank(-?\d+)\.(\d+)\.(\d+)" + re.escape(S.LOG_SUFFIX) + r"$")


def parse_log_file_name(name: str) -> Optional[tuple[int, int, int]]:
    """``(rank, pid, time_ns)`` of a :func:`log_file_name`, or None for any other name.

    >>> parse_log_file_name("rank3.4242.17.arrows")
    (3, 4242, 17)
    """
    match = _LOG_FILE_NAME.match(name)
    if match is None:
        return None
    rank, pid, time_ns = (int(group) for group in match.groups())
    return rank, pid, time_ns


#: when this module was imported (ns since the epoch): before any log of this process was
#: made, so a log with this process's pid and an earlier time is an earlier process's
_IMPORTED_NS = time.time_ns()


def other_process_logs(dump_path: Union[str, os.PathLike], rank: int, pid: Optional[int] = None,
                       since_ns: Optional[int] = None) -> list[str]:
    """Names of the log files of ``rank`` under ``{dump_path}/.msprobe/log/`` that a process
    other than this one wrote, such as an earlier run's: another pid than ``pid`` (default:
    this process's), or the same pid (a rerun in a container often gets the same one) with
    a creation time before ``since_ns`` (default: when this module was imported).

    One directory listing (names only, no file is opened); an absent or unreadable
    directory gives ``[]``. Logs of other ranks (the other processes of a distributed
    run) are not counted.
    """
    own = os.getpid() if pid is None else pid
    since = _IMPORTED_NS if since_ns is None else since_ns
    try:
        with os.scandir(Path(dump_path) / S.STORE_DIR / S.LOG_DIR) as entries:
            names = [entry.name for entry in entries]
    except OSError:
        return []
    found = []
    for name in names:
        parsed = parse_log_file_name(name)
        if parsed is not None and parsed[0] == rank and (parsed[1] != own or parsed[2] < since):
            found.append(name)
    return sorted(found)


def segment_bytes(environ: Optional[dict] = None) -> int:
    """The log segment size in bytes from :data:`SEGMENT_ENV` in ``environ`` (default:
    ``os.environ``): a number of MiB (fractions allowed, rounded up to whole bytes), ``0``
    for no segments; unset or empty gives :data:`DEFAULT_SEGMENT_MB`.

    >>> segment_bytes({"MSPROBE_LOG_SEGMENT_MB": "1"})
    1048576
    >>> segment_bytes({"MSPROBE_LOG_SEGMENT_MB": "0.5"})
    524288

    Raises:
        ValueError: the value is not a finite number >= 0.
    """
    text = (os.environ if environ is None else environ).get(SEGMENT_ENV, "").strip()
    if not text:
        return DEFAULT_SEGMENT_MB << 20
    try:
        mib = float(text)
    except ValueError:
        mib = -1.0
    if not 0 <= mib < float("inf"):
        raise ValueError(f"{SEGMENT_ENV}={text!r}: expected {SEGMENT_ALLOWED}")
    return math.ceil(mib * (1 << 20))   # a size above 0 stays above 0 bytes


def log_compression(environ: Optional[dict] = None) -> Optional[str]:
    """The log's IPC buffer compression from :data:`COMPRESSION_ENV` in ``environ``
    (default: ``os.environ``), as :class:`store.log_writer.LogWriter` takes it: None for
    ``none``, else ``"lz4"`` or ``"zstd"`` (case and surrounding blanks ignored); unset or
    empty gives :data:`DEFAULT_COMPRESSION`.

    >>> log_compression({"MSPROBE_LOG_COMPRESSION": "ZSTD"})
    'zstd'
    >>> log_compression({"MSPROBE_LOG_COMPRESSION": "none"}) is None
    True

    Raises:
        ValueError: any other value.
    """
    text = (os.environ if environ is None else environ).get(COMPRESSION_ENV, "")
    value = text.strip().lower()
    if not value:
        return DEFAULT_COMPRESSION
    if value not in COMPRESSION_ALLOWED:
        raise ValueError(f"{COMPRESSION_ENV}={text!r}: expected one of {', '.join(COMPRESSION_ALLOWED)}")
    return None if value == "none" else value
