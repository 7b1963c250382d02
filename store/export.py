"""Export: build the documented dump layout from log rows.

Layout (upstream-dump-format.md sections 1, 3, 4)::

    {out}/step{N}/{rank_dir}/dump.json, stack.json, construct.json     levels L0, L1, mix
    {out}/{rank_dir}/debug.json                                         level debug

:func:`export_step` turns the rows of one rank and one step into the three files, offline
(:func:`export_log`, rows from :class:`store.select.StoreReader`, one rank at a time); :class:`StepExporter` does
the same live, fed the rows of :meth:`store.log_writer.LogWriter.take_step` as the writer
flushed them; :class:`StepFiles` is the one place where the live ``step{N}/{rank_dir}/``
files (level ``debug``: ``{rank_dir}/debug.json``) are written from what a log writer
holds: in the writer process (:mod:`store.writer_process`) for tasks that store no tensors,
in the training process otherwise. The output depends only on the set of rows
and, within one ``seq``, on the order of its leaf rows (both paths keep the order the writer
gave them), so the two paths write byte-identical files.
Every file is written atomically (temporary name in the same directory, then
``os.replace``), mode 0o640, in directories of mode 0o750.

Entry building, in short (details on :func:`build_entries`): call rows sorted by ``seq``
give the entries in order of first appearance, rows with the same name merge; a
``{P}.parameters_grad`` entry is placed right after the step's first ``{P}.forward.{n}``
entry; leaf rows (same ``seq`` as their call) fill each key of the entry by ``path``.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np
import pyarrow as pa

from store import arrow_np
from store import schema as S
from store.entries import (  # noqa: F401  (build_entries, entry_values: public here too)
    EntryBuilder, _Entry, _entry_raw, build_entries, entry_values,
)
from store.errors import ExportError, StoreError
from store.json_text import _ENCODE_STR, _encode, _NotPlainJson, dumps_indent1, records_encoder
from store.fileutil import atomic_write_text, make_dirs, replace_from
from store.log_reader import Skipped, add_stacks, missing_ranks, notices
from store.payload_writer import Payload, PayloadReader
from store.tensor_names import disk_name, name_limit, tmp_name, update_mapping

if TYPE_CHECKING:
    from store.log_writer import LogWriter

logger = logging.getLogger("msprobe")

#: ``write_tensor(path, payload)`` writes one tensor file (``.pt``, ``.npy``) at ``path``;
#: the adapter hands it to the exporter, so ``store`` never imports a framework.
TensorFileWriter = Callable[[Path, Payload], None]
TENSOR_DIR = S.TENSOR_DIR

__all__ = [
    "DEBUG_FILE",
    "DUMP_FILE",
    "CONSTRUCT_FILE",
    "STACK_FILE",
    "META_KEYS",
    "EntryBuilder",
    "ExportReport",
    "StepExporter",
    "StepFiles",
    "TENSOR_DIR",
    "TensorFileWriter",
    "export_tensors",
    "build_entries",
    "export_debug",
    "export_log",
    "export_step",
]

DUMP_FILE = "dump.json"
STACK_FILE = "stack.json"
CONSTRUCT_FILE = "construct.json"
DEBUG_FILE = "debug.json"
META_KEYS = ("task", "level", "framework", "dump_data_dir", "rank_dir")
LEVEL_DEBUG = "debug"
_TASK_STRUCTURE = "structure"
_CONSTRUCT_KINDS = {
    "L0": frozenset(S.MODULE_KINDS),
    "mix": frozenset(S.MODULE_KINDS + S.API_KINDS),
}


def _check_meta(meta: Mapping[str, Any]) -> None:
    missing = [key for key in META_KEYS if key not in meta]
    if missing:
        raise ExportError(
            f"meta: missing {', '.join(map(repr, missing))}; required: {', '.join(META_KEYS)}"
        )
    rank_dir = meta["rank_dir"]
    if (
        not isinstance(rank_dir, str)
        or rank_dir in ("", ".", "..")
        or "/" in rank_dir
        or "\\" in rank_dir
        or "\0" in rank_dir
    ):
        raise ExportError(
            f"meta rank_dir: got {rank_dir!r}; allowed: one directory name such as 'rank' or 'rank0'"
        )


def _top(meta: Mapping[str, Any], level: str, data: dict) -> dict:
    return {
        "task": meta["task"],
        "level": level,
        "framework": meta["framework"],
        "dump_data_dir": meta["dump_data_dir"],
        "data": {} if meta["task"] == _TASK_STRUCTURE else data,
    }


def export_step(
    rows: pa.Table,
    stacks: Mapping[int, Sequence[str]],
    meta: Mapping[str, Any],
    out_dir: Union[str, os.PathLike],
    *,
    payloads: Optional[PayloadReader] = None,
    write_tensor: Optional[TensorFileWriter] = None,
    done: Optional[set] = None,
) -> list[Path]:
    """Write ``dump.json``, ``stack.json`` and ``construct.json`` of one rank and step,
    and with ``payloads`` and ``write_tensor`` the tensor files (:func:`export_tensors`).

    Args:
        rows: call, leaf (and possibly marker/stack, ignored) rows of one rank and one
            step, in any order (:data:`store.schema.LOG_SCHEMA`).
        stacks: ``{stack_id: frames}``; stacks not referenced by a call are ignored.
        meta: ``task``, ``level``, ``framework``, ``dump_data_dir``, ``rank_dir``, and
            optionally ``extra_info`` (False: stack.json and construct.json are not written).
        out_dir: the rank directory (``{dump_path}/step{N}/{rank_dir}``); created with
            mode 0o750 if missing.
        payloads, write_tensor, done: see :func:`export_tensors`.
    Returns:
        The files written, in the order above (tensor files are not listed).
    Raises:
        ExportError: ``meta`` lacks a key or has an unsafe ``rank_dir``.
        OSError: a file could not be written (earlier files may have been replaced).

    Example: one ``Torch.add.0.forward`` call with a float32 output leaf gives
    ``{"Torch.add.0.forward": {"output": [{"type": "torch.Tensor", "dtype":
    "torch.float32", "shape": [2], "Max": 2.0, "Min": 1.0, "Mean": 1.5, "Norm": 2.236}]}}``
    as ``data``.
    """
    _check_meta(meta)
    order, entries = build_entries(rows)
    return _write_step(order, entries, None, stacks, meta, out_dir, lambda: rows,
                       payloads=payloads, write_tensor=write_tensor, done=done)


def _file_signature(path: Path) -> Optional[tuple[int, int, int, int]]:
    """``(size, mtime_ns, inode, device)`` of ``path``, None when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def _write_step(order: list[str], entries: Mapping[str, _Entry], chunks: Optional[dict[str, str]],
                stacks: Mapping[int, Sequence[str]], meta: Mapping[str, Any],
                out_dir: Union[str, os.PathLike], rows: Callable[[], pa.Table], *,
                payloads: Optional[PayloadReader], write_tensor: Optional[TensorFileWriter],
                done: Optional[set], memo: Optional[dict] = None, version: int = 0) -> list[Path]:
    """The files of :func:`export_step` from built entries (``chunks``: cache of encoded
    entries, see :func:`_dump_text`; ``rows()``: the step's rows, for tensor files).

    With ``memo`` (a live exporter's: ``{file name: (path, source, signature)}``) a file
    is neither encoded nor rewritten when what its text is made of (``version`` of the
    entries and ``meta`` for dump.json, the member lists for stack.json and
    construct.json) equals what was last written there and the file on disk is still
    that one (same size, mtime, inode: a file deleted or replaced since is rewritten)."""
    level = meta["level"]
    stack_items = [
        (name, entries[name].stack_id)
        for name in order
        if entries[name].stack_id is not None and entries[name].stack_id in stacks
    ]
    kinds = _CONSTRUCT_KINDS.get(level, frozenset())
    construct = [(name, entries[name].parent) for name in order if entries[name].kind in kinds]
    directory = make_dirs(out_dir, own_levels=2)
    written = []
    files = [(DUMP_FILE, (version, tuple(meta.items())) if memo is not None else None,
              lambda: _dump_text(meta, level, order, entries, chunks))]
    if meta.get("extra_info", True):  # config.json ``extra_info: false``: dump.json only
        files += [
            (STACK_FILE, stack_items, lambda: _items_text(stack_items, lambda sid: list(stacks[sid]), chunks)),
            (CONSTRUCT_FILE, construct, lambda: _items_text(construct, None, chunks)),
        ]
    for file_name, source, text_of in files:
        target = directory / file_name
        written.append(target)
        if memo is not None:
            last = memo.get(file_name)
            if last is not None and last[0] == target and last[1] == source and last[2] is not None \
                    and _file_signature(target) == last[2]:
                continue  # unchanged since this exporter wrote it
        atomic_write_text(target, text_of())
        if memo is not None:
            memo[file_name] = (target, source, _file_signature(target))
    if payloads is not None and write_tensor is not None and meta["task"] != _TASK_STRUCTURE:
        export_tensors(rows(), payloads, write_tensor, directory / TENSOR_DIR, done=done)
    return written


_EMPTY_DATA_TAIL = "{}\n}"


def _object_text(members: Sequence[tuple[str, Any]], value_of: Callable[[Any], Any], cache_key: Callable[[str, Any], Any],
                 chunks: Optional[dict], indent: str, encode: Callable[[Any, str, list], None] = _encode,
                 prefix: str = "", suffix: str = "") -> Optional[str]:
    """``prefix`` + the ``indent=1`` text of a non-empty JSON object nested at
    ``indent[:-1]`` + ``suffix``, joined once (dump.json is large: no copy per piece). The
    object is given as ``(key, token)`` pairs whose values are ``value_of(token)``; each
    ``"key": value`` member is encoded once (by ``encode``, :func:`store.json_text._encode`'s
    signature) and kept in ``chunks`` under ``cache_key(key, token)``.
    None when a value is not plain JSON (the caller falls back to :func:`json.dumps`)."""
    parts = []
    try:
        for key, token in members:
            ck = cache_key(key, token)
            piece = chunks.get(ck) if chunks is not None else None
            if piece is None:
                out = [_ENCODE_STR(key), ": "]
                encode(value_of(token), indent, out)
                piece = "".join(out)
                if chunks is not None:
                    chunks[ck] = piece
            parts.append(piece)
    except (_NotPlainJson, RecursionError):
        return None
    parts[0] = prefix + "{\n" + indent + parts[0]
    parts[-1] = parts[-1] + "\n" + indent[:-1] + "}" + suffix
    return (",\n" + indent).join(parts)


def _dump_text(meta: Mapping[str, Any], level: str, order: Sequence[str], entries: Mapping[str, _Entry],
               chunks: Optional[dict]) -> str:
    """dump.json's text, exactly ``dumps_indent1(_top(meta, level, entry_values(...)))``.

    Each entry is encoded on its own (``"name": value`` at the depth of ``data``'s items)
    and the pieces joined; with ``chunks`` (name -> encoded entry) pieces are reused and
    new ones stored, so a live step re-encodes only the entries that changed.
    """
    head = dumps_indent1(_top(meta, level, {}))
    if meta["task"] != _TASK_STRUCTURE and order and head.endswith(_EMPTY_DATA_TAIL):
        text = _object_text([(name, name) for name in order], lambda name: _entry_raw(entries[name]),
                            lambda name, _: name, chunks, "  ", records_encoder(),
                            head[: -len(_EMPTY_DATA_TAIL)], "\n}")
        if text is not None:
            return text
    return dumps_indent1(_top(meta, level, entry_values(order, entries)))


def _items_text(items: Sequence[tuple[str, Any]], expand: Optional[Callable[[Any], Any]],
                chunks: Optional[dict]) -> str:
    """``dumps_indent1(dict(...))`` of a top-level object given as ``(key, token)`` pairs,
    the value being ``expand(token)`` (or the token itself). With ``chunks``, the text of
    each ``(key, token)`` member is cached (tokens are immutable: stack ids, parent names)."""
    value_of = expand if expand is not None else (lambda token: token)
    if not items:
        return "{}"
    text = _object_text(items, value_of, lambda key, token: (_ITEMS, key, token), chunks, " ")
    if text is None:
        return dumps_indent1({key: value_of(token) for key, token in items})
    return text


_ITEMS = object()  # cache-key tag of _items_text members (never equal to an entry name)


class StepExporter:
    """Live, incremental :func:`export_step` for the step a process is recording.

    :meth:`add` takes each new batch of the step's rows (in the order the log writer
    hands them out); :meth:`write` writes the same bytes :func:`export_step` would write
    for all rows added so far, re-building and re-encoding only the entries the new rows
    touched (``step()`` after ``stop()`` encodes only the entries that arrived between them), and
    leaves alone a file whose content would not change and that is still, on disk, the
    file it last wrote there (a deleted or replaced file is written again).
    Rows that arrive out of ``seq`` order make the next :meth:`write` rebuild everything.
    """

    def __init__(self, previous: Optional["StepExporter"] = None) -> None:
        """Args:
            previous: the exporter of the step before (optional): the text of the
                stack.json/construct.json members it last wrote and its parsed ``keys``/
                ``path`` texts are reused (the calls of a training step repeat each step).
        """
        self._parts: list[pa.Table] = []
        self._builder = EntryBuilder(previous._builder if previous is not None else None)
        self._chunks: dict = {}  # entry name -> dump.json text; (tag, key, value) -> text
        self._stale = False
        self._version = 0  # changes whenever the entries may have changed
        self._memo: dict = {}  # what each file was last written from (see _write_step)
        if previous is not None:
            self._chunks = previous._member_texts()

    def _member_texts(self) -> dict:
        """The cached text of the stack.json and construct.json members of the last write."""
        chunks = self._chunks
        kept = {}
        for file_name in (STACK_FILE, CONSTRUCT_FILE):
            last = self._memo.get(file_name)
            for key, token in last[1] if last is not None else ():
                text = chunks.get((_ITEMS, key, token))
                if text is not None:
                    kept[(_ITEMS, key, token)] = text
        return kept

    def add(self, rows: pa.Table) -> None:
        """Add rows of the step (a table with :data:`store.schema.LOG_SCHEMA`, as
        :meth:`store.log_writer.LogWriter.take_step` returns them). The cached text of the
        entries they touch is dropped (stack.json/construct.json members are keyed by
        their immutable values and stay valid)."""
        if rows.num_rows == 0:
            return
        self._parts.append(rows)
        if self._stale:
            self._version += 1
            return
        low = arrow_np.int_min(rows[S.SEQ])
        if low is not None and low <= self._builder.max_seq:
            self._stale = True  # out of order: rebuild at the next write
            self._version += 1
            return
        touched = self._builder.add(rows)
        if touched:
            self._version += 1
        for name in touched:
            self._chunks.pop(name, None)

    def rows(self) -> pa.Table:
        """All rows added so far, as one table."""
        return pa.concat_tables(self._parts) if self._parts else S.LOG_SCHEMA.empty_table()

    def write(self, stacks: Mapping[int, Sequence[str]], meta: Mapping[str, Any],
              out_dir: Union[str, os.PathLike], *, payloads: Optional[PayloadReader] = None,
              write_tensor: Optional[TensorFileWriter] = None, done: Optional[set] = None) -> list[Path]:
        """Write the step's files (arguments and errors as :func:`export_step`)."""
        _check_meta(meta)
        if self._stale:
            self._builder = EntryBuilder()
            self._chunks = {}
            self._builder.add(self.rows())
            self._stale = False
        builder = self._builder
        return _write_step(builder.order(), builder.entries, self._chunks, stacks, meta, out_dir, self.rows,
                           payloads=payloads, write_tensor=write_tensor, done=done,
                           memo=self._memo, version=self._version)


def export_tensors(
    rows: pa.Table,
    payloads: PayloadReader,
    write_tensor: TensorFileWriter,
    tensor_dir: Union[str, os.PathLike],
    *,
    done: Optional[set] = None,
) -> list[str]:
    """Write ``{tensor_dir}/{data_name}`` for every leaf row with a ``data_name`` and a
    ``payload`` (spec 2.2; task ``tensor``).

    The first file of a payload is written by ``write_tensor`` under a temporary name
    and renamed; later files with the same payload (identical bytes) are hard links to
    it, or copies where links are impossible. ``(data_name, payload)`` pairs in ``done``
    (updated in place) are skipped: the live session passes the files written at an
    earlier ``stop()`` of the same step. Rows with the same ``data_name`` (one leaf
    recorded again, whose record the last row replaces) give one file, of the last row's
    payload. A payload that cannot be read (its shard was never written because the
    process died) is logged and skipped. A ``data_name`` longer than the file-name limit
    is written under a short name recorded in ``mapping.csv``
    (:mod:`store.tensor_names`).

    Returns:
        The ``data_name`` s written.
    Raises:
        OSError: a tensor file could not be written.
    """
    # numpy masks, not pyarrow.compute: this runs in the recording process (live export)
    with_payload = arrow_np.equals(rows[S.ROW], S.ROW_LEAF) & arrow_np.valid_mask(rows[S.PAYLOAD])
    if not with_payload.any():
        return []
    leaves = arrow_np.select(rows, with_payload)
    names = arrow_np.pylist(leaves[S.DATA_NAME])
    refs = arrow_np.pylist(leaves[S.PAYLOAD])
    directory = make_dirs(tensor_dir)
    limit = name_limit(directory)
    prefix = os.path.join(os.fspath(directory), "")  # text paths: pathlib costs ~10 µs per file here
    first: dict[str, str] = {}
    written: list[str] = []
    mapped: dict[str, str] = {}
    done = done if done is not None else set()
    # a leaf recorded again in the step (an accumulated parameter gradient) has its
    # earlier rows' data_name: its file holds the last row's payload, like its record
    last = dict(zip(names, refs))
    try:
        for name, ref in last.items():
            if not name or (name, ref) in done or "/" in name or "\\" in name or name.startswith("."):
                continue
            file_name = disk_name(name, limit)
            if _write_one(prefix, name, file_name, ref, first, payloads, write_tensor, limit):
                if file_name != name:
                    mapped[name] = file_name
                done.add((name, ref))
                written.append(name)
    finally:
        update_mapping(directory, mapped)
    return written


def _write_one(prefix: str, name: str, file_name: str, ref: str, first: dict[str, str],
               payloads: PayloadReader, write_tensor: TensorFileWriter, limit: int) -> bool:
    """Write one tensor file of :func:`export_tensors` (``prefix``: the tensor directory
    ending in a separator); False when its payload is unreadable."""
    target = prefix + file_name
    # an earlier file of this payload: in this export, or moved in by an earlier live export
    source = first.get(ref) or payloads.earlier_file(ref)
    if source != target:  # target is replaced (a leaf recorded again): it no longer holds its old payload
        payloads.forget_file(target)
    if source is not None and _link_or_copy(source, target, limit):
        return True
    if payloads.take_staged(ref, target):  # written during the step (live export)
        first[ref] = target
        return True
    try:
        payload = payloads.read(ref)
    except (OSError, ValueError, StoreError) as exc:  # missing, truncated or corrupted shard
        logger.warning("msprobe: tensor %s not exported: payload %s unreadable (%s)", name[:300], ref, exc)
        payloads.unreadable.append((ref, name, f"{type(exc).__name__}: {exc}"))
        return False

    def fill(tmp: str) -> bool:
        write_tensor(Path(tmp), payload)
        os.chmod(tmp, 0o640)
        return True

    _via_temporary(target, limit, fill)
    first[ref] = target
    return True


def _link_or_copy(source: Union[str, os.PathLike], target: Union[str, os.PathLike], limit: int = 255) -> bool:
    """Make ``target`` a hard link to ``source`` (a copy where links are impossible);
    False when ``source`` no longer exists (nothing is written then).

    A new link appears complete at once, so it is made under the final name; an existing
    ``target`` (an earlier export into the same directory) is replaced atomically
    through a temporary name, as a copy is.

    Raises:
        OSError: the copy or the rename failed.
    """
    try:
        os.link(source, target)
        return True
    except FileExistsError:
        pass
    except OSError:
        if not os.path.exists(source):
            return False

    def fill(tmp: str) -> bool:
        try:
            os.link(source, tmp)
        except FileNotFoundError:
            if not os.path.exists(source):
                return False
            raise
        except OSError:
            shutil.copyfile(source, tmp)
            os.chmod(tmp, 0o640)
        return True

    return _via_temporary(os.fspath(target), limit, fill)


def _via_temporary(target: str, limit: int, fill: Callable[[str], bool]) -> bool:
    """:func:`store.fileutil.replace_from` through the temporary name :func:`tmp_name` gives
    ``target``, after removing a leftover temporary of that name: it may be a hard link to
    another tensor file (a link interrupted before its rename), and ``fill`` may truncate
    what it opens."""
    head, tail = os.path.split(target)
    tmp = os.path.join(head, tmp_name(tail, limit))
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    return replace_from(tmp, target, fill)


def export_debug(
    rows: pa.Table,
    meta: Mapping[str, Any],
    out_dir: Union[str, os.PathLike],
    *,
    payloads: Optional[PayloadReader] = None,
    write_tensor: Optional[TensorFileWriter] = None,
    done: Optional[set] = None,
) -> list[Path]:
    """Write ``debug.json`` (level debug, spec 1.2) of one rank: entries of all steps
    merged in ``seq`` order, top-level ``level`` = ``"debug"``.

    Args:
        rows: the rank's rows, any steps, any order.
        meta: as for :func:`export_step`.
        out_dir: the rank directory ``{dump_path}/{rank_dir}``.
        payloads, write_tensor, done: tensor files, see :func:`export_tensors`.
    Returns:
        ``[out_dir / "debug.json"]``.
    Raises:
        ExportError: bad ``meta``. OSError: the write failed.
    """
    _check_meta(meta)
    order, entries = build_entries(rows)
    directory = make_dirs(out_dir, own_levels=1)
    target = directory / DEBUG_FILE
    atomic_write_text(target, _dump_text(meta, LEVEL_DEBUG, order, entries, None))
    if payloads is not None and write_tensor is not None:
        export_tensors(rows, payloads, write_tensor, directory / TENSOR_DIR, done=done)
    return [target]


# --- offline export ----------------------------------------------------------------------
@dataclass(frozen=True)
class ExportReport:
    """What :func:`export_log` did.

    Attributes:
        written: files written, in order.
        groups: ``(rank, step)`` pairs exported (step -1: a whole-rank debug.json).
        skipped: log parts not read as data (damaged batches, torn tails), groups that
            could not be exported (``offset`` -1, ``path`` the log directory) and tensor
            files not written because their payload is missing or damaged (``offset`` -1,
            ``path`` the shard).
        unverified: log files of format 1 (no checksums).
        missing_ranks, unfinished: as :class:`store.log_reader.LogContents`.
        unmatched: selected ranks/steps not in the recording, one line each
            (:meth:`store.select.StoreReader.unmatched`).
    """

    written: tuple[Path, ...]
    groups: tuple[tuple[int, int], ...]
    skipped: tuple[Skipped, ...]
    unverified: tuple[str, ...] = ()
    missing_ranks: tuple[int, ...] = ()
    unfinished: tuple[str, ...] = ()
    recovered: tuple[str, ...] = ()
    unmatched: tuple[str, ...] = ()

    def notices(self) -> list[str]:
        """One line per fallback from the Parquet parts to the log or selected rank not in
        the dump (:attr:`store.select.StoreReader.recovered`), then per skipped part, rank
        without a log, unverified or unfinished log file (:func:`store.log_reader.notices`),
        then the :attr:`unmatched` lines (selected steps not in the recording)."""
        return (list(self.recovered) + notices(self.skipped, self.unverified, self.missing_ranks, self.unfinished)
                + list(self.unmatched))


def _marker_metas(rows: pa.Table) -> list[tuple[int, int, dict]]:
    """(seq, step, meta) of the marker rows of one rank, by seq."""
    markers = arrow_np.select(rows, arrow_np.equals(rows[S.ROW], S.ROW_MARKER))
    found = []
    for seq, step, meta_text in zip(*(arrow_np.pylist(markers[c]) for c in (S.SEQ, S.STEP, S.META))):
        try:
            meta = json.loads(meta_text) if meta_text else None
        except ValueError:
            meta = None
        if isinstance(meta, dict):
            found.append((seq, step, meta))
    found.sort(key=lambda item: item[0])
    return found


def _meta_for_step(markers: list[tuple[int, int, dict]], step: int) -> Optional[dict]:
    """Meta of the latest marker (by seq) with step <= ``step``; else the earliest one."""
    chosen = None
    for _, marker_step, meta in markers:
        if marker_step <= step:
            chosen = meta
    if chosen is None and markers:
        chosen = markers[0][2]
    return chosen


def export_log(
    dump_path: Union[str, os.PathLike],
    out: Optional[Union[str, os.PathLike]] = None,
    *,
    tensor_writers: Optional[Mapping[str, TensorFileWriter]] = None,
    progress: Optional[Callable[[str], None]] = None,
    ranks: Optional[Sequence[int]] = None,
    steps: Optional[Sequence[int]] = None,
) -> ExportReport:
    """Rebuild the dump layout from the store under ``dump_path`` (every rank and step, or
    those of ``ranks`` and ``steps``).

    For each rank, each step with call or marker rows becomes
    ``{out or dump_path}/step{N}/{rank_dir}/`` via :func:`export_step`, with the meta of
    the rank's latest marker at or before step N (the earliest marker when none is). A
    rank whose meta says level ``debug`` becomes ``{out}/{rank_dir}/debug.json`` instead.
    Idempotent: running it twice writes the same bytes. ``tensor_writers`` maps a
    ``framework`` (meta) to its tensor-file callback; with one for the rank's framework,
    the tensor files of task ``tensor`` are rebuilt from the payload shards too.
    ``progress`` is called with ``"rank R step N"`` (``"rank R"`` for debug.json) after
    each directory is written.

    Rows come from :class:`store.select.StoreReader` (Parquet parts of ``msprobe compact``
    plus the log not yet compacted), one rank at a time: memory holds one rank's selected
    rows, whatever the number of ranks.

    Raises:
        LogNotFoundError: no log under ``dump_path``.
        OSError: a file could not be written.
    """
    from store.select import StoreReader

    tick = progress or (lambda _done: None)
    reader = StoreReader(dump_path, ranks=ranks, steps=steps)
    root = Path(out) if out is not None else Path(dump_path)
    log_dir = str(Path(dump_path) / S.STORE_DIR / S.LOG_DIR)
    written: list[Path] = []
    groups: list[tuple[int, int]] = []
    skipped: list[Skipped] = list(reader.skipped)
    payloads = PayloadReader(dump_path)
    writers = tensor_writers or {}
    marker_rows: list[pa.Table] = []
    for rank in reader.rank_values():
        rank_table = reader.rank_table(rank)
        row = rank_table[S.ROW]
        stacks = add_stacks({}, rank_table)
        rank_rows = arrow_np.select(rank_table.select(S.COLUMNS),
                                    arrow_np.valid_mask(row) & ~arrow_np.equals(row, S.ROW_STACK))
        del rank_table
        # offline only: Table.sort_by loads pyarrow.compute (the recording process never gets here)
        rank_rows = rank_rows.sort_by([(S.STEP, "ascending"), (S.SEQ, "ascending")])
        marker_rows.append(arrow_np.select(rank_rows, arrow_np.equals(rank_rows[S.ROW], S.ROW_MARKER)))
        markers = _marker_metas(rank_rows)
        if not markers:
            skipped.append(Skipped(log_dir, -1, f"rank {rank}: no marker with metadata; not exported"))
            continue
        try:
            if markers[-1][2].get("level") == LEVEL_DEBUG:
                meta = markers[-1][2]
                _check_meta(meta)
                written += export_debug(rank_rows, meta, root / meta["rank_dir"], payloads=payloads,
                                        write_tensor=writers.get(meta.get("framework")))
                groups.append((rank, -1))
                tick(f"rank {rank}")
                continue
            rank_steps = rank_rows[S.STEP].to_numpy()
            for step_start, step_stop in _runs(rank_steps):
                step = int(rank_steps[step_start])
                if step < 0 or (steps is not None and step not in reader.steps):
                    continue
                meta = _meta_for_step(markers, step)
                _check_meta(meta)
                step_rows = rank_rows.slice(step_start, step_stop - step_start)
                out_dir = root / f"step{step}" / meta["rank_dir"]
                written += export_step(step_rows, stacks, meta, out_dir, payloads=payloads,
                                       write_tensor=writers.get(meta.get("framework")))
                groups.append((rank, step))
                tick(f"rank {rank} step {step}")
        except ExportError as exc:
            skipped.append(Skipped(log_dir, -1, f"rank {rank}: {exc}; not exported"))
    payload_dir = str(Path(dump_path) / S.STORE_DIR / "payload")
    for ref, name, reason in payloads.unreadable:
        shard = ref.partition(":")[0]
        skipped.append(Skipped(os.path.join(payload_dir, shard), -1,
                               f"tensor {name[:300]} not exported: payload {ref.partition(':')[2]} unreadable ({reason})"))
    return ExportReport(written=tuple(written), groups=tuple(groups), skipped=tuple(skipped),
                        unverified=tuple(reader.unverified), missing_ranks=_missing(marker_rows, reader.ranks),
                        unfinished=tuple(reader.unfinished), recovered=tuple(reader.recovered),
                        unmatched=tuple(reader.unmatched()))


def _missing(marker_rows: list, selected: Optional[frozenset]) -> tuple[int, ...]:
    """The ranks (of ``selected``, None: any) that should have recorded but have no rows,
    by the markers of the ranks read (:func:`store.log_reader.missing_ranks`)."""
    if not marker_rows:
        return ()
    missing = missing_ranks(pa.concat_tables(marker_rows))
    return tuple(r for r in missing if selected is None or r in selected)


def _runs(values: np.ndarray) -> list[tuple[int, int]]:
    """``[(start, stop)]`` of runs of equal values in a sorted 1-d array."""
    if len(values) == 0:
        return []
    cuts = np.flatnonzero(values[1:] != values[:-1]) + 1
    bounds = [0, *cuts.tolist(), len(values)]
    return list(zip(bounds[:-1], bounds[1:]))

# --- the live step files ------------------------------------------------------------------------
class StepFiles:
    """Writes the current step's files from the rows ``writer`` flushed.

    Args:
        writer: the rank's log writer (its retained rows are taken at each export).
        dump_path: the dump directory (level ``debug`` writes ``{dump_path}/{rank_dir}/``).
    """

    def __init__(self, writer: "LogWriter", dump_path: os.PathLike | str) -> None:
        self.writer = writer
        self._dump_path = Path(dump_path)
        self._exporter = StepExporter()
        self._tensors_done: set = set()

    def export(self, step: int, meta: Mapping[str, Any], emitted: bool, *,
               payloads: Optional[PayloadReader] = None, write_tensor: Optional[TensorFileWriter] = None) -> None:
        """Flush the log and (re)write step ``step``'s files with every row of the step so far.

        Args:
            step: the step being recorded.
            meta: the session's marker meta (``task``, ``level``, ``framework``,
                ``dump_data_dir``, ``rank_dir``, ...; see ``store.export``).
            emitted: whether a call of the step reached the log (False: only markers
                did, which never change the files: the skeleton files are written).
            payloads, write_tensor: task ``tensor`` (see :meth:`StepExporter.write`).
        Raises:
            StoreWriteError: the log writer failed.
            OSError: a file could not be written.
        """
        if emitted:
            self._exporter.add(self.writer.take_step(step))
        else:
            self.writer.flush()
        rank_dir = meta["rank_dir"]
        if meta["level"] == "debug":  # {dump_path}/{rank_dir}/debug.json (spec 1.2)
            export_debug(self._exporter.rows(), meta, self._dump_path / rank_dir, payloads=payloads,
                         write_tensor=write_tensor, done=self._tensors_done)
            return
        self._exporter.write(self.writer.stacks(), meta, self._dump_path / f"step{step}" / rank_dir,
                             payloads=payloads, write_tensor=write_tensor, done=self._tensors_done)

    def end_step(self, step: int) -> None:
        """Close step ``step`` after its last export: the log is fsynced in the background
        (:meth:`LogWriter.flush`), rows of the step flushed after the export (the
        ``step_end`` marker) are dropped, the log file is ended if it reached its segment
        size (:meth:`LogWriter.end_segment_if_due`), and the next step starts with an empty
        exporter (which reuses the stack.json/construct.json texts of this one).

        Raises:
            StoreWriteError: the log writer failed.
        """
        self.writer.flush(True, background=True)
        self.writer.drop_step_rows(step)
        self.writer.end_segment_if_due()
        self._exporter = StepExporter(self._exporter)
        self._tensors_done = set()
