"""``msprobe check-ranks``: find the first tensor on which data-parallel replicas disagree.

For each rank group (default: every rank of the recorded world size) and step, the
``replicas`` view (:mod:`store.replicas`) lines the ranks' records of one tensor up. This
module picks the first row (by step, call position, inputs before outputs) that does not
agree among the checked categories (``parameter`` and ``collective`` by default; every
tensor with ``all_calls``), splits its ranks into clusters of equal fingerprints (CRC-32
where every rank has one, else statistics within ``tol``), names the majority and the odd
ranks out, says whether it looks like an input difference or a corruption, and measures
how far the odd ranks' disagreement spreads afterwards (every recorded tensor of that
step and the later ones).

Reads our dump paths (the event log) and upstream layouts (``step{N}/rank{R}/dump.json``;
``msprobe.compare.load``). Imports no deep-learning framework.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

import duckdb

from store import schema as S
from store.replicas import CATEGORIES, create_replicas_view, default_groups, group_text

__all__ = ["Disagreement", "GroupResult", "RankCheck", "check_ranks", "format_report"]

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
        first_downstream: the first other entry of the step (call order) whose output an
            odd rank records differently from the majority; None when none.
        spread: per step from ``step`` on, how many recorded tensors (all categories)
            the odd ranks hold differently from the majority.
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
    """The result of :func:`check_ranks`; ``exit_code`` is 0 (all agree) or 1."""

    path: str
    source: str
    categories: tuple[str, ...]
    tol: float
    groups: tuple[GroupResult, ...]

    @property
    def exit_code(self) -> int:
        return 1 if any(g.first is not None for g in self.groups) else 0


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


def _connect(path: Path, ranks: Optional[Sequence[int]] = None, steps: Optional[Sequence[int]] = None,
             ) -> tuple[duckdb.DuckDBPyConnection, str, list[int], Optional[int], str, list[int]]:
    """(connection holding the source relation, its SQL, ranks present, world size, source,
    steps present). For our log only the files of ``ranks`` and ``steps`` are read
    (:class:`store.select.StoreReader`)."""
    if (path / S.STORE_DIR / S.LOG_DIR).is_dir() or (path / S.STORE_DIR / "parquet").is_dir():
        from store.query import _LOG_TABLE, VIEW_CALLS, connect
        from store.replicas import log_source_sql, recorded_world_size
        from store.select import StoreReader

        reader = StoreReader(path, ranks=ranks, steps=steps)
        con = connect(path, reader=reader)
        return (con, log_source_sql(_LOG_TABLE, VIEW_CALLS), reader.rank_values(),
                recorded_world_size(con, _LOG_TABLE), "log", reader.step_values())
    from msprobe.compare.errors import CompareInputError
    from msprobe.compare.load import load_side

    try:
        side = load_side(path, "DUMP_PATH")
    except CompareInputError as exc:
        raise CheckRanksInputError(str(exc)) from None
    con = duckdb.connect(":memory:")
    con.register("up_calls", side.calls)
    con.register("up_leaves", side.leaves)
    source = (
        "SELECT l.rank, l.step, c.pos, l.name, c.kind, l.io, l.arg, l.leaf_kind, l.dtype, l.shape, "
        "l.max, l.min, l.mean, l.norm, l.crc32, l.requires_grad, l.value_json FROM up_leaves l JOIN "
        "(SELECT rank, step, name, kind, row_number() OVER (PARTITION BY rank, step ORDER BY seq) AS pos "
        "FROM up_calls) c USING (rank, step, name)")
    found = sorted({r for r in side.calls.column("rank").to_pylist()})
    present = sorted({s for s in side.calls.column("step").to_pylist()})
    return con, source, found, None, "dump.json", present


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
        if math.isnan(x) or math.isnan(y):
            if not (math.isnan(x) and math.isnan(y)):
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


def _odd_differs(row: dict, odd: tuple[int, ...], majority: tuple[int, ...], tol: float) -> bool:
    """True when some rank of ``odd`` holds ``row``'s tensor differently from the
    majority ranks' common value (False when the row has no majority rank)."""
    clusters, _ = _clusters(row, tol)
    ref = next((c for c in clusters if any(r in majority for r in c)), None)
    if ref is None:
        return False
    return any(r in row["ranks"] and r not in ref for r in odd)


_LISTS_UNLESS_AGREE = ", ".join(f"CASE WHEN agree THEN NULL ELSE {c} END AS {c}"
                                for c in ("ranks", S.CRC32, S.MAX, S.MIN, S.MEAN, S.NORM, S.DTYPE, S.SHAPE))


def _check_group(con, g: int, members: tuple[int, ...], steps: Sequence[int],
                 categories: tuple[str, ...], tol: float) -> GroupResult:
    """The result of group ``g`` over ``steps`` (sorted), one step at a time: each step's
    ``replicas`` rows are computed once (only that step's rows are scanned) into a
    temporary table that the counts, the first disagreement and its spread then read."""
    cat_sql = ", ".join(f"'{c}'" for c in categories)
    order = "ORDER BY pos, io_order, io, arg, process_group"
    compared = exact = 0
    seen: list[int] = []
    row = first = None
    majority = odd = ()
    downstream, spread = None, {}
    try:
        for step in steps:
            # rows that agree are only counted: their per-rank lists are not kept
            con.execute(f"CREATE OR REPLACE TEMP TABLE msprobe_step_replicas AS SELECT * REPLACE "
                        f"({_LISTS_UNLESS_AGREE}) FROM replicas WHERE grp = ? AND n_ranks > 1 AND step = ?",
                        [g, step])
            n, n_exact = con.execute(f"SELECT count(*), count(*) FILTER (WHERE exact) FROM msprobe_step_replicas "
                                     f"WHERE category IN ({cat_sql})").fetchall()[0]
            if n:
                seen.append(step)
                compared += n
                exact += n_exact
            if row is None and n:
                found = _rows(con, f"SELECT * FROM msprobe_step_replicas WHERE category IN ({cat_sql}) "
                                   f"AND NOT agree {order} LIMIT 1")
                if found:
                    row = found[0]
                    clusters, _ = _clusters(row, tol)
                    majority, odd = _majority(clusters)
            if row is not None and majority:
                for other in _rows(con, f"SELECT * FROM msprobe_step_replicas WHERE NOT agree {order}"):
                    if not _odd_differs(other, odd, majority, tol):
                        continue
                    spread[other[S.STEP]] = spread.get(other[S.STEP], 0) + 1
                    if (downstream is None and other[S.STEP] == row[S.STEP] and other["io_order"] == 1
                            and other[S.NAME] != row[S.NAME]):
                        downstream = other[S.NAME]
    finally:
        con.execute("DROP TABLE IF EXISTS msprobe_step_replicas")
    seen_steps = tuple(seen)
    if row is not None:
        _, exact_row = _clusters(row, tol)
        values = {r: _fingerprint(row, i, exact_row) for i, r in enumerate(row["ranks"])}
        first_step = min(seen_steps) if seen_steps else row[S.STEP]
        first = Disagreement(step=row[S.STEP], name=row[S.NAME], io=row[S.IO], arg=row[S.ARG],
                             category=row["category"], by="crc32" if exact_row else "statistics",
                             majority=majority, odd=odd, values=values,
                             verdict=_verdict(row, majority, first_step), first_downstream=downstream,
                             spread=spread)
    return GroupResult(ranks=members, steps=seen_steps, compared=compared, exact=exact, first=first)


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
            gets the same data), not only parameters and replicated collective outputs.
        tol: relative tolerance of statistics where no CRC-32 was recorded (>= 0).
    Returns:
        A :class:`RankCheck`; ``exit_code`` 1 when some group disagrees.
    Raises:
        CheckRanksInputError: the path holds no dump, ``tol`` is bad, or a group is empty.
    """
    p = Path(dump_path)
    if not p.exists():
        raise CheckRanksInputError(f"DUMP_PATH {str(p)!r}: path does not exist")
    if not isinstance(tol, (int, float)) or isinstance(tol, bool) or not 0 <= tol < math.inf:
        raise CheckRanksInputError(f"--tol: got {tol!r}; expected a finite number >= 0")
    wanted = sorted({r for g in groups for r in g}) if groups else None
    con, source, ranks, world_size, kind, present = _connect(p, wanted, steps)
    try:
        chosen = [list(g) for g in groups] if groups is not None else default_groups(world_size, ranks)
        if not chosen or any(not g for g in chosen):
            raise CheckRanksInputError(f"--group: got {groups!r}; expected non-empty rank lists")
        create_replicas_view(con, source, chosen, tol=float(tol))
        categories = CATEGORIES if all_calls else CATEGORIES[:2]
        chosen_steps = sorted(set(present) & set(steps)) if steps else present
        results = tuple(_check_group(con, g, tuple(members), chosen_steps, categories, float(tol))
                        for g, members in enumerate(chosen))
    finally:
        con.close()
    return RankCheck(path=str(p), source=kind, categories=categories, tol=float(tol), groups=results)


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
    checked = "every recorded tensor" if "call" in result.categories else "parameters, collective outputs"
    lines.append(f"checked: {checked}; exit status {result.exit_code}")
    return "\n".join(lines)
