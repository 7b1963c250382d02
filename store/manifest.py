"""The manifest of the compacted store: which Parquet parts exist and what of the log they hold.

Layout under the Parquet directory (default ``{dump_path}/.msprobe/parquet``):

``step_bucket={B}/rank={R}/part-{log}-{first}.parquet``
    call and leaf rows of rank ``R`` for steps ``B*bucket .. (B+1)*bucket-1``: the columns
    of :data:`store.schema.LOG_SCHEMA` except ``rank`` (in the path, Hive style), plus
    :data:`LOG_FILE` (the name of the log file the rows came from); one row group per step,
    rows sorted by step and seq, zstd-compressed.
``_meta/rank={R}/part-{log}-{first}.parquet``
    the stack and marker rows of rank ``R`` (needed whatever steps are selected).
``_summary.parquet``
    one row per (rank, step) of the compacted steps: :data:`store.parts.SUMMARY_COLUMNS`.
``_manifest.json``
    this module's :class:`Manifest`.
``_lock``
    an empty file compaction passes ``flock`` to take turns.

Spark and Hive skip names starting with ``_`` (and ``.``), so ``spark.read.parquet(dir)``
sees exactly the step parts, with partition columns ``step_bucket`` and ``rank``; the glob
``step_bucket=*/rank=*/*.parquet`` (DuckDB, Polars) matches the same files.

The log stays the source of truth: a log file's rows ``[0, rows)`` are in parts, the rest
(the *tail*) is read from the log. Parts are listed here only once written completely;
readers take the list of parts from here, so a part being written is never read.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Union

from store import schema as S
from store.errors import StoreError
from store.fileutil import atomic_write_text

__all__ = ["LOG_FILE", "MANIFEST_NAME", "SUMMARY_NAME", "STEP_BUCKET", "LogCoverage", "Manifest", "Part",
           "load_manifest", "parquet_dir", "save_manifest"]

#: part column: the name of the log file a row came from (keeps two runs' calls apart)
LOG_FILE = "log_file"
MANIFEST_NAME = "_manifest.json"
LOCK_NAME = "_lock"
SUMMARY_NAME = "_summary.parquet"
PARQUET_DIR = "parquet"
META_DIR = "_meta"
#: steps per ``step_bucket`` directory
STEP_BUCKET = 100
#: the manifest layout written by this module (readers take older ones too)
MANIFEST_VERSION = 1


class ManifestError(StoreError):
    """The manifest cannot be read (damaged JSON, a newer layout)."""


@dataclass
class Part:
    """One Parquet part file.

    Attributes:
        path: relative to the Parquet directory, ``/``-separated.
        rank: the rank of every row.
        steps: ``[first, last]`` step of the rows (``[-1, -1]`` for a ``meta/`` part).
        rows: row count.
        tensors: tensor leaf rows; ``nan``/``inf``: of those, how many hold NaN / Inf.
        log_file: the log file (name under ``.msprobe/log/``) the rows came from.
        log_rows: ``[start, stop)``: the rows' positions in that log file.
        format: the log format version of the rows.
    """

    path: str
    rank: int
    steps: list
    rows: int
    tensors: int
    nan: int
    inf: int
    log_file: str
    log_rows: list
    format: str = S.FORMAT_VERSION


@dataclass
class LogCoverage:
    """How much of one log file the parts hold.

    Attributes:
        rows: rows ``[0, rows)`` of the file are in parts.
        read_rows: rows of the file when it was last read.
        bytes: bytes ``[0, bytes)`` of the file were read then (whole messages).
        finished: the file ended with the end-of-stream marker (its writer closed).
        seq_offsets: ``{rank: n}`` added to ``seq`` (>= 0) of the file's rows, so ``seq``
            keeps increasing over a rank's files (as :func:`store.log_reader.read_log`).
        next_seq: ``{rank: largest shifted seq + 1}`` over the rows read.
        skipped: the parts of the file not read as data (damage with a known end, from
            every pass), as dicts of :class:`store.log_reader.Skipped`'s fields but
            ``path``; readers that no longer read a complete file report these.
    """

    rows: int = 0
    read_rows: int = 0
    bytes: int = 0
    finished: bool = False
    seq_offsets: dict = field(default_factory=dict)
    next_seq: dict = field(default_factory=dict)
    skipped: list = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every row of a closed file is in parts: the file need not be read again."""
        return self.finished and self.rows == self.read_rows

    def unchanged_in_parts(self, path: Path) -> bool:
        """:attr:`complete`, and the file at ``path`` still has the size it had when last
        read (``bytes``): it need not be read again."""
        try:
            return self.complete and path.stat().st_size == self.bytes
        except OSError:
            return False


@dataclass
class Manifest:
    """The whole manifest: ``parts`` in writing order, ``logs`` by log file name."""

    parts: list = field(default_factory=list)
    logs: dict = field(default_factory=dict)
    step_bucket: int = STEP_BUCKET
    format: str = S.FORMAT_VERSION
    version: int = MANIFEST_VERSION

    def select(self, ranks=None, steps=None, *, meta: bool = False) -> list:
        """Parts holding rows of ``ranks`` and ``steps`` (None: all); ``meta``: the
        ``meta/`` parts (stack and marker rows) instead of the step parts."""
        step_set = None if steps is None else set(steps)
        rank_set = None if ranks is None else set(ranks)
        out = []
        for part in self.parts:
            if (part.steps[0] < 0) != meta:
                continue
            if rank_set is not None and part.rank not in rank_set:
                continue
            if step_set is not None and not meta and not any(part.steps[0] <= s <= part.steps[1] for s in step_set):
                continue
            out.append(part)
        return out


def parquet_dir(dump_path: Union[str, os.PathLike], out: Optional[Union[str, os.PathLike]] = None) -> Path:
    """The Parquet directory: ``out`` or ``{dump_path}/.msprobe/parquet``."""
    return Path(out) if out is not None else Path(dump_path) / S.STORE_DIR / PARQUET_DIR


def load_manifest(directory: Union[str, os.PathLike]) -> Manifest:
    """The manifest in ``directory`` (an empty one where there is none).

    Raises:
        ManifestError: the file is not a manifest this reader understands.
    """
    path = Path(directory) / MANIFEST_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Manifest()
    try:
        raw = json.loads(text)
        if int(raw.get("version", 1)) > MANIFEST_VERSION:
            raise ManifestError(f"{str(path)!r}: manifest version {raw['version']} is newer than this "
                                f"reader's ({MANIFEST_VERSION})")
        parts = [Part(**p) for p in raw.get("parts", [])]
        logs = {}
        for name, cov in raw.get("logs", {}).items():
            cov = dict(cov)
            for key in ("seq_offsets", "next_seq"):
                cov[key] = {int(r): int(v) for r, v in cov.get(key, {}).items()}
            logs[name] = LogCoverage(**cov)
        return Manifest(parts=parts, logs=logs, step_bucket=int(raw.get("step_bucket", STEP_BUCKET)),
                        format=str(raw.get("format", S.FORMAT_VERSION)), version=int(raw.get("version", 1)))
    except ManifestError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ManifestError(f"{str(path)!r}: not a readable msprobe manifest: {exc} (the log is intact: delete "
                            f"{str(path.parent)!r} and run msprobe compact again to rebuild the parts)") from None


def save_manifest(directory: Union[str, os.PathLike], manifest: Manifest) -> None:
    """Write ``manifest`` atomically (temporary name, then rename)."""
    raw = {
        "version": MANIFEST_VERSION, "format": manifest.format, "step_bucket": manifest.step_bucket,
        "parts": [asdict(p) for p in manifest.parts],
        "logs": {name: asdict(cov) for name, cov in manifest.logs.items()},
    }
    atomic_write_text(Path(directory) / MANIFEST_NAME, json.dumps(raw, indent=1, sort_keys=True))
