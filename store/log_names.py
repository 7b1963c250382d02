"""Names of the log files: ``rank{rank}.{pid}.{time_ns}.arrows`` under
``{dump_path}/.msprobe/log/`` (pid: the training process whose records a file holds), and
the logs of other processes found there. Standard library only (the training process
checks for earlier runs' logs without loading pyarrow)."""
from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Optional, Union

from store import schema as S

__all__ = ["log_file_name", "other_process_logs", "parse_log_file_name"]


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
