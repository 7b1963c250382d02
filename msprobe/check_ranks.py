"""``msprobe check-ranks``: find the first tensor on which data-parallel replicas disagree.

For each rank group (default: every rank of the recorded world size) and step, the
``replicas`` view (:mod:`store.replicas`) lines the ranks' records of one tensor up. This
module picks the first row (by step, call position, entry name where ranks that recorded
different calls put two entries at one position, inputs before outputs) that does not
agree among the checked rows (by default those that must agree, ``must_agree``:
parameters, replicated collective outputs, outputs of calls whose inputs agreed; every
tensor with ``all_calls``), splits its ranks into clusters of equal fingerprints (CRC-32
where every rank has one, else statistics within ``tol``), names the majority and the odd
ranks out, says whether it looks like an input difference or a corruption, and measures
how far the odd ranks' disagreement spreads afterwards, in causal order, among the
tensors the majority ranks hold alike (:func:`_downstream`).

Reads our dump paths (the event log and its Parquet parts, one step of one rank group at a
time: :class:`_Source`) and upstream layouts (``step{N}/rank{R}/dump.json``, loaded whole;
``msprobe.compare.load``). Imports no deep-learning framework.
"""
from __future__ import annotations

import contextlib
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

import duckdb

from store import schema as S
from store.manifest import LOG_FILE
from store.replicas import CATEGORIES, VIEW_REPLICAS, create_replicas_view, default_groups, group_text

__all__ = ["Disagreement", "GroupResult", "RankCheck", "check_ranks", "format_report"]

#: what the default check compares besides parameters and collectives: outputs of calls
#: whose inputs agreed (``must_agree`` rows of category ``call`` in store.replicas)
SAME_INPUTS = "call outputs from agreeing inputs"
_BACKWARD = re.compile(r"\.backward(\.[0-9]+)?$")

#: verdicts of a disagreement
INPUT_DIFFERENCE = "input difference"
CORRUPTION = "corruption suspected"
NOT_SYNCHRONISED = "replicas not synchronised"
NO_MAJORITY = "no majority"


@dataclass(frozen=True, kw_only=True, slots=True)
class Disagreement:
    """The first tensor of a group on which ranks disagree.

    Attributes:
        step, name, io, arg, category: the tensor (``category`` as in store.replicas).
        by: ``"crc32"`` or ``"statistics"``: what was compared.
        majority: ranks holding the most common value (empty when no value has more
            holders than every other: ``NO_MAJORITY``).
        odd: ranks not in the majority (every rank when there is none).
        values: per rank, the CRC-32 or ``(max, min, mean, norm)`` it recorded.
        verdict: ``input difference``, ``corruption suspected``, ``replicas not
            synchronised`` (a parameter differs at the first recorded step) or ``no majority``.
        first_downstream: the first other entry after the disagreement (causal order:
            a later step, or this step from the origin entry's start on) whose output an
            odd rank records differently from the majority, among tensors the majority
            holds alike; None when none.
        spread: per step from ``step`` on, how many recorded tensors the majority holds
            alike and the odd ranks differently (see :func:`_downstream`).
    """

    step: int
    name: str
    io: str
    arg: str
    category: str
    by: str
    majority: tuple[int, ...]
    odd: tuple[int, ...]
    values: dict
    verdict: str
    first_downstream: Optional[str] = None
    spread: dict = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupResult:
    """One rank group: its members, what was compared, the first disagreement (or None)."""

    ranks: tuple[int, ...]
    steps: tuple[int, ...]
    compared: int
    exact: int
    first: Optional[Disagreement]


@dataclass(frozen=True, kw_only=True, slots=True)
class RankCheck:
    """The result of :func:`check_ranks`; ``exit_code`` is 1 when some group disagrees,
    else 3 when something was not read or not compared (:attr:`incomplete`), else 0
    (everything compared agrees). 3 is compare's "incomplete" status too."""

    path: str
    source: str
    categories: tuple[str, ...]
    tol: float
    groups: tuple[GroupResult, ...]
    #: what was not read or not compared, one line each: damaged or torn log parts,
    #: unverified (format 1) logs, ranks of a group with no records
    notices: tuple[str, ...] = ()

    @property
    def incomplete(self) -> bool:
        """Whether a part of the log was skipped or a rank of a group had no records: the
        "agree" of the other ranks then covers less than was asked."""
        return any(line.startswith("skipped ") for line in self.notices)

    @property
    def exit_code(self) -> int:
        if any(g.first is not None for g in self.groups):
            return 1
        return 3 if self.incomplete else 0


class CheckRanksInputError(ValueError):
    """Bad input to ``check-ranks`` (path, group, step, tolerance); exit status 2."""


def parse_ranks(field_name: str, text: str) -> tuple[int, ...]:
    """``'0-3,6'`` → ``(0, 1, 2, 3, 6)``; raises CheckRanksInputError naming the option."""
    out: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            a = b = -1
        if not part or a < 0 or b < a:
            raise CheckRanksInputError(f"{field_name}: got {text!r}; expected integers >= 0 and ranges a-b "
                                       f"(a <= b), comma separated, e.g. 0-3,6")
        out.update(range(a, b + 1))
    return tuple(sorted(out))


#: the temporary table holding the ``replicas`` rows of the step being checked, without the
#: per-rank lists (``lists=False`` in store.replicas); the ``replicas`` view with the lists
#: is built only for a step whose values are needed (a disagreement and what follows it)
_STEP_TABLE = "msprobe_step_replicas"
_FLAGS_VIEW = "msprobe_replica_flags"
#: ranks of a group read at once within a step: the partial ``replicas`` rows of each such
#: batch (store.replicas.partial_sql) are merged, so memory is that of this many rank-steps
RANKS_PER_READ = 64
#: the log columns a step's source relation is built from (store.replicas.log_source_sql
#: over the step's rows and their ``calls``), and those read dictionary-encoded
_SOURCE_COLUMNS = (S.RANK, S.STEP, S.SEQ, S.ROW, S.NAME, S.KIND, S.PARENT, S.IO, S.ARG, S.LEAF_KIND, S.DTYPE,
                   S.SHAPE, S.MAX, S.MIN, S.MEAN, S.NORM, S.CRC32, S.REQUIRES_GRAD, S.VALUE_JSON, LOG_FILE)
_DICTIONARY_COLUMNS = (S.ROW, S.NAME, S.KIND, S.PARENT, S.IO, S.ARG, S.LEAF_KIND, S.DTYPE, LOG_FILE)


class _Source:
    """What :func:`check_ranks` reads: the ranks and steps present, the recorded world size,
    notices, and per (group, step) a connection whose ``replicas`` view covers that step.

    Our store is read one step of one rank group at a time, :data:`RANKS_PER_READ` ranks
    at a time (:meth:`store.select.StoreReader.narrowed`: those ranks' Parquet parts of that
    step, or that step's rows of the log tail; only :data:`_SOURCE_COLUMNS`, no stack or
    marker parts), whose partial ``replicas`` rows are merged: memory is that of a few
    rank-steps whatever the number of ranks and steps. Only for a step whose per-rank values
    are shown (:meth:`lists`) is the whole step of the group read at once. An upstream
    layout is loaded whole (:func:`msprobe.compare.load.load_side`) into one connection.
    """

    def __init__(self, path: Path, ranks: Optional[Sequence[int]] = None,
                 steps: Optional[Sequence[int]] = None) -> None:
        self.path = path
        self.reader = None
        self.con: Optional[duckdb.DuckDBPyConnection] = None
        if (path / S.STORE_DIR / S.LOG_DIR).is_dir() or (path / S.STORE_DIR / "parquet").is_dir():
            from store.select import StoreReader

            self.reader = StoreReader(path, ranks=ranks, steps=steps)
            self.kind = "log"
            self.ranks = self.reader.rank_values()
            self.steps = self.reader.step_values()
            self.world_size = _world_size(self.reader)
            self.notices = self.reader.notices()
            return
        from msprobe.compare.errors import CompareInputError
        from msprobe.compare.load import load_side

        try:
            side = load_side(path, "DUMP_PATH")
        except CompareInputError as exc:
            raise CheckRanksInputError(str(exc)) from None
        self.con = duckdb.connect(":memory:")
        self.con.register("up_calls", side.calls)
        self.con.register("up_leaves", side.leaves)
        self.source = (
            "SELECT l.rank, l.step, c.pos, l.name, c.kind, l.io, l.arg, l.leaf_kind, l.dtype, l.shape, "
            "l.max, l.min, l.mean, l.norm, l.crc32, l.requires_grad, l.value_json, c.parent FROM up_leaves l JOIN "
            "(SELECT rank, step, name, kind, parent, row_number() OVER (PARTITION BY rank, step ORDER BY seq) AS pos "
            "FROM up_calls) c USING (rank, step, name)")
        self.kind = "dump.json"
        self.ranks = sorted(set(side.calls.column("rank").to_pylist()))
        present = set(side.calls.column("step").to_pylist())
        self.steps = sorted(present & set(steps) if steps else present)
        self.world_size = None
        self.notices = []

    def set_groups(self, groups: list[list[int]], tol: float) -> None:
        """Check ``groups`` with the statistics tolerance ``tol``."""
        self.groups, self.tol = groups, tol
        if self.con is not None:
            _replica_views(self.con, self.source, groups, tol)

    @contextlib.contextmanager
    def step(self, g: int, step: int):
        """(connection, group index) where table :data:`_STEP_TABLE` holds the ``replicas``
        rows (without the per-rank lists) of step ``step`` of group ``g`` (computed once;
        dropped on exit)."""
        from store.replicas import merged_sql, partial_sql, set_groups

        if self.con is not None:
            con, grp, flags = self.con, g, f"SELECT * FROM {_FLAGS_VIEW}"
        else:
            members = list(self.groups[g])
            con, grp = duckdb.connect(":memory:"), 0
        try:
            if self.con is None:
                set_groups(con, [members])
                for i in range(0, len(members), RANKS_PER_READ):
                    self._read(con, members[i:i + RANKS_PER_READ], step, "msprobe_batch_source")
                    verb = "CREATE TEMP TABLE {} AS " if i == 0 else "INSERT INTO {} "
                    for table, sql in zip(("msprobe_partial_tensors", "msprobe_partial_values"),
                                          partial_sql("SELECT * FROM msprobe_batch_source")):
                        con.execute(verb.format(table) + sql)
                    if len(members) > RANKS_PER_READ:
                        con.execute("DROP TABLE msprobe_batch_source")
                    else:        # the whole step: kept for lists()
                        con.execute("ALTER TABLE msprobe_batch_source RENAME TO msprobe_step_source")
                flags = merged_sql("msprobe_partial_tensors", "msprobe_partial_values", tol=self.tol)
            con.execute(f"CREATE OR REPLACE TEMP TABLE {_STEP_TABLE} AS SELECT * FROM ({flags}) "
                        f"WHERE grp = ? AND step = ?", [grp, step])
            yield con, grp
        finally:
            if self.con is None:
                con.close()
            else:
                con.execute(f"DROP TABLE IF EXISTS {_STEP_TABLE}")

    def lists(self, con: duckdb.DuckDBPyConnection, g: int, step: int) -> None:
        """Make the ``replicas`` view (with the per-rank lists) of step ``step`` of group
        ``g`` available on ``con``, a connection of :meth:`step`: our store's step is read
        whole (every rank of the group) once per connection."""
        from store.query import relation_exists

        if self.con is not None or relation_exists(con, VIEW_REPLICAS):
            return
        if not relation_exists(con, "msprobe_step_source"):
            self._read(con, list(self.groups[g]), step, "msprobe_step_source")
        create_replicas_view(con, "SELECT * FROM msprobe_step_source", [list(self.groups[g])], tol=self.tol)

    def _read(self, con: duckdb.DuckDBPyConnection, ranks: list, step: int, table: str) -> None:
        """Table ``table`` on ``con``: the source relation (store.replicas) of ``ranks`` at
        ``step``, read from our store."""
        from store.query import calls_sql
        from store.replicas import log_source_sql

        rows = self.reader.narrowed(ranks=ranks, steps=[step]).table(
            columns=_SOURCE_COLUMNS, side_rows=False, dictionary=_DICTIONARY_COLUMNS)
        con.register("msprobe_step_rows", rows)
        try:
            con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS " + log_source_sql(
                "msprobe_step_rows", f"({calls_sql('msprobe_step_rows', (S.PARENT,))})"))
        finally:
            con.unregister("msprobe_step_rows")

    def close(self) -> None:
        if self.con is not None:
            self.con.close()


def _replica_views(con: duckdb.DuckDBPyConnection, source_sql: str, groups, tol: float) -> None:
    """The ``replicas`` view and its list-less twin :data:`_FLAGS_VIEW` over ``source_sql``."""
    create_replicas_view(con, source_sql, groups, tol=tol, lists=False, name=_FLAGS_VIEW)
    create_replicas_view(con, source_sql, groups, tol=tol)


def _world_size(reader) -> Optional[int]:
    """The recorded world size (:func:`store.replicas.recorded_world_size`) from the marker
    rows of the selection (:meth:`store.select.StoreReader.markers`)."""
    from store.replicas import recorded_world_size

    con = duckdb.connect(":memory:")
    try:
        con.register("msprobe_markers", reader.markers())
        return recorded_world_size(con, "msprobe_markers")
    finally:
        con.close()


def _fingerprint(row: dict, i: int, exact: bool):
    if exact:
        return row[S.CRC32][i]
    return tuple(row[c][i] for c in (S.MAX, S.MIN, S.MEAN, S.NORM))


def _close(a, b, tol: float, exact: bool) -> bool:
    if exact:
        return a == b
    for x, y in zip(a, b):
        if x is None or y is None:
            if x is not y:
                return False
            continue
        if not (math.isfinite(x) and math.isfinite(y)):   # NaN, +-Inf: equal to themselves only
            if not (x == y or (math.isnan(x) and math.isnan(y))):
                return False
            continue
        if x != y and abs(x - y) > tol * max(abs(x), abs(y)):
            return False
    return True


def _clusters(row: dict, tol: float) -> tuple[list[list[int]], bool]:
    """Ranks of ``row`` split into clusters of equal fingerprints (largest first), and
    whether CRC-32s were compared. dtype and shape are part of the fingerprint."""
    exact = bool(row["exact"])
    clusters: list[tuple[object, list[int]]] = []
    for i, rank in enumerate(row["ranks"]):
        fp = (row[S.DTYPE][i], tuple(row[S.SHAPE][i] or ()), _fingerprint(row, i, exact))
        for key, members in clusters:
            if key[:2] == fp[:2] and _close(key[2], fp[2], tol, exact):
                members.append(rank)
                break
        else:
            clusters.append((fp, [rank]))
    ordered = sorted((m for _, m in clusters), key=lambda m: (-len(m), m[0]))
    return ordered, exact


def _majority(clusters: list[list[int]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    every = tuple(sorted(r for c in clusters for r in c))
    if len(clusters) > 1 and len(clusters[0]) == len(clusters[1]):
        return (), every
    majority = tuple(sorted(clusters[0]))
    return majority, tuple(r for r in every if r not in majority)


def _rows(con, sql: str, params: Sequence = ()) -> list[dict]:
    cur = con.execute(sql, list(params))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def _verdict(row: dict, majority: tuple, first_step: int) -> str:
    if row["category"] == "call" and row["io_order"] == 0 and not row[S.REQUIRES_GRAD]:
        return INPUT_DIFFERENCE
    if not majority:
        return NO_MAJORITY
    if row["category"] == "parameter" and row[S.STEP] == first_step:
        return NOT_SYNCHRONISED
    return CORRUPTION


def _majority_agrees(row: dict, majority: tuple[int, ...], tol: float) -> Optional[list]:
    """The cluster of ``row`` holding every rank of ``majority`` that recorded it (None
    when those ranks do not hold one value, or fewer than two of them recorded it)."""
    present = [r for r in majority if r in row["ranks"]]
    if len(present) < 2:
        return None
    clusters, _ = _clusters(row, tol)
    ref = next(c for c in clusters if present[0] in c)
    return ref if all(r in ref for r in present) else None


def _entry_start(con, g: int, row: dict) -> int:
    """The first call position at which ``row``'s entry can have had an effect: the
    smallest position of the entry and of every entry nested in it (a module's forward
    entry comes after the calls it made, but its parameters and inputs were used by them)."""
    tree = con.execute(f"SELECT DISTINCT name, parent, pos FROM {_STEP_TABLE} WHERE grp = ? AND step = ?",
                       [g, row[S.STEP]]).fetchall()
    parent = {n: p for n, p, _ in tree}
    start = row["pos"]
    for name, _, pos in tree:
        seen, node = 0, name
        while node is not None and node != row[S.NAME] and seen < 64:   # depth guard against a cycle
            node, seen = parent.get(node), seen + 1
        if node == row[S.NAME]:
            start = min(start, pos)
    return start


def _downstream(con, g: int, origin: dict, odd: tuple[int, ...], majority: tuple[int, ...],
                step: int, start: int, tol: float) -> tuple[Optional[str], dict]:
    """In step ``step`` (the origin's or a later one), the first other entry after
    ``origin`` (causal order) whose output an odd rank holds differently from the
    majority, and the count of such tensors (``{step: n}``, empty when none).

    Only tensors the majority ranks hold alike count: a parameter, a replicated collective
    output, a call input on which the majority ranks agree (a parameter passed to an API),
    or an output of a call whose inputs (for a backward call, also its forward's inputs)
    the majority ranks hold alike. Tensors that differ among the majority too
    (data-dependent activations of a data-parallel run) are no effect of the odd rank.
    Causal order: later steps, or the origin's step from the origin entry's start
    ``start`` (:func:`_entry_start`) on, never the origin entry's own inputs.
    """
    rows = _rows(con, f"SELECT * FROM {VIEW_REPLICAS} WHERE grp = ? AND n_ranks > 1 AND step = ? "
                      "ORDER BY pos, name, io_order, io, arg, process_group", [g, step])
    inputs: dict[str, bool] = {}       # entry name -> its inputs agree among the majority
    for r in rows:                     # every entry of the step: a backward's forward may precede the origin
        if r["io_order"] == 0:
            inputs[r[S.NAME]] = inputs.get(r[S.NAME], True) and _majority_agrees(r, majority, tol) is not None
    if step == origin[S.STEP]:
        rows = [r for r in rows if r["pos"] >= start]

    def inputs_agree(name: str) -> bool:
        own = inputs.get(name)
        if name.endswith(".backward") or ".backward." in name:
            fwd = inputs.get(_BACKWARD.sub(r".forward\1", name))
            return fwd is not None and own is not False and fwd
        return bool(own)

    first, count = None, 0
    for r in rows:
        if r["agree"]:
            continue
        if r[S.STEP] == origin[S.STEP] and r[S.NAME] == origin[S.NAME] and r["io_order"] == 0:
            if (r[S.IO], r[S.ARG]) != (origin[S.IO], origin[S.ARG]):
                continue          # the origin entry's other inputs: not its effects
        if r["category"] == "call" and (r[S.NAME].startswith("Distributed.")
                                        or (r["io_order"] == 1 and not inputs_agree(r[S.NAME]))):
            continue
        ref = _majority_agrees(r, majority, tol)
        if ref is None or not any(o in r["ranks"] and o not in ref for o in odd):
            continue
        count += 1
        if first is None and r["io_order"] == 1 and r[S.NAME] != origin[S.NAME]:
            first = r[S.NAME]
    return first, ({step: count} if count else {})


def _check_group(source: _Source, g: int, members: tuple[int, ...], all_calls: bool, tol: float) -> GroupResult:
    """Group ``g`` over the steps of ``source``, in step order, one step at a time: the
    counts of compared tensors, the first disagreement (by step, then call position,
    inputs before outputs) and, from its step on, how far it spreads."""
    checked = "" if all_calls else " AND must_agree"
    compared = exact = 0
    seen: list[int] = []
    row, majority, odd, start = None, (), (), 0
    downstream, spread = None, {}
    for step in source.steps:
        with source.step(g, step) as (con, grp):
            n, n_exact, n_odd = con.execute(
                f"SELECT count(*), count(*) FILTER (WHERE exact), count(*) FILTER (WHERE NOT agree) "
                f"FROM {_STEP_TABLE} WHERE grp = ? AND n_ranks > 1{checked} AND step = ?", [grp, step]).fetchall()[0]
            if n:
                seen.append(step)
                compared += n
                exact += n_exact
            if row is None and n_odd:
                source.lists(con, g, step)
                found = _rows(con, f"SELECT * FROM {VIEW_REPLICAS} WHERE grp = ? AND n_ranks > 1 AND NOT agree{checked} "
                                   f"AND step = ? ORDER BY pos, name, io_order, io, arg, process_group LIMIT 1", [grp, step])
                if found:
                    row = found[0]
                    majority, odd = _majority(_clusters(row, tol)[0])
                    start = _entry_start(con, grp, row)
            if row is not None and majority:
                source.lists(con, g, step)
                first, counted = _downstream(con, grp, row, odd, majority, step, start, tol)
                downstream = downstream or first
                spread.update(counted)
    if row is None:
        return GroupResult(ranks=members, steps=tuple(seen), compared=compared, exact=exact, first=None)
    exact_row = bool(row["exact"])
    values = {r: _fingerprint(row, i, exact_row) for i, r in enumerate(row["ranks"])}
    first = Disagreement(step=row[S.STEP], name=row[S.NAME], io=row[S.IO], arg=row[S.ARG],
                         category=row["category"], by="crc32" if exact_row else "statistics", majority=majority,
                         odd=odd, values=values, verdict=_verdict(row, majority, seen[0]),
                         first_downstream=downstream, spread=spread)
    return GroupResult(ranks=members, steps=tuple(seen), compared=compared, exact=exact, first=first)


def check_ranks(dump_path: Union[str, os.PathLike], *, groups: Optional[Sequence[Sequence[int]]] = None,
                steps: Optional[Sequence[int]] = None, all_calls: bool = False,
                tol: float = 0.0) -> RankCheck:
    """Compare, per rank group and step, the tensors replicas must agree on.

    Args:
        dump_path: our dump path (with ``.msprobe/log/``) or an upstream layout holding
            ``step{N}/rank{R}/dump.json``.
        groups: rank groups of replicas, e.g. ``[[0, 1, 2, 3]]``; None = ranks
            ``0 .. world_size-1`` of the recorded world size, else the ranks recorded.
        steps: steps to check; None = all.
        all_calls: compare every recorded tensor (a determinism test, where every rank
            gets the same data), not only what must agree (parameters, replicated
            collective outputs, outputs of calls whose inputs agreed: store.replicas).
        tol: relative tolerance of statistics where no CRC-32 was recorded (>= 0).
    Returns:
        A :class:`RankCheck`; ``exit_code`` 1 when some group disagrees, else 3 when a
        log part was skipped or a rank of a group recorded nothing, else 0.
    Raises:
        CheckRanksInputError: the path holds no dump, ``tol`` is bad, or a group is empty.
    """
    p = Path(dump_path)
    if not p.exists():
        raise CheckRanksInputError(f"DUMP_PATH {str(p)!r}: path does not exist")
    if not isinstance(tol, (int, float)) or isinstance(tol, bool) or not 0 <= tol < math.inf:
        raise CheckRanksInputError(f"--tol: got {tol!r}; expected a finite number >= 0")
    wanted = sorted({r for g in groups for r in g}) if groups else None
    source = _Source(p, wanted, steps)
    notices, ranks = source.notices, source.ranks
    try:
        chosen = [list(g) for g in groups] if groups is not None else default_groups(source.world_size, ranks)
        if groups is None and not any(chosen):
            raise CheckRanksInputError("\n".join([f"DUMP_PATH {str(p)!r}: no rank with readable rows to check"]
                                                  + notices))
        if not chosen or any(not g for g in chosen):
            raise CheckRanksInputError(f"--group: got {groups!r}; expected non-empty rank lists")
        for rank in sorted({r for g in chosen for r in g} - set(ranks)):
            if any(line.startswith(f"skipped rank {rank}:") for line in notices):
                continue  # the reader said so already
            notices.append(f"skipped rank {rank}: nothing recorded for it (its log is missing or unreadable); "
                           f"not compared")
        source.set_groups(chosen, float(tol))
        categories = CATEGORIES if all_calls else CATEGORIES[:2] + (SAME_INPUTS,)
        results = tuple(_check_group(source, g, tuple(members), all_calls, float(tol))
                        for g, members in enumerate(chosen))
    finally:
        source.close()
    return RankCheck(path=str(p), source=source.kind, categories=categories, tol=float(tol), groups=results,
                     notices=tuple(notices))


def _value_text(value) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join("NULL" if v is None else repr(v) for v in value) + ")"
    return str(value)


_EXPLAIN = {
    INPUT_DIFFERENCE: "the ranks were fed different data: the first difference is an input no "
                      "recorded call computed (requires_grad false), not a result",
    CORRUPTION: "the ranks computed or hold different values from agreeing records before it",
    NOT_SYNCHRONISED: "a parameter differs at the first recorded step: the replicas were not "
                      "synchronised (initialisation, a missed broadcast) or were corrupted before recording",
    NO_MAJORITY: "no value has more ranks than every other",
}


def format_report(result: RankCheck) -> str:
    """The text ``msprobe check-ranks`` prints (docs/distributed.md shows an example)."""
    lines = []
    for g in result.groups:
        head = f"group ranks {group_text(g.ranks)}: {g.compared} tensor records compared over {len(g.steps)} steps"
        head += f" ({g.exact} by CRC-32, {g.compared - g.exact} by statistics)"
        lines.append(head)
        f = g.first
        if f is None and g.compared == 0:
            why = "one rank: no replicas" if len(g.ranks) < 2 else "no tensor that must agree was recorded on two or more of its ranks"
            lines.append(f"  nothing compared ({why})")
            continue
        if f is None:
            lines.append("  all replicas agree")
            continue
        lines.append(f"  first disagreement: step {f.step}, {f.name} {f.io}.{f.arg} ({f.category}, by {f.by})")
        if f.majority:
            lines.append(f"  odd rank out: {group_text(f.odd)} (majority: ranks {group_text(f.majority)})")
        else:
            lines.append(f"  no majority among ranks {group_text(f.odd)}")
        for rank, value in sorted(f.values.items()):
            lines.append(f"    rank {rank}: {_value_text(value)}")
        lines.append(f"  verdict: {f.verdict}: {_EXPLAIN[f.verdict]}")
        if f.first_downstream:
            lines.append(f"  first downstream call whose output differs: {f.first_downstream}")
        if f.spread:
            lines.append("  tensors that differ on the odd rank, per step: "
                         + ", ".join(f"step {s}: {n}" for s, n in sorted(f.spread.items())))
    checked = ("every recorded tensor" if "call" in result.categories
               else "parameters, collective outputs, " + SAME_INPUTS)
    lines.append(f"checked: {checked}; exit status {result.exit_code}")
    return "\n".join(lines)
