"""Clear a dump path of an earlier msprobe recording before a new run records there.

Every process that records into a dump path adds its own log beside the logs already
there, and the SQL views, ``msprobe export`` and ``msprobe compare`` read them all (the
session warns when it finds an earlier log of its rank). A script that is rerun into the
same dump path and wants only its newest run (such as the examples) clears it first.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Union

from store import schema as S

__all__ = ["clear_recording"]

#: top-level directories a recording consists of: the store (log, payloads), the step
#: directories, the debug level's rank directories, and MindSpore's kernel dump
#: (GRAPH_MODE level L2: ``rank_{id}``)
_RECORDING_ENTRY = re.compile(re.escape(S.STORE_DIR) + r"|step\d+|rank\d*|rank_\d+")
#: top-level files of a recording: the kernel dump configuration msprobe.mindspore writes
#: for MindSpore (msprobe.mindspore.graph_dump.CONFIG_FILE)
_RECORDING_FILES = frozenset({"kernel_dump_config.json"})


def clear_recording(dump_path: Union[str, os.PathLike]) -> bool:
    """Remove the msprobe recording in ``dump_path`` (its ``.msprobe`` store, its
    ``step{N}``/``rank{R}`` directories and a MindSpore kernel dump: ``rank_{id}``
    directories, ``kernel_dump_config.json``), keeping the directory itself.

    Returns:
        True when a recording was removed; False when there was none (no such path, or
        an empty directory).

    Raises:
        FileExistsError: ``dump_path`` is not a directory, is a non-empty directory
            without a ``.msprobe`` store, or holds anything besides a recording (a file, a
            symbolic link, another directory); nothing is removed then.
        OSError: a removal failed (what was removed before stays removed).
    """
    path = Path(dump_path)
    if not path.exists():
        return False
    if not path.is_dir():
        raise FileExistsError(f"dump path {str(path)!r} exists and is not a directory; choose another dump path")
    entries = sorted(path.iterdir())
    if not entries:
        return False
    if not (path / S.STORE_DIR).is_dir():
        raise FileExistsError(f"dump path {str(path)!r} is not empty and holds no msprobe recording "
                              f"(no {S.STORE_DIR} directory); not touching it: choose another dump path")
    foreign = [entry.name for entry in entries
               if entry.is_symlink() or not (entry.is_file() and entry.name in _RECORDING_FILES
                                             or entry.is_dir() and _RECORDING_ENTRY.fullmatch(entry.name))]
    if foreign:
        raise FileExistsError(f"dump path {str(path)!r} holds a msprobe recording and other files "
                              f"({', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}); not "
                              "removing it: choose another dump path, or delete it yourself")
    for entry in entries:
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return True
