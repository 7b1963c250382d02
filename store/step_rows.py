"""The rows the log writer hands the live exporter: Python columns, not read back from Arrow.

When :class:`store.log_writer.LogWriter` flushes, it turns the pending records into one
Python list per column and those into the Arrow record batch it writes to the log. A
:class:`Part` keeps, beside that batch, the lists of the batch's call and leaf rows that
:class:`store.entries.EntryBuilder` reads (:data:`store.entries.CALL_COLUMNS` and
:data:`store.entries.LEAF_COLUMNS`), so that the live export need not convert the rows back
from Arrow (``Table.select``, ``combine_chunks``, ``to_pylist``: about half the cost of
building the entries).

The lists hold what reading the batch back would give (``arrow_np.pylist(..., tuples=True)``),
so live and offline export (which reads the log) build their entries from equal values
and write the same bytes. :func:`make_part` checks each column: one whose values all have
the Python type Arrow gives back for the column's type (``str`` for strings, ``float`` for
float64, ``int`` for integers, ``bool`` for booleans, a tuple of ``int`` for ``list<int64>``,
or None) is kept as it is, since such values come back from Arrow equal and of the same type;
any other column (an ``int`` or a numpy float in a float64 column, where Arrow gives a
``float``: ``3`` would be written ``3.0``; a ``str`` subclass; a list shape) is read back from
its Arrow array instead. Columns the writer makes itself (``seq``, the ``keys`` and ``path``
texts) are not checked.

:class:`StepRows` is what :meth:`LogWriter.take_step_rows` returns: the parts of one step,
their columns joined, and the Arrow rows on demand (:meth:`StepRows.table`: tensor files,
debug level, and the rebuild after rows out of ``seq`` order read those).
"""
from __future__ import annotations

from itertools import chain
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa

from store import arrow_np
from store import schema as S
from store.entries import CALL_COLUMNS, LEAF_COLUMNS

__all__ = ["Part", "StepRows", "all_none", "make_part"]

_NONE = type(None)
#: columns the writer builds itself: their values are exact by construction
_WRITER_MADE = frozenset({S.SEQ, S.KEYS, S.PATH})


def _python_type(kind: pa.DataType) -> Optional[type]:
    """The type of the Python values Arrow gives back for a scalar column type."""
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return str
    if pa.types.is_floating(kind):
        return float
    if pa.types.is_boolean(kind):
        return bool
    if pa.types.is_integer(kind):
        return int
    return None


_EXACT = {field.name: _python_type(field.type) for field in S.LOG_SCHEMA}


def all_none(values: list) -> bool:
    """True when every item of the non-empty list ``values`` is None (the ends first: cheap
    for a column with values)."""
    return values[0] is None and values[-1] is None and values.count(None) == len(values)


def _as_logged(name: str, values: list, batch: pa.RecordBatch, start: int) -> list:
    """``values`` (the Python values that became rows ``start`` on of column ``name`` of
    ``batch``) when reading those rows back gives values equal to them and of the same
    types; else the rows read back."""
    if name in _WRITER_MADE or not values or all_none(values):
        return values
    kinds = set(map(type, values))
    kinds.discard(_NONE)
    if not kinds:
        return values
    if name == S.SHAPE:  # list<int64>: tuples of ints
        if kinds == {tuple} and set(map(type, chain.from_iterable(filter(None, values)))) <= {int}:
            return values
    elif len(kinds) == 1 and kinds.pop() is _EXACT[name]:
        return values
    return arrow_np.pylist(batch.column(name).slice(start, len(values)), tuples=True)


class Part:
    """One flushed batch of the log: the batch (rows: ``nc`` calls, ``nl`` leaves, ``ns``
    stacks, then markers) and the Python columns of its call and leaf rows.

    ``steps``: the steps of its call, leaf and marker rows when the writer knows them (a
    frozenset; :meth:`split` then need not read the step column), None otherwise."""

    __slots__ = ("batch", "nc", "nl", "ns", "calls", "leaves", "steps")

    def __init__(self, batch: pa.RecordBatch, nc: int, nl: int, ns: int,
                 calls: list[list], leaves: list[list], steps: Optional[frozenset] = None) -> None:
        self.batch = batch
        self.nc, self.nl, self.ns = nc, nl, ns
        self.calls = calls  # CALL_COLUMNS order
        self.leaves = leaves  # LEAF_COLUMNS order
        self.steps = steps  # the steps of the non-stack rows, None when not known

    def rows(self) -> pa.Table:
        """The call, leaf and marker rows of the batch (stack rows left out), in order."""
        batch, cut = self.batch, self.nc + self.nl
        if not self.ns:
            return pa.Table.from_batches([batch])
        tail = cut + self.ns
        return pa.Table.from_batches([batch.slice(0, cut), batch.slice(tail, batch.num_rows - tail)])

    def split(self, step: Optional[int]) -> tuple[Optional["Part"], Optional["Part"]]:
        """``(taken, kept)``: parts holding the non-stack rows of ``step`` (every step when
        None) and the other non-stack rows, each None when there is none (this part itself
        when it holds only one of the two; its stack rows are ignored, see :meth:`rows`)."""
        batch = self.batch
        n, cut = batch.num_rows, self.nc + self.nl
        if step is None or n == self.ns:
            return (self if n > self.ns else None), None
        if self.steps is not None:  # known without reading the step column
            if int(step) not in self.steps:
                return None, self
            if len(self.steps) == 1:
                return self, None
        steps = arrow_np.values(batch.column(S.STEP))
        not_stack = np.ones(n, dtype=bool)
        not_stack[cut:cut + self.ns] = False
        take = not_stack & (steps == int(step))
        if (take == not_stack).all():
            return (self if take.any() else None), None
        if not take.any():
            return None, self
        return self._subset(take), self._subset(not_stack & ~take)

    def _subset(self, mask: np.ndarray) -> Optional["Part"]:
        """The rows where ``mask`` (one bool per row of the batch) holds; None for none."""
        if not mask.any():
            return None
        nc, nl = self.nc, self.nl
        call_index = np.flatnonzero(mask[:nc]).tolist()
        leaf_index = np.flatnonzero(mask[nc:nc + nl]).tolist()
        table = arrow_np.select(pa.Table.from_batches([self.batch]), mask).combine_chunks()
        return Part(table.to_batches()[0], len(call_index), len(leaf_index), 0,
                    [[column[i] for i in call_index] for column in self.calls],
                    [[column[i] for i in leaf_index] for column in self.leaves])


def make_part(batch: pa.RecordBatch, nc: int, nl: int, ns: int,
              calls: Sequence[list], leaves: Sequence[list], steps: Optional[frozenset] = None) -> Part:
    """The :class:`Part` of a batch just built from Python lists: ``calls``/``leaves`` the
    lists the :data:`CALL_COLUMNS`/:data:`LEAF_COLUMNS` of its call/leaf rows were made from
    (in that order), each kept or replaced by the rows read back (see the module docstring);
    ``steps``: the steps of its call, leaf and marker rows (None: read from the batch when
    :meth:`Part.split` needs them)."""
    call_lists = [_as_logged(name, values, batch, 0) for name, values in zip(CALL_COLUMNS, calls)]
    leaf_lists = [_as_logged(name, values, batch, nc) for name, values in zip(LEAF_COLUMNS, leaves)]
    return Part(batch, nc, nl, ns, call_lists, leaf_lists, steps)


class StepRows:
    """The call, leaf and marker rows of one step taken from the log writer, as parts of
    its flushed batches (in flush order)."""

    def __init__(self, parts: Sequence[Part]) -> None:
        self._parts = list(parts)
        self._table: Optional[pa.Table] = None
        self._taken = False
        self.num_entry_rows = sum(part.nc + part.nl for part in self._parts)  # call and leaf rows

    def take_columns(self) -> tuple[list[list], list[list]]:
        """``(calls, leaves)``: the :data:`CALL_COLUMNS` and :data:`LEAF_COLUMNS` of the
        call and leaf rows, as lists, in the order the rows have in :meth:`table`. Handed
        out once: the parts keep only their batches afterwards (the live exporter holds a
        step's rows until the step ends; at level debug, until the run ends).

        Raises:
            RuntimeError: the columns were taken before.
        """
        if self._taken:
            raise RuntimeError("StepRows.take_columns: the columns were taken before")
        self._taken = True
        calls = self._joined([part.calls for part in self._parts], len(CALL_COLUMNS))
        leaves = self._joined([part.leaves for part in self._parts], len(LEAF_COLUMNS))
        for part in self._parts:
            part.calls = part.leaves = None
        return calls, leaves

    def drop_columns(self) -> None:
        """Free the Python columns without handing them out (their rows will be read from
        :meth:`table`: the live exporter rebuilds after rows out of ``seq`` order)."""
        self._taken = True
        for part in self._parts:
            part.calls = part.leaves = None

    @staticmethod
    def _joined(parts: list[list[list]], width: int) -> list[list]:
        if len(parts) == 1:
            return parts[0]
        joined: list[list] = [[] for _ in range(width)]
        for columns in parts:
            for out, column in zip(joined, columns):
                out += column
        return joined

    def seq_min(self) -> Optional[int]:
        """The smallest ``seq`` of the call and leaf rows (None without any; call before
        :meth:`take_columns`)."""
        lows = [min(column) for part in self._parts for column in (part.calls[0], part.leaves[0]) if column]
        return min(lows) if lows else None

    def table(self) -> pa.Table:
        """The rows as one table with :data:`store.schema.LOG_SCHEMA` (built once; a column
        may hold several chunks)."""
        if self._table is None:
            tables = [part.rows() for part in self._parts]
            self._table = pa.concat_tables(tables) if tables else S.LOG_SCHEMA.empty_table()
        return self._table
