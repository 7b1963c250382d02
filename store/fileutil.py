"""Private-permission directories and atomic file writes.

Files created by ``store`` are never world-accessible: directories get mode ``0o750``
and files ``0o640``, set with an explicit ``chmod`` so that the process umask does not
matter (upstream dump layout, spec section 1.1 "permissions").
"""
from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path
from typing import Callable, Union

DIR_MODE = 0o750
FILE_MODE = 0o640

PathLike = Union[str, "os.PathLike[str]"]


def make_dirs(path: PathLike, *, own_levels: int = 0) -> Path:
    """Create ``path`` and any missing parents, each new one with mode ``0o750``.

    Directories that already exist keep their mode.

    Args:
        path: directory to create.
        own_levels: the last ``own_levels`` components of ``path`` are msprobe's own
            directories (``step3/rank``, ``.msprobe/log``): if one of them exists as a
            symbolic link, nothing is created and OSError(ELOOP) is raised, so that files
            never land outside the dump path through a planted link.
    Returns:
        ``Path(path)``.
    Raises:
        OSError: creation failed, ``path`` exists and is not a directory, or one of the
            last ``own_levels`` components is a symbolic link.
    """
    target = Path(path)
    component = target
    for _ in range(own_levels):
        if component.is_symlink():
            raise OSError(errno.ELOOP, f"{str(component)!r} is a symbolic link; msprobe writes only "
                          "into real directories inside dump_path")
        component = component.parent
    missing = []
    probe = target
    while not probe.is_dir():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            if not directory.is_dir():
                raise
            continue
        os.chmod(directory, DIR_MODE)
    return target


def atomic_write_bytes(path: PathLike, data: bytes, *, fsync: bool = False) -> None:
    """Write ``data`` to ``path`` atomically, file mode ``0o640``.

    The bytes go to a temporary file in the same directory, which then replaces ``path``
    with :func:`os.replace`: a reader sees the old file or the new one, never a part.
    The directory must exist. On failure the temporary file is removed.

    Args:
        path: destination file.
        data: complete file contents.
        fsync: fsync the file before the rename (unit: one ``os.fsync`` call).
    Raises:
        OSError: the write or the rename failed.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)

    def fill(_: PathLike) -> bool:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), FILE_MODE)
            handle.write(data)
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
        return True

    replace_from(tmp, target, fill)


def replace_from(tmp: PathLike, target: PathLike, fill: Callable[[PathLike], bool]) -> bool:
    """Write ``target`` atomically through the temporary file ``tmp`` (same directory):
    ``fill(tmp)`` writes the temporary file, which then replaces ``target`` with
    :func:`os.replace`, so a reader sees the old file or the new one, never a part.

    Returns:
        True; False when ``fill`` returned False (it wrote nothing; ``target`` untouched).
    Raises:
        whatever ``fill`` or the rename raised, after removing ``tmp``.
    """
    try:
        if not fill(tmp):
            return False
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return True


def atomic_write_text(path: PathLike, text: str, *, fsync: bool = False) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically; see :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode("utf-8"), fsync=fsync)
