"""Export: build the documented dump layout from log rows.

Layout (upstream-dump-format.md sections 1, 3, 4)::

    {out}/step{N}/{rank_dir}/dump.json, stack.json, construct.json     levels L0, L1, mix
    {out}/{rank_dir}/debug.json                                         level debug

:func:`export_step` turns the rows of one rank and one step into the three files; it is
used both live (rows from :meth:`store.log_writer.LogWriter.take_step`) and offline
(:func:`export_log`, rows from :func:`store.log_reader.read_log`). The output depends only
on the set of rows and, within one ``seq``, on the order of its leaf rows (both paths keep
the order the writer gave them), so the two paths write byte-identical files.
Every file is written atomically (temporary name in the same directory, then
``os.replace``), mode 0o640, in directories of mode 0o750.

Entry building, in short (details on :func:`build_entries`): call rows sorted by ``seq``
give the entries in order of first appearance, rows with the same name merge; a
``{P}.parameters_grad`` entry is placed right after the step's first ``{P}.forward.{n}``
entry; leaf rows (same ``seq`` as their call) fill each key of the entry by ``path``.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from store import schema as S
from store.errors import ExportError, StoreError
from store.fileutil import atomic_write_text, make_dirs
from store.log_reader import Skipped, read_log
from store.payload_writer import Payload, PayloadReader
from store.tensor_names import disk_name, name_limit, tmp_name, update_mapping

logger = logging.getLogger("msprobe")

#: ``write_tensor(path, payload)`` writes one tensor file (``.pt``, ``.npy``) at ``path``;
#: the adapter hands it to the exporter, so ``store`` never imports a framework.
TensorFileWriter = Callable[[Path, Payload], None]
TENSOR_DIR = "dump_tensor_data"

__all__ = [
    "DEBUG_FILE",
    "DUMP_FILE",
    "CONSTRUCT_FILE",
    "STACK_FILE",
    "META_KEYS",
    "EntryBuilder",
    "ExportReport",
    "StepExporter",
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
_PG_SUFFIX = "." + S.PARAMETERS_GRAD
_FORWARD_COUNTER = re.compile(r"\.forward\.\d+$")
_LEAF_COLUMNS = (
    S.SEQ, S.IO, S.PATH, S.LEAF_KIND, S.TYPE, S.DTYPE, S.SHAPE, S.MAX, S.MIN, S.MEAN,
    S.NORM, S.REQUIRES_GRAD, S.MAX_FINITE, S.MIN_FINITE, S.CRC32, S.DATA_NAME, S.VALUE_JSON,
)
_CALL_COLUMNS = (S.SEQ, S.KIND, S.NAME, S.PARENT, S.STACK_ID, S.IS_RECOMPUTE, S.KEYS)


@dataclass
class _Entry:
    name: str
    kind: str
    keys: list[str]
    parent: Optional[str] = None
    stack_id: Optional[int] = None
    is_recompute: Optional[bool] = None
    values: dict[str, Any] = field(default_factory=dict)


# --- leaf records ------------------------------------------------------------------------
def _tensor_record(
    type_, dtype, shape, max_, min_, mean, norm, requires_grad, max_finite, min_finite, crc32,
    data_name,
) -> dict:
    """dump.json record of a tensor leaf (spec 3.3), keys in upstream order."""
    record: dict[str, Any] = {"type": type_, "dtype": dtype, "shape": shape}
    if dtype in S.BOOL_DTYPES:
        record["Max"] = None if max_ is None else bool(max_)
        record["Min"] = None if min_ is None else bool(min_)
        record["Mean"] = None
        record["Norm"] = None
    else:
        record["Max"] = max_
        record["Min"] = min_
        record["Mean"] = mean
        record["Norm"] = norm
    if requires_grad is not None:
        record["requires_grad"] = requires_grad
    if max_finite is not None:
        record["Max_except_inf_nan"] = max_finite
    if min_finite is not None:
        record["Min_except_inf_nan"] = min_finite
    if crc32 is not None:
        record["md5"] = crc32
    if data_name is not None:
        record["data_name"] = data_name
    return record


def _put(root: Any, path: Sequence[Union[int, str]], value: Any) -> Any:
    """Store ``value`` at ``path`` below ``root`` (int = list index, str = dict key),
    creating containers on the way; returns the (possibly new) root. Lists are padded
    with None. A component that does not fit the container met (a key into a list) drops
    the leaf.

    >>> _put(None, [1, "a"], 5)
    [None, {'a': 5}]
    """
    if not path:
        return value
    if not isinstance(root, (list, dict)):
        root = [] if isinstance(path[0], int) else {}
    node = root
    last = len(path) - 1
    for depth, part in enumerate(path):
        if isinstance(node, list):
            if not isinstance(part, int) or part < 0:
                return root
            if len(node) <= part:
                node.extend([None] * (part + 1 - len(node)))
            slot = part
        else:
            slot = part if isinstance(part, str) else str(part)
        if depth == last:
            node[slot] = value
            break
        child = node[slot] if isinstance(node, list) else node.get(slot)
        if not isinstance(child, (list, dict)):
            child = [] if isinstance(path[depth + 1], int) else {}
            node[slot] = child
        node = child
    return root


# --- entries -----------------------------------------------------------------------------
def _order_entries(entries: dict[str, _Entry]) -> list[str]:
    """Entry names in output order: first appearance, except that ``P.parameters_grad``
    follows the first ``P.forward.<n>`` entry when the step has one."""
    anchor_of: dict[str, str] = {}
    first_forward: dict[str, str] = {}
    for name in entries:
        match = _FORWARD_COUNTER.search(name)
        if match is not None:
            first_forward.setdefault(name[: match.start()], name)
    for name, entry in entries.items():
        if entry.kind == S.PARAMETERS_GRAD and name.endswith(_PG_SUFFIX):
            anchor = first_forward.get(name[: -len(_PG_SUFFIX)])
            if anchor is not None:
                anchor_of[name] = anchor
    followers: dict[str, list[str]] = {}
    for name, anchor in anchor_of.items():
        followers.setdefault(anchor, []).append(name)
    order: list[str] = []
    for name in entries:
        if name in anchor_of:
            continue
        order.append(name)
        order.extend(followers.get(name, ()))
    return order


def _entry_value(entry: _Entry) -> Any:
    if entry.kind == S.DEBUG_SAVE:
        return entry.values.get("")
    value: dict[str, Any] = {}
    for key in entry.keys:
        if key == S.IS_RECOMPUTE:
            value[key] = entry.is_recompute
        elif key in entry.values:
            value[key] = entry.values[key]
        elif key in S.DICT_ROOTS:
            value[key] = {}
        elif entry.kind == S.PARAMETERS_GRAD:
            value[key] = [None]
        else:
            value[key] = []
    return value


def _pylist(column: Union[pa.Array, pa.ChunkedArray]) -> list:
    """``column.to_pylist()``, several times faster for the column types of the log.

    Numbers and booleans go through numpy (nulls restored as None afterwards), strings
    through an object array, ``list<int64>`` through its flat values and offsets.
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return column.to_numpy(zero_copy_only=False).tolist()
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        if column.null_count == 0:
            return column.to_numpy(zero_copy_only=False).tolist()
        fill = False if pa.types.is_boolean(kind) else 0
        values = pc.fill_null(column, fill).to_numpy(zero_copy_only=False).tolist()
        nulls = column.is_null().to_numpy(zero_copy_only=False).tolist()
        return [None if null else value for value, null in zip(values, nulls)]
    if pa.types.is_list(kind) and pa.types.is_integer(kind.value_type):
        offsets = column.offsets.to_numpy().tolist()
        flat = column.values.to_numpy(zero_copy_only=False).tolist()
        nulls = column.is_null().to_numpy(zero_copy_only=False).tolist()
        return [
            None if nulls[i] else flat[offsets[i]:offsets[i + 1]] for i in range(len(column))
        ]
    return column.to_pylist()


def build_entries(rows: pa.Table) -> tuple[list[str], dict[str, _Entry]]:
    """Build dump.json entries from the rows of one rank (any steps, any order).

    Returns ``(order, entries)``: entry names in dump.json order and the internal entry
    objects (use :func:`entry_values` for the JSON values). Rules (brief and spec 3.2):

    1. call rows in ``seq`` order; one entry per ``name``, keys in order of first
       appearance across rows; ``parent``, ``stack_id``, ``is_recompute`` from the first
       row where they are set.
    2. leaf rows (``seq`` of their call) in (``seq``, row order) fill ``values[io]`` by
       ``path``; a later leaf at the same path replaces an earlier one.
    3. ``P.parameters_grad`` follows the first ``P.forward.<n>`` entry.
    """
    builder = EntryBuilder()
    builder.add(rows)
    return builder.order(), builder.entries


class EntryBuilder:
    """:func:`build_entries`, fed in parts: ``add(rows)`` for each new batch of rows.

    Feeding the rows of one step in parts whose ``seq`` ranges follow each other (what
    :meth:`store.log_writer.LogWriter.take_step` hands out) builds the same entries as one
    :func:`build_entries` over all of them; :meth:`add` returns the names of the entries
    the part created or changed, so an exporter re-encodes only those.
    """

    def __init__(self) -> None:
        self.entries: dict[str, _Entry] = {}
        self._entry_of_seq: dict[int, _Entry] = {}
        self._keys_cache: dict[Optional[str], list[str]] = {}
        self._path_cache: dict[Optional[str], list] = {}
        self.max_seq = -1

    def order(self) -> list[str]:
        """Entry names in dump.json order (:func:`_order_entries`)."""
        return _order_entries(self.entries)

    def add(self, rows: pa.Table) -> set[str]:
        """Apply ``rows`` (call and leaf rows; other rows are ignored); returns the names
        of the entries created or changed."""
        touched: set[str] = set()
        if rows.num_rows == 0:
            return touched
        rows = rows.sort_by([(S.SEQ, "ascending")])  # stable: row order kept within a seq
        is_call = pc.equal(rows[S.ROW], S.ROW_CALL)
        call_rows = rows.filter(is_call)
        calls = {name: _pylist(call_rows[name]) for name in _CALL_COLUMNS}
        entries = self.entries
        entry_of_seq = self._entry_of_seq
        keys_cache = self._keys_cache
        for seq, kind, name, parent, stack_id, is_recompute, keys_text in zip(
            *(calls[c] for c in _CALL_COLUMNS)
        ):
            if name is None:
                continue
            keys = keys_cache.get(keys_text)
            if keys is None:
                keys = json.loads(keys_text) if keys_text else []
                keys_cache[keys_text] = keys
            entry = entries.get(name)
            if entry is None:
                entry = entries[name] = _Entry(name=name, kind=kind, keys=list(keys))
            else:
                for key in keys:
                    if key not in entry.keys:
                        entry.keys.append(key)
            if entry.parent is None:
                entry.parent = parent
            if entry.stack_id is None:
                entry.stack_id = stack_id
            if entry.is_recompute is None:
                entry.is_recompute = is_recompute
            entry_of_seq[seq] = entry
            touched.add(name)
            if seq is not None and seq > self.max_seq:
                self.max_seq = seq

        leaf_rows = rows.filter(pc.equal(rows[S.ROW], S.ROW_LEAF))
        leaves = {name: _pylist(leaf_rows[name]) for name in _LEAF_COLUMNS}
        path_cache = self._path_cache
        for (
            seq, io, path_text, leaf_kind, type_, dtype, shape, max_, min_, mean, norm,
            requires_grad, max_finite, min_finite, crc32, data_name, value_json,
        ) in zip(*(leaves[c] for c in _LEAF_COLUMNS)):
            if seq is not None and seq > self.max_seq:
                self.max_seq = seq  # a later part holding this seq's call row is out of order
            entry = entry_of_seq.get(seq)
            if entry is None:
                continue
            if leaf_kind == S.LEAF_TENSOR:
                value = _tensor_record(
                    type_, dtype, shape, max_, min_, mean, norm, requires_grad, max_finite,
                    min_finite, crc32, data_name,
                )
            elif leaf_kind == S.LEAF_VALUE:
                value = json.loads(value_json) if value_json is not None else None
            elif leaf_kind == S.LEAF_EMPTY_LIST:
                value = []
            elif leaf_kind == S.LEAF_EMPTY_DICT:
                value = {}
            else:
                value = None
            path = path_cache.get(path_text)
            if path is None:
                path = json.loads(path_text) if path_text else []
                path_cache[path_text] = path
            key = io if io is not None else ""
            root = entry.values.get(key)
            if len(path) == 1 and type(path[0]) is int and (root is None or type(root) is list):
                index = path[0]  # the common case of _put, inline: element `index` of a list
                if root is None:
                    root = []
                if index >= 0:
                    if len(root) <= index:
                        root.extend([None] * (index + 1 - len(root)))
                    root[index] = value
                entry.values[key] = root
            else:
                entry.values[key] = _put(root, path, value)
            touched.add(entry.name)
        return touched


def entry_values(order: Sequence[str], entries: Mapping[str, _Entry]) -> dict[str, Any]:
    """``{name: entry value}`` in ``order`` (the ``data`` object of dump.json)."""
    return {name: _entry_value(entries[name]) for name in order}


# --- files -------------------------------------------------------------------------------
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


class _NotPlainJson(Exception):
    """Internal: a value :func:`dumps_indent1` leaves to :func:`json.dumps`."""


_ENCODE_STR = json.encoder.encode_basestring_ascii
_INF = float("inf")


def _float_text(value: float) -> str:
    if value != value:
        return "NaN"
    if value == _INF:
        return "Infinity"
    if value == -_INF:
        return "-Infinity"
    return float.__repr__(value)


def _encode(value: Any, indent: str, out: list) -> None:
    """Append the ``indent=1`` JSON text of ``value`` (nested at ``indent``) to ``out``.
    Scalars inside containers are encoded inline (no call per scalar)."""
    kind = type(value)
    if kind is dict:
        if not value:
            out.append("{}")
            return
        inner = indent + " "
        separator = "{\n" + inner
        for key, item in value.items():
            if type(key) is not str:
                raise _NotPlainJson
            out.append(separator)
            out.append(_ENCODE_STR(key))
            out.append(": ")
            kind = type(item)
            if kind is str:
                out.append(_ENCODE_STR(item))
            elif kind is float:
                out.append(float.__repr__(item) if item - item == 0.0 else _float_text(item))
            elif item is None:
                out.append("null")
            elif kind is bool:
                out.append("true" if item else "false")
            elif kind is int:
                out.append(int.__repr__(item))
            else:
                _encode(item, inner, out)
            separator = ",\n" + inner
        out.append("\n" + indent + "}")
    elif kind is list:
        if not value:
            out.append("[]")
            return
        inner = indent + " "
        separator = "[\n" + inner
        for item in value:
            out.append(separator)
            kind = type(item)
            if kind is str:
                out.append(_ENCODE_STR(item))
            elif kind is float:
                out.append(float.__repr__(item) if item - item == 0.0 else _float_text(item))
            elif item is None:
                out.append("null")
            elif kind is bool:
                out.append("true" if item else "false")
            elif kind is int:
                out.append(int.__repr__(item))
            else:
                _encode(item, inner, out)
            separator = ",\n" + inner
        out.append("\n" + indent + "]")
    elif kind is str:
        out.append(_ENCODE_STR(value))
    elif kind is float:
        out.append(_float_text(value))
    elif value is None:
        out.append("null")
    elif kind is bool:
        out.append("true" if value else "false")
    elif kind is int:
        out.append(int.__repr__(value))
    else:
        raise _NotPlainJson


def dumps_indent1(obj: Any) -> str:
    r"""Exactly ``json.dumps(obj, indent=1)`` (ASCII, NaN/Infinity tokens), several times
    faster for plain values: Python's C encoder is not used when ``indent`` is set.

    Plain values are ``dict`` with ``str`` keys, ``list``, ``str``, ``int``, ``float``,
    ``bool`` and ``None`` (exact types); anything else falls back to :func:`json.dumps`.

    >>> dumps_indent1({"a": [1, 2.5], "b": {}})
    '{\n "a": [\n  1,\n  2.5\n ],\n "b": {}\n}'
    """
    out: list[str] = []
    try:
        _encode(obj, "", out)
    except (_NotPlainJson, RecursionError):
        return json.dumps(obj, indent=1)
    return "".join(out)


def _dumps(obj: Any) -> str:
    return dumps_indent1(obj)


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
        meta: ``task``, ``level``, ``framework``, ``dump_data_dir``, ``rank_dir``.
        out_dir: the rank directory (``{dump_path}/step{N}/{rank_dir}``); created with
            mode 0o750 if missing.
        payloads, write_tensor, done: see :func:`export_tensors`.
    Returns:
        The three files written, in the order above (tensor files are not listed).
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


def _write_step(order: list[str], entries: Mapping[str, _Entry], chunks: Optional[dict[str, str]],
                stacks: Mapping[int, Sequence[str]], meta: Mapping[str, Any],
                out_dir: Union[str, os.PathLike], rows: Callable[[], pa.Table], *,
                payloads: Optional[PayloadReader], write_tensor: Optional[TensorFileWriter],
                done: Optional[set]) -> list[Path]:
    """The files of :func:`export_step` from built entries (``chunks``: cache of encoded
    entries, see :func:`_dump_text`; ``rows()``: the step's rows, for tensor files)."""
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
    for file_name, text in (
        (DUMP_FILE, _dump_text(meta, level, order, entries, chunks)),
        (STACK_FILE, _items_text(stack_items, lambda sid: list(stacks[sid]), chunks)),
        (CONSTRUCT_FILE, _items_text(construct, None, chunks)),
    ):
        target = directory / file_name
        atomic_write_text(target, text)
        written.append(target)
    if payloads is not None and write_tensor is not None and meta["task"] != _TASK_STRUCTURE:
        export_tensors(rows(), payloads, write_tensor, directory / TENSOR_DIR, done=done)
    return written


_EMPTY_DATA_TAIL = "{}\n}"


def _dump_text(meta: Mapping[str, Any], level: str, order: Sequence[str], entries: Mapping[str, _Entry],
               chunks: Optional[dict[str, str]]) -> str:
    """dump.json's text, exactly ``dumps_indent1(_top(meta, level, entry_values(...)))``.

    Each entry is encoded on its own (``"name": value`` at the depth of ``data``'s items)
    and the pieces joined; with ``chunks`` (name -> encoded entry) pieces are reused and
    new ones stored, so a live step re-encodes only the entries that changed.
    """
    head = _dumps(_top(meta, level, {}))
    if meta["task"] == _TASK_STRUCTURE or not order or not head.endswith(_EMPTY_DATA_TAIL):
        return _dumps(_top(meta, level, entry_values(order, entries)))
    parts = []
    try:
        for name in order:
            piece = chunks.get(name) if chunks is not None else None
            if piece is None:
                out = [_ENCODE_STR(name), ": "]
                _encode(_entry_value(entries[name]), "  ", out)
                piece = "".join(out)
                if chunks is not None:
                    chunks[name] = piece
            parts.append(piece)
    except (_NotPlainJson, RecursionError):
        return _dumps(_top(meta, level, entry_values(order, entries)))
    return head[: -len(_EMPTY_DATA_TAIL)] + "{\n  " + ",\n  ".join(parts) + "\n }\n}"


def _items_text(items: Sequence[tuple[str, Any]], expand: Optional[Callable[[Any], Any]],
                chunks: Optional[dict]) -> str:
    """``dumps_indent1(dict(...))`` of a top-level object given as ``(key, token)`` pairs,
    the value being ``expand(token)`` (or the token itself). With ``chunks``, the text of
    each ``(key, token)`` member is cached (tokens are immutable: stack ids, parent names)."""
    if not items:
        return "{}"
    parts = []
    try:
        for key, token in items:
            cache_key = (_ITEMS, key, token)
            piece = chunks.get(cache_key) if chunks is not None else None
            if piece is None:
                out = [_ENCODE_STR(key), ": "]
                value = expand(token) if expand is not None else token
                _encode(value, " ", out)
                piece = "".join(out)
                if chunks is not None:
                    chunks[cache_key] = piece
            parts.append(piece)
    except (_NotPlainJson, RecursionError):
        return _dumps({key: (expand(token) if expand is not None else token) for key, token in items})
    return "{\n " + ",\n ".join(parts) + "\n}"


_ITEMS = object()  # cache-key tag of _items_text members (never equal to an entry name)


class StepExporter:
    """Live, incremental :func:`export_step` for the step a process is recording.

    :meth:`add` takes each new batch of the step's rows (in the order the log writer
    hands them out); :meth:`write` writes the same bytes :func:`export_step` would write
    for all rows added so far, re-building and re-encoding only the entries the new rows
    touched (``stop()`` then ``step()`` no longer encode the forward entries twice).
    Rows that arrive out of ``seq`` order make the next :meth:`write` rebuild everything.
    """

    def __init__(self) -> None:
        self._tables: list[pa.Table] = []
        self._builder = EntryBuilder()
        self._chunks: dict = {}  # entry name -> dump.json text; (tag, key, value) -> text
        self._stale = False

    def add(self, table: pa.Table) -> None:
        """Add rows of the step (:data:`store.schema.LOG_SCHEMA`); the cached text of the
        entries they touch is dropped (stack.json/construct.json members are keyed by
        their immutable values and stay valid)."""
        if table.num_rows == 0:
            return
        self._tables.append(table)
        if self._stale:
            return
        seqs = table[S.SEQ]
        low = pc.min(seqs).as_py()
        if low is not None and low <= self._builder.max_seq:
            self._stale = True  # out of order: rebuild at the next write
            return
        for name in self._builder.add(table):
            self._chunks.pop(name, None)

    def rows(self) -> pa.Table:
        """All rows added so far, as one table."""
        return pa.concat_tables(self._tables) if self._tables else S.LOG_SCHEMA.empty_table()

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
                           payloads=payloads, write_tensor=write_tensor, done=done)


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
    it, or copies where links are impossible. Names in ``done`` (updated in place) are
    skipped: the live session passes the names written at an earlier ``stop()`` of the
    same step. A payload that cannot be read (its shard was never written because the
    process died) is logged and skipped. A ``data_name`` longer than the file-name limit
    is written under a short name recorded in ``mapping.csv``
    (:mod:`store.tensor_names`).

    Returns:
        The ``data_name`` s written.
    Raises:
        OSError: a tensor file could not be written.
    """
    leaves = rows.filter(pc.equal(rows[S.ROW], S.ROW_LEAF))
    leaves = leaves.filter(pc.invert(pc.is_null(leaves[S.PAYLOAD])))
    if not leaves.num_rows:
        return []
    names = leaves[S.DATA_NAME].to_pylist()
    refs = leaves[S.PAYLOAD].to_pylist()
    directory = make_dirs(tensor_dir)
    limit = name_limit(directory)
    first: dict[str, Path] = {}
    written: list[str] = []
    mapped: dict[str, str] = {}
    done = done if done is not None else set()
    try:
        for name, ref in zip(names, refs):
            if not name or name in done or "/" in name or "\\" in name or name.startswith("."):
                continue
            file_name = disk_name(name, limit)
            if _write_one(directory, name, file_name, ref, first, payloads, write_tensor, limit):
                if file_name != name:
                    mapped[name] = file_name
                done.add(name)
                written.append(name)
    finally:
        update_mapping(directory, mapped)
    return written


def _write_one(directory: Path, name: str, file_name: str, ref: str, first: dict[str, Path],
               payloads: PayloadReader, write_tensor: TensorFileWriter, limit: int) -> bool:
    """Write one tensor file of :func:`export_tensors`; False when its payload is unreadable."""
    target = directory / file_name
    source = first.get(ref)
    if source is None:
        source = payloads.earlier_file(ref)  # live export: a file of this payload moved in earlier
    if source is None and payloads.take_staged(ref, target):  # written during the step (live export)
        first[ref] = target
    elif source is None:
        try:
            payload = payloads.read(ref)
        except (OSError, ValueError, StoreError) as exc:  # missing, truncated or corrupted shard
            logger.warning("msprobe: tensor %s not exported: payload %s unreadable (%s)", name[:300], ref, exc)
            return False
        tmp = directory / tmp_name(file_name, limit)
        try:
            write_tensor(tmp, payload)
            os.chmod(tmp, 0o640)
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        first[ref] = target
    else:
        _link_or_copy(source, target, limit)
    return True


def _link_or_copy(source: Path, target: Path, limit: int = 255) -> None:
    """Make ``target`` a hard link to ``source`` (a copy where links are impossible)."""
    tmp = target.with_name(tmp_name(target.name, limit))
    try:
        os.unlink(tmp)
    except OSError:
        pass
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
        os.chmod(tmp, 0o640)
    os.replace(tmp, target)


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
    atomic_write_text(target, _dumps(_top(meta, LEVEL_DEBUG, entry_values(order, entries))))
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
        skipped: unreadable log parts (torn tails) and groups that could not be exported
            (``offset`` -1, ``path`` the log directory or rank).
    """

    written: tuple[Path, ...]
    groups: tuple[tuple[int, int], ...]
    skipped: tuple[Skipped, ...]


def _marker_metas(rows: pa.Table) -> list[tuple[int, int, dict]]:
    """(seq, step, meta) of the marker rows of one rank, by seq."""
    markers = rows.filter(pc.equal(rows[S.ROW], S.ROW_MARKER)).select([S.SEQ, S.STEP, S.META])
    found = []
    for seq, step, meta_text in zip(*(markers[c].to_pylist() for c in (S.SEQ, S.STEP, S.META))):
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
) -> ExportReport:
    """Rebuild the dump layout from the log under ``dump_path`` (every rank and step).

    For each rank, each step with call or marker rows becomes
    ``{out or dump_path}/step{N}/{rank_dir}/`` via :func:`export_step`, with the meta of
    the rank's latest marker at or before step N (the earliest marker when none is). A
    rank whose meta says level ``debug`` becomes ``{out}/{rank_dir}/debug.json`` instead.
    Idempotent: running it twice writes the same bytes. ``tensor_writers`` maps a
    ``framework`` (meta) to its tensor-file callback; with one for the rank's framework,
    the tensor files of task ``tensor`` are rebuilt from the payload shards too.

    Raises:
        LogNotFoundError: no log under ``dump_path``.
        OSError: a file could not be written.
    """
    contents = read_log(dump_path)
    root = Path(out) if out is not None else Path(dump_path)
    log_dir = str(Path(dump_path) / S.STORE_DIR / S.LOG_DIR)
    table = contents.table.filter(pc.not_equal(contents.table[S.ROW], S.ROW_STACK))
    table = table.sort_by([(S.RANK, "ascending"), (S.STEP, "ascending"), (S.SEQ, "ascending")])
    written: list[Path] = []
    groups: list[tuple[int, int]] = []
    skipped: list[Skipped] = list(contents.skipped)
    payloads = PayloadReader(dump_path)
    writers = tensor_writers or {}
    ranks = table[S.RANK].to_numpy()
    steps = table[S.STEP].to_numpy()
    for rank_start, rank_stop in _runs(ranks):
        rank = int(ranks[rank_start])
        rank_rows = table.slice(rank_start, rank_stop - rank_start)
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
                continue
            rank_steps = steps[rank_start:rank_stop]
            for step_start, step_stop in _runs(rank_steps):
                step = int(rank_steps[step_start])
                if step < 0:
                    continue
                meta = _meta_for_step(markers, step)
                _check_meta(meta)
                step_rows = rank_rows.slice(step_start, step_stop - step_start)
                out_dir = root / f"step{step}" / meta["rank_dir"]
                written += export_step(step_rows, contents.stacks, meta, out_dir, payloads=payloads,
                                       write_tensor=writers.get(meta.get("framework")))
                groups.append((rank, step))
        except ExportError as exc:
            skipped.append(Skipped(log_dir, -1, f"rank {rank}: {exc}; not exported"))
    return ExportReport(written=tuple(written), groups=tuple(groups), skipped=tuple(skipped))


def _runs(values: np.ndarray) -> list[tuple[int, int]]:
    """``[(start, stop)]`` of runs of equal values in a sorted 1-d array."""
    if len(values) == 0:
        return []
    cuts = np.flatnonzero(values[1:] != values[:-1]) + 1
    bounds = [0, *cuts.tolist(), len(values)]
    return list(zip(bounds[:-1], bounds[1:]))
