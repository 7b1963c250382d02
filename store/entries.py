"""dump.json entries from log rows (spec section 3.2): the model the exporters encode.

:func:`build_entries` turns the rows of one rank into ordered entries; :class:`EntryBuilder`
does the same fed in parts (the live exporter's incremental path). Rules: call rows in
``seq`` order give one entry per name (keys in order of first appearance; ``parent``,
``stack_id``, ``is_recompute`` from the first row that sets them); leaf rows fill each
key by ``path``; ``{P}.parameters_grad`` follows the step's first ``{P}.forward.{n}``.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Union

import pyarrow as pa

from store import arrow_np
from store import schema as S

__all__ = ["CALL_COLUMNS", "LEAF_COLUMNS", "EntryBuilder", "build_entries", "entry_values"]

_PG_SUFFIX = "." + S.PARAMETERS_GRAD
_FORWARD_COUNTER = re.compile(r"\.forward\.\d+$")
#: the columns of the leaf rows and of the call rows that :class:`EntryBuilder` reads, in
#: the order :meth:`EntryBuilder.add_columns` takes them (``seq`` first)
LEAF_COLUMNS = (S.SEQ, S.IO, S.PATH, S.LEAF_KIND) + tuple(column for column, _ in S.TENSOR_RECORD_KEYS) + (
    S.VALUE_JSON,)
CALL_COLUMNS = (S.SEQ, S.KIND, S.NAME, S.PARENT, S.STACK_ID, S.IS_RECOMPUTE, S.KEYS)
_CACHE_LIMIT = 4096  # distinct keys/path texts an EntryBuilder hands on to the next one


@dataclass(slots=True)
class _Entry:
    """One dump.json entry being built: ``keys`` in order of first appearance (a tuple,
    replaced when a later call row adds keys), ``values`` by top-level key."""

    name: str
    kind: str
    keys: tuple[str, ...]
    parent: Optional[str] = None
    stack_id: Optional[int] = None
    is_recompute: Optional[bool] = None
    values: dict[str, Any] = field(default_factory=dict)


# --- leaf records ------------------------------------------------------------------------
#: Fields of a tensor-leaf record tuple (the :data:`store.schema.LOG_SCHEMA` columns of a
#: tensor leaf row, in this order). EntryBuilder keeps each tensor leaf as such an exact
#: ``tuple`` (``shape`` a tuple of ints too, or None): a tuple of atomic values costs less
#: to build than a dict and the cyclic GC stops tracking it. :func:`_tensor_record` gives
#: its dump.json dict; :func:`store.json_text.records_encoder` writes the same text
#: directly. A value leaf is kept as the 1-tuple ``(value_json,)`` (parsed by
#: :func:`_leaf_value`). No other tuple is ever stored in entry values (parsed JSON holds
#: lists, never tuples); :func:`_plain` turns both kinds into plain JSON.
RECORD_FIELDS = tuple(column for column, _ in S.TENSOR_RECORD_KEYS)
#: where the record fields lie in :data:`LEAF_COLUMNS`, and ``crc32`` in a record
_RECORD_SLICE = slice(LEAF_COLUMNS.index(RECORD_FIELDS[0]), LEAF_COLUMNS.index(RECORD_FIELDS[-1]) + 1)
_CRC32_AT = RECORD_FIELDS.index(S.CRC32)


def _tensor_record(
    type_, dtype, shape, max_, min_, mean, norm, requires_grad, max_finite, min_finite, crc32,
    data_name,
) -> dict:
    """dump.json record of a tensor leaf (spec 3.3), keys in upstream order (``shape``
    given as a tuple becomes a list). A record whose ``crc32`` is an XOR checksum
    (:func:`store.schema.is_xor_checksum`, summary_mode xor) has no statistics keys:
    ``type, dtype, shape, md5, requires_grad[, data_name]``, as upstream 26.x writes it."""
    if type(shape) is tuple:
        shape = list(shape)
    record: dict[str, Any] = {"type": type_, "dtype": dtype, "shape": shape}
    if S.is_xor_checksum(crc32):  # summary_mode xor: the checksum instead of the statistics
        record["md5"] = crc32
        if requires_grad is not None:
            record["requires_grad"] = requires_grad
        if data_name is not None:
            record["data_name"] = data_name
        return record
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


def _leaf_value(leaf: tuple) -> Any:
    """The JSON value of a leaf tuple: the :func:`_tensor_record` dict of a record, the
    parsed text of a value leaf ``(value_json,)`` (a new object on every call)."""
    if len(leaf) == 1:
        return json.loads(leaf[0])
    return _tensor_record(*leaf)


def _plain(value: Any) -> Any:
    """``value`` with every leaf tuple replaced by its :func:`_leaf_value` (new containers
    where something was replaced; others are returned as they are)."""
    kind = type(value)
    if kind is tuple:
        return _leaf_value(value)
    if kind is list:
        return [_plain(item) if type(item) in _NESTED else item for item in value]
    if kind is dict:
        return {key: _plain(item) if type(item) in _NESTED else item for key, item in value.items()}
    return value


_NESTED = (tuple, list, dict)


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
    if type(root) is tuple:
        root = _leaf_value(root)  # a leaf on the way is its value, as when leaves were parsed at once
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
        if type(child) is tuple:
            child = node[slot] = _leaf_value(child)
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


def _entry_raw(entry: _Entry) -> Any:
    """The JSON value of ``entry`` with tensor leaves still as record tuples (what
    :func:`store.json_text.records_encoder` writes; :func:`_entry_value` for plain JSON)."""
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


def _entry_value(entry: _Entry) -> Any:
    """The JSON value of ``entry`` (plain dicts, lists and scalars)."""
    return _plain(_entry_raw(entry))


def _seq_order(seqs: list) -> Optional[list[int]]:
    """None when ``seqs`` (ints, maybe None) never decreases and has no None; else the
    positions in stable ascending order (None last), what a stable sort by ``seq`` gives."""
    previous = None
    for seq in seqs:
        if seq is None or (previous is not None and seq < previous):
            break
        previous = seq
    else:
        return None
    return sorted(range(len(seqs)), key=lambda i: (seqs[i] is None, seqs[i] or 0))


def _rows_as_lists(rows: pa.Table, row_column: pa.Array, row_kind: str, columns: Sequence[str]) -> list[list]:
    """The columns of the rows of one row kind (``row_column``: ``rows``' ROW column,
    chunks combined) as Python lists, in row order (numpy masks and slices, not
    pyarrow.compute: the recording process never loads it); a ``list<int>`` column gives
    tuples."""
    # only the columns used, then one chunk each (fewer, larger conversions)
    part = arrow_np.select(rows.select(list(columns)), arrow_np.equals(row_column, row_kind)).combine_chunks()
    return [arrow_np.pylist(part[name], tuples=True) for name in columns]


def _in_seq_order(lists: list[list]) -> list[list]:
    """Columns (``seq`` first) in stable ``seq`` order (``lists`` itself when already)."""
    order = _seq_order(lists[0])
    if order is None:
        return lists
    return [[values[i] for i in order] for values in lists]


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

    def __init__(self, previous: Optional["EntryBuilder"] = None) -> None:
        """Args:
            previous: a builder whose parsed ``keys``/``path`` texts and checked value
                texts are reused (read-only; not shared once they hold more than
                :data:`_CACHE_LIMIT` texts).
        """
        self.entries: dict[str, _Entry] = {}
        self._entry_of_seq: dict[int, _Entry] = {}
        self._keys_cache: dict[Optional[str], tuple[str, ...]] = {}
        # path text -> (components, list index of a one-int path or -1)
        self._path_cache: dict[Optional[str], tuple[tuple, int]] = {}
        self._value_texts: dict[str, tuple[str]] = {}  # value_json texts json.loads accepted
        if previous is not None:
            if len(previous._keys_cache) <= _CACHE_LIMIT:
                self._keys_cache = previous._keys_cache
            if len(previous._path_cache) <= _CACHE_LIMIT:
                self._path_cache = previous._path_cache
            if len(previous._value_texts) <= _CACHE_LIMIT:
                self._value_texts = previous._value_texts
        self.max_seq = -1

    def order(self) -> list[str]:
        """Entry names in dump.json order (:func:`_order_entries`)."""
        return _order_entries(self.entries)

    def _path(self, path_text: Optional[str]) -> tuple[tuple, int]:
        """``(components, index)`` of a ``path`` text, cached: ``index`` is the list index
        of a path of one non-negative int, -1 for any other path."""
        path = tuple(json.loads(path_text)) if path_text else ()
        index = path[0] if len(path) == 1 and type(path[0]) is int and path[0] >= 0 else -1
        parsed = self._path_cache[path_text] = (path, index)
        return parsed

    def _value(self, value_json: Optional[str]) -> Any:
        """The leaf of a value row: ``(value_json,)``, the text checked by ``json.loads``
        once per builder chain (a bad text raises here, as when it was parsed at once)."""
        if value_json is None:
            return None
        token = self._value_texts.get(value_json)
        if token is None:
            json.loads(value_json)  # ValueError for a text that is not JSON
            token = self._value_texts[value_json] = (value_json,)
        return token

    def add(self, rows: pa.Table) -> set[str]:
        """Apply ``rows`` (call and leaf rows; other rows are ignored); returns the names
        of the entries created or changed."""
        if rows.num_rows == 0:
            return set()
        row_column = rows[S.ROW].combine_chunks()
        return self.add_columns(_rows_as_lists(rows, row_column, S.ROW_CALL, CALL_COLUMNS),
                                _rows_as_lists(rows, row_column, S.ROW_LEAF, LEAF_COLUMNS))

    def add_columns(self, calls: list[list], leaves: list[list]) -> set[str]:
        """:meth:`add` of rows given as Python columns: ``calls`` the :data:`CALL_COLUMNS`
        of the call rows, ``leaves`` the :data:`LEAF_COLUMNS` of the leaf rows, each a list
        per column, in row order, holding what ``arrow_np.pylist(..., tuples=True)`` of
        those rows gives."""
        touched: set[str] = set()
        calls = _in_seq_order(calls)
        entries = self.entries
        entry_of_seq = self._entry_of_seq
        keys_cache = self._keys_cache
        for seq, kind, name, parent, stack_id, is_recompute, keys_text in zip(*calls):
            if name is None:
                continue
            keys = keys_cache.get(keys_text)
            if keys is None:
                keys = tuple(json.loads(keys_text)) if keys_text else ()
                keys_cache[keys_text] = keys
            entry = entries.get(name)
            if entry is None:
                entry = entries[name] = _Entry(name, kind, keys, parent, stack_id, is_recompute)
            else:
                if keys != entry.keys:
                    entry_keys = list(entry.keys)
                    for key in keys:
                        if key not in entry_keys:
                            entry_keys.append(key)
                    entry.keys = tuple(entry_keys)
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

        leaves = _in_seq_order(leaves)
        seqs = leaves[0]
        for seq in reversed(seqs):  # the largest seq: the last one that is set (seq order)
            if seq is not None:
                if seq > self.max_seq:
                    self.max_seq = seq  # a later part holding this seq's call row is out of order
                break
        path_cache = self._path_cache
        records = zip(*leaves[_RECORD_SLICE])  # RECORD_FIELDS: one exact tuple per row, built by zip
        last_seq = entry = values = None
        tensor_kind = S.LEAF_TENSOR
        for seq, io, path_text, leaf_kind, record, value_json in zip(
            seqs, leaves[1], leaves[2], leaves[3], records, leaves[-1],
        ):
            if seq != last_seq or entry is None:
                last_seq = seq
                entry = entry_of_seq.get(seq)
                if entry is None:
                    continue
                values = entry.values
                touched.add(entry.name)
            if leaf_kind == tensor_kind:
                # a tensor leaf's value_json holds extra keys of its record ("alias_of")
                value = record if value_json is None else {**_tensor_record(*record), **json.loads(value_json)}
                if value is record and S.is_xor_checksum(record[_CRC32_AT]):
                    value = _tensor_record(*record)  # no statistics keys: a dict, for every encoder
            elif leaf_kind == S.LEAF_VALUE:
                value = self._value(value_json)
            elif leaf_kind == S.LEAF_EMPTY_LIST:
                value = []
            elif leaf_kind == S.LEAF_EMPTY_DICT:
                value = {}
            else:
                value = None
            path, index = path_cache.get(path_text) or self._path(path_text)
            key = io if io is not None else ""
            root = values.get(key)
            if index >= 0 and (root is None or type(root) is list):
                # the common case of _put, inline: element `index` of a list
                if root is None:
                    values[key] = [None] * index + [value]
                elif len(root) > index:
                    root[index] = value
                else:
                    if len(root) < index:
                        root.extend([None] * (index - len(root)))
                    root.append(value)
            else:
                values[key] = _put(root, path, value)
        return touched


def entry_values(order: Sequence[str], entries: Mapping[str, _Entry]) -> dict[str, Any]:
    """``{name: entry value}`` in ``order`` (the ``data`` object of dump.json)."""
    return {name: _entry_value(entries[name]) for name in order}


# --- files -------------------------------------------------------------------------------
