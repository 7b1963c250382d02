"""Tensor file names on disk for ``data_name`` s longer than the file-name limit.

dump.json always holds the full ``data_name`` (spec 2.2). A ``data_name`` whose UTF-8
encoding is longer than the directory's file-name limit (255 bytes, or less where
``os.pathconf(dir, "PC_NAME_MAX")`` says so) is written under a short, deterministic
name instead::

    {first bytes of data_name}.{16 hex digits of sha256(data_name)}.{extension}

and the pair is recorded in ``dump_tensor_data/mapping.csv`` (upstream's mapping.csv for
long names, spec 1.4): a header line ``file_name,data_name``, then one line per mapped
file, sorted by ``data_name``. The live session and ``msprobe export`` produce the same
names and the same mapping file. Readers resolve a ``data_name`` with
:func:`tensor_file_path`.
"""
from __future__ import annotations

import csv
import hashlib
import io
import os
from pathlib import Path
from typing import Mapping, Union

from store.fileutil import atomic_write_text

__all__ = ["MAPPING_FILE", "NAME_MAX", "disk_name", "name_limit", "read_mapping",
           "tensor_file_path", "tmp_name", "update_mapping"]

MAPPING_FILE = "mapping.csv"
#: longest file name (unit: bytes) used when the file system does not say otherwise.
NAME_MAX = 255
_HEADER = ("file_name", "data_name")
_DIGEST_HEX = 16
_TMP_SUFFIX = ".tmp"


def name_limit(directory: Union[str, os.PathLike]) -> int:
    """The file-name limit of ``directory`` in bytes: ``min(255, PC_NAME_MAX)``; 255 when
    the file system does not report one."""
    try:
        limit = os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return NAME_MAX
    return NAME_MAX if limit is None or limit <= 0 else min(NAME_MAX, limit)


def _utf8_prefix(text: str, max_bytes: int) -> str:
    """Longest prefix of ``text`` whose UTF-8 encoding has at most ``max_bytes`` bytes."""
    return text.encode("utf-8")[:max(max_bytes, 0)].decode("utf-8", errors="ignore")


def disk_name(data_name: str, limit: int = NAME_MAX) -> str:
    """The file name under which ``data_name`` is stored.

    Args:
        data_name: the full tensor file name recorded in dump.json (no ``/``).
        limit: the directory's file-name limit in bytes (:func:`name_limit`).
    Returns:
        ``data_name`` itself when its UTF-8 encoding has at most ``limit`` bytes, else
        ``{prefix}.{sha256 hex[:16]}.{ext}`` (``ext`` the part after the last ``.``,
        dropped when longer than 16 bytes) of exactly ``limit`` bytes or fewer.
    Raises:
        ValueError: ``limit`` is too small to hold a digest and an extension (< 40).

    >>> disk_name("a.pt")
    'a.pt'
    >>> len(disk_name("N" * 300 + ".pt").encode())
    255
    """
    encoded = data_name.encode("utf-8")
    if len(encoded) <= limit:
        return data_name
    if limit < 40:
        raise ValueError(f"file-name limit {limit} bytes: too small for a mapped tensor file name (>= 40)")
    stem, dot, ext = data_name.rpartition(".")
    suffix = "." + ext if dot and 0 < len(ext.encode("utf-8")) <= 16 else ""
    digest = hashlib.sha256(encoded).hexdigest()[:_DIGEST_HEX]
    tail = "." + digest + suffix
    return _utf8_prefix(data_name, limit - len(tail.encode("utf-8"))) + tail


def tmp_name(file_name: str, limit: int = NAME_MAX) -> str:
    """Temporary name (``.{name}.tmp``, the name shortened to fit ``limit`` bytes) used
    while ``file_name`` is being written."""
    return "." + _utf8_prefix(file_name, limit - 1 - len(_TMP_SUFFIX)) + _TMP_SUFFIX


def read_mapping(tensor_dir: Union[str, os.PathLike]) -> dict[str, str]:
    """``{data_name: file_name}`` from ``{tensor_dir}/mapping.csv``; empty when the file
    is missing or unreadable. Rows that are not two fields, or whose file name holds a
    path separator, are ignored."""
    try:
        text = (Path(tensor_dir) / MAPPING_FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    found: dict[str, str] = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) != 2 or tuple(row) == _HEADER:
            continue
        file_name, data_name = row
        if file_name and "/" not in file_name and "\\" not in file_name and file_name not in (".", ".."):
            found[data_name] = file_name
    return found


def update_mapping(tensor_dir: Union[str, os.PathLike], pairs: Mapping[str, str]) -> bool:
    """Add ``{data_name: file_name}`` ``pairs`` to ``{tensor_dir}/mapping.csv`` (merged
    with the rows already there, sorted by ``data_name``, written atomically, mode 0o640).

    Returns:
        True when the file was (re)written, False when it already held every pair.
    Raises:
        OSError: the write failed.
    """
    if not pairs:
        return False
    merged = read_mapping(tensor_dir)
    if all(merged.get(k) == v for k, v in pairs.items()):
        return False
    merged.update(pairs)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(_HEADER)
    for data_name in sorted(merged):
        writer.writerow((merged[data_name], data_name))
    atomic_write_text(Path(tensor_dir) / MAPPING_FILE, out.getvalue())
    return True


def tensor_file_path(tensor_dir: Union[str, os.PathLike], data_name: str) -> Path:
    """Path of the file holding ``data_name`` in ``tensor_dir``: the mapped name from
    mapping.csv when there is one, else ``tensor_dir / data_name``.

    Raises:
        ValueError: ``data_name`` holds a path separator or is ``.``/``..``.
    """
    if "/" in data_name or "\\" in data_name or data_name in ("", ".", ".."):
        raise ValueError(f"data_name {data_name[:80]!r}: not a file name")
    directory = Path(tensor_dir)
    mapped = read_mapping(directory).get(data_name)
    return directory / (mapped if mapped is not None else data_name)
