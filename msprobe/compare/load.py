"""Loading one side of a comparison into Arrow tables (then DuckDB).

A side is either our dump (a ``dump_path`` holding ``.msprobe/log/``, read through
A side is either our dump (a ``dump_path`` holding ``.msprobe/log/`` or compacted parts, read
through :class:`store.select.StoreReader`: compacted Parquet parts plus the log tail), a
MindSpore kernel dump (level L2, ``rank_{id}/{net}/…``) without a log (read into a
temporary log by :mod:`msprobe.kernel_dump.ingest`), or an upstream layout: a ``dump.json``
file, or any directory above ``step{N}/rank{R}/dump.json`` (read with the streaming importer
:mod:`msprobe.compare.dumpjson`, plus ``construct.json`` and ``stack.json`` beside it).

Both give a :class:`Side` with three tables:

``calls``   rank, step, seq (execution order within rank), name, kind, parent, stack_id
``leaves``  rank, step, name (the call), cseq (the call's seq), lord (the leaf's position in
            its rank and step, in log order), io, arg,
            leaf_kind, dtype, shape, numel, max, min, mean, norm, max_finite,
            min_finite, crc32, requires_grad, has_nan, has_inf, data_name, value_json,
            payload (task tensor: payload-store reference of our logs, else null)
``stacks``  stack_id, depth (0 = innermost), frame
"""
from __future__ import annotations

import json
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import duckdb
import numpy as np
import pyarrow as pa

from msprobe.compare.dumpjson import entry_kind, entry_leaves, iter_entries
from msprobe.compare.errors import CompareInputError
from msprobe.compare.producers import OURS, detect
from store import schema as S

__all__ = ["Side", "load_side", "side_of_rows", "stack_table", "log_stacks", "log_meta", "load_log_steps", "TailSteps", "LEAF_SCHEMA", "CALL_SCHEMA", "STACK_SCHEMA"]

CALL_SCHEMA = pa.schema([
    ("rank", pa.int32()), ("step", pa.int32()), ("seq", pa.int64()), ("name", pa.string()),
    ("kind", pa.string()), ("parent", pa.string()), ("stack_id", pa.int64()),
])
LEAF_SCHEMA = pa.schema([
    ("rank", pa.int32()), ("step", pa.int32()), ("name", pa.string()), ("cseq", pa.int64()), ("lord", pa.int64()),
    ("io", pa.string()), ("arg", pa.string()), ("leaf_kind", pa.string()), ("dtype", pa.string()),
    ("shape", pa.list_(pa.int64())), ("numel", pa.int64()),
    ("max", pa.float64()), ("min", pa.float64()), ("mean", pa.float64()), ("norm", pa.float64()),
    ("max_finite", pa.float64()), ("min_finite", pa.float64()), ("crc32", pa.string()),
    ("requires_grad", pa.bool_()), ("has_nan", pa.bool_()), ("has_inf", pa.bool_()),
    ("data_name", pa.string()), ("value_json", pa.string()), ("payload", pa.string()),
])
STACK_SCHEMA = pa.schema([("stack_id", pa.int64()), ("depth", pa.int32()), ("frame", pa.string())])


@dataclass
class Side:
    """One loaded side. ``task``/``level``/``framework`` are the first values found
    (None when unknown); ``producer`` the tool that wrote it
    (:func:`msprobe.compare.producers.detect`); ``data_dirs`` maps (rank, step) to the directory holding tensor
    files (upstream layouts); ``skipped`` lists the parts of our logs not read as data
    (:class:`store.log_reader.Skipped`), ``unverified`` our log files of format 1."""

    path: str
    source: str                     # "log" or "dump.json"
    calls: pa.Table
    leaves: pa.Table
    stacks: pa.Table
    task: Optional[str] = None
    level: Optional[str] = None
    framework: Optional[str] = None
    data_dirs: dict = field(default_factory=dict)
    skipped: tuple = ()
    unverified: tuple = ()
    missing_ranks: tuple = ()       # ranks the markers say recorded, without a readable log
    unfinished: tuple = ()          # our log files without an end-of-stream marker (writer killed)
    producer: Optional[str] = None  # msprobe.compare.producers: "msprobe", "upstream-1.x", "upstream-26"


def load_side(path: Union[str, os.PathLike], label: str, *, ranks: Optional[Sequence[int]] = None,
              steps: Optional[Sequence[int]] = None, reader=None) -> Side:
    """Load ``path`` (see module docstring).

    Args:
        path: our dump path, an upstream dump directory at any level, or a dump.json.
        label: ``"TARGET"`` or ``"BASELINE"``, used in error messages.
        ranks, steps: load only these ranks and steps (None: all). Files of other ranks
            and steps are not read (our log: :class:`store.select.StoreReader`; upstream
            layouts: the ``step{N}/rank{R}`` directories).
        reader: our log: the :class:`store.select.StoreReader` of ``path``, ``ranks`` and
            ``steps`` when one is already open (its tail is not read again); None: opened here.
    Raises:
        CompareInputError: the path is missing, holds neither an msprobe log nor a
            dump.json, is empty (no entries), or a dump.json is malformed or truncated.
    """
    p = Path(path)
    if not p.exists():
        raise CompareInputError(f"{label} {str(p)!r}: path does not exist; expected a dump path, "
                                f"an upstream step*/rank*/ directory or a dump.json")
    if p.is_dir() and ((p / S.STORE_DIR / S.LOG_DIR).is_dir() or (p / S.STORE_DIR / "parquet").is_dir()):
        side = _load_log(p, ranks, steps, reader)
    elif p.is_dir() and _is_kernel_dump(p):
        side = _load_kernel_dump(p)
    else:
        files = [p] if p.is_file() else _find_dump_files(p)
        if files and not p.is_file() and (ranks is not None or steps is not None):
            files = [f for f in files if (ranks is None or _rank_step(f)[0] in ranks)
                     and (steps is None or _rank_step(f)[1] in steps)]
            if not files:
                raise CompareInputError(f"{label} {str(p)!r}: no calls left after --rank/--step selection")
        if not files:
            raise CompareInputError(f"{label} {str(p)!r}: no msprobe log ({S.STORE_DIR}/{S.LOG_DIR}/) and no "
                                    f"dump.json found below it")
        side = _load_dump_files(p, files)
    if side.calls.num_rows == 0:
        if ranks is not None or steps is not None:
            raise CompareInputError(f"{label} {str(p)!r}: no calls left after --rank/--step selection")
        raise CompareInputError(f"{label} {str(p)!r}: empty dump (0 entries)")
    return side


# --- our log -----------------------------------------------------------------------------
#: the log columns a side is built from (calls, leaves, markers' meta, stacks' frames)
_LOAD_COLUMNS = (S.ROW, S.RANK, S.STEP, S.SEQ, S.NAME, S.KIND, S.PARENT, S.STACK_ID, S.META, S.FRAMES,
                 *(c for c in LEAF_SCHEMA.names if c not in ("cseq", "lord")))


def _read_log_chunks(p: Path, ranks=None, steps=None, reader=None):
    """The selected rows of our store (``table``, ``stacks``, ``skipped``), as
    :class:`store.select.StoreReader` gives them: Parquet parts plus the log not yet
    compacted, ``seq`` shifted per rank across files as :func:`store.log_reader.read_log`
    does, the table left in its chunks (DuckDB scans chunked Arrow as it is)."""
    from types import SimpleNamespace

    from store.log_reader import add_stacks, missing_ranks
    from store.select import StoreReader

    if reader is None:
        reader = StoreReader(p, ranks=ranks, steps=steps)
    table = reader.table(columns=_LOAD_COLUMNS)
    stacks = add_stacks({}, table)
    missing = tuple(r for r in missing_ranks(table) if ranks is None or r in ranks)
    return SimpleNamespace(table=table, stacks=stacks, skipped=tuple(reader.skipped),
                           unverified=tuple(reader.unverified), missing_ranks=missing,
                           unfinished=tuple(reader.unfinished))


def _load_log(p: Path, ranks=None, steps=None, reader=None) -> Side:
    import pyarrow.compute as pc

    contents = _read_log_chunks(p, ranks, steps, reader)
    table = contents.table
    markers = table.filter(pc.and_(pc.equal(table[S.ROW], S.scalar(S.ROW_MARKER, S.ROW)), pc.is_valid(table[S.META])))
    meta = json.loads(markers[S.META][0].as_py()) if markers.num_rows else {}
    side = side_of_rows(p, table, stack_table(contents.stacks), meta)
    side.skipped, side.unverified = contents.skipped, contents.unverified
    side.missing_ranks, side.unfinished = contents.missing_ranks, contents.unfinished
    return side


def log_stacks(reader) -> pa.Table:
    """The stacks (:data:`STACK_SCHEMA`) of a :class:`store.select.StoreReader`'s
    selection: the stack rows of its ``_meta`` parts and of its tail, the first frames
    stored for an id (as :func:`store.log_reader.add_stacks` keeps them); no step part is
    read."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from store.log_reader import add_stacks

    stacks: dict = {}
    columns = [S.ROW, S.STACK_ID, S.FRAMES]
    meta = reader.dataset(meta=True)
    if meta is not None:
        add_stacks(stacks, meta.to_table(columns=columns, filter=ds.field(S.ROW) == S.ROW_STACK))
    tail = reader.tail.select(columns)
    add_stacks(stacks, tail.filter(pc.equal(tail[S.ROW], S.scalar(S.ROW_STACK, S.ROW))))
    return stack_table(stacks)


def log_meta(reader) -> dict:
    """The ``meta`` of the first marker row of a :class:`store.select.StoreReader`'s
    selection that has one (task, level, framework, world_size ...); {} without one."""
    import pyarrow.compute as pc

    markers = reader.markers()
    markers = markers.filter(pc.is_valid(markers[S.META]))
    return json.loads(markers[S.META][0].as_py()) if markers.num_rows else {}


class TailSteps:
    """The call and leaf rows of a :class:`store.select.StoreReader`'s tail (the log not
    yet compacted) indexed by step once, so that the rows of a few steps are taken without
    scanning the whole tail again.

    Args:
        reader: the side's reader.
    """

    def __init__(self, reader) -> None:
        tail = reader.tail
        wanted = set(_LOAD_COLUMNS)         # in the columns' order, as StoreReader.table gives them
        self.table = tail.select([name for name in tail.schema.names if name in wanted])
        if tail.num_rows:
            row = tail[S.ROW].to_numpy(zero_copy_only=False)
            index = np.nonzero((row == S.ROW_CALL) | (row == S.ROW_LEAF))[0]
            steps = tail[S.STEP].to_numpy()[index]
            order = np.argsort(steps, kind="stable")
            self.index, self.steps = index[order], steps[order]
        else:
            self.index = self.steps = np.zeros(0, np.int64)

    def rows(self, steps: Sequence[int]) -> pa.Table:
        """The tail's call and leaf rows of ``steps``, in tail order."""
        picked = [self.index[np.searchsorted(self.steps, s):np.searchsorted(self.steps, s, side="right")]
                  for s in steps]
        picked = np.sort(np.concatenate(picked)) if picked else np.zeros(0, np.int64)
        return self.table.take(pa.array(picked, pa.int64()))


def load_log_steps(reader, steps: Sequence[int], stacks: pa.Table, meta: dict,
                   tail: Optional[TailSteps] = None) -> Side:
    """Some steps of our log as a :class:`Side`: the call and leaf rows of ``steps`` of the
    :class:`store.select.StoreReader` ``reader`` (its parts' row groups of those steps and
    its tail's rows, from ``tail`` when given; the ``_meta`` parts are not read again),
    with the side's ``stacks`` (:func:`log_stacks`) and ``meta`` (:func:`log_meta`) read
    once for every step. The tables equal those steps' rows of :func:`load_side` over every
    step. Steps without calls give empty tables. The reader's notices are not copied (they
    are the run's)."""
    if tail is None:
        table = reader.narrowed(steps=steps).table(columns=_LOAD_COLUMNS, side_rows=False)
    else:
        parts = reader.narrowed(steps=steps, tail=False).table(columns=_LOAD_COLUMNS, side_rows=False)
        table = pa.concat_tables([parts, tail.rows(steps).select(parts.schema.names).cast(parts.schema)])
    return side_of_rows(reader.dump_path, table, stacks, meta)


def stack_table(stacks: dict) -> pa.Table:
    """``{stack_id: frames}`` (:func:`store.log_reader.add_stacks`) as a
    :data:`STACK_SCHEMA` table, one row per frame (depth 0 = innermost)."""
    ids, depths, frames = [], [], []
    for sid, fr in stacks.items():
        for depth, frame in enumerate(fr):
            ids.append(sid)
            depths.append(depth)
            frames.append(frame)
    return pa.table({"stack_id": pa.array(ids, pa.int64()), "depth": pa.array(depths, pa.int32()),
                     "frame": pa.array(frames, pa.string())})


def side_of_rows(p: Path, table: pa.Table, stacks: pa.Table, meta: dict) -> Side:
    """A :class:`Side` of our log from its rows ``table`` (the :data:`_LOAD_COLUMNS` of
    :class:`store.select.StoreReader`; call and leaf rows are used, others ignored), the
    side's ``stacks`` (:data:`STACK_SCHEMA`) and the ``meta`` of its first marker (task,
    level, framework). The reader's notices (skipped, unverified ...) are left empty.
    ``lord`` is each leaf's position among its (rank, step)'s leaves in log order, so a
    step loaded alone gives the same tables as that step loaded with the others."""
    import pyarrow.compute as pc

    row = table[S.ROW]
    # calls: one row per (rank, step, name), the values of its first call row (smallest seq);
    # grouped by an integer code of the name (grouping strings is the slow part)
    raw = table.filter(pc.equal(row, S.scalar(S.ROW_CALL, S.ROW))).select(
        [S.RANK, S.STEP, S.SEQ, S.NAME, S.KIND, S.PARENT, S.STACK_ID]).combine_chunks()
    n = raw.num_rows
    rank = raw[S.RANK].to_numpy().astype(np.int64) if n else np.zeros(0, np.int64)
    step = raw[S.STEP].to_numpy().astype(np.int64) if n else np.zeros(0, np.int64)
    seq = raw[S.SEQ].to_numpy() if n else np.zeros(0, np.int64)
    nid = pc.dictionary_encode(raw[S.NAME]).combine_chunks().indices
    nid = pc.fill_null(nid, -1).to_numpy().astype(np.int64) if n else np.zeros(0, np.int64)
    order = np.lexsort((seq, nid, step, rank))
    if n:
        r, st, nm = rank[order], step[order], nid[order]
        new_group = np.r_[True, (r[1:] != r[:-1]) | (st[1:] != st[:-1]) | (nm[1:] != nm[:-1])]
    else:
        new_group = np.zeros(0, bool)
    first = order[new_group]                     # each group's call row with the smallest seq
    group_of = np.empty(n, np.int64)
    group_of[order] = np.cumsum(new_group) - 1
    cseq = seq[first][group_of]                  # per call row: its call's first seq
    first = first[np.lexsort((seq[first], step[first], rank[first]))]   # ORDER BY rank, step, seq
    calls = raw.take(pa.array(first))
    con = duckdb.connect(":memory:")
    try:
        con.register("log", table.select([S.RANK, S.STEP, S.SEQ, S.ROW]).append_column(
            "ridx", pa.array(np.arange(table.num_rows, dtype=np.int64))))
        con.register("crow", pa.table({"rank": raw[S.RANK], "step": raw[S.STEP], "seq": raw[S.SEQ],
                                       "cseq": pa.array(cseq, pa.int64())}))
        # a leaf row belongs to the call row of its seq (store.schema); integer keys only
        pairs = con.sql(f"SELECT l.ridx, c.cseq FROM log l JOIN crow c ON c.rank = l.rank AND c.step = l.step "
                        f"AND c.seq = l.seq WHERE l.row = '{S.ROW_LEAF}'").to_arrow_table()
    finally:
        con.close()
    ridx = pairs["ridx"].to_numpy() if pairs.num_rows else np.zeros(0, np.int64)
    keep = np.argsort(ridx, kind="stable")      # log order
    ridx = ridx[keep]
    leaf_cseq = (pairs["cseq"].to_numpy() if pairs.num_rows else np.zeros(0, np.int64))[keep]
    leaf_cols = [c for c in LEAF_SCHEMA.names if c not in ("cseq", "lord")]
    mask = np.zeros(table.num_rows, bool)
    mask[ridx] = True
    leaves = table.select(leaf_cols).filter(pa.array(mask))     # a filter copies faster than a take
    leaves = leaves.append_column("cseq", pa.array(leaf_cseq, pa.int64())).append_column(
        "lord", pa.array(ridx, pa.int64()))
    if n > len(first):  # some call written in several rows: a later leaf of a slot replaces an earlier one
        rows_of = np.bincount(group_of)[group_of]
        leaves = _last_per_slot(leaves, np.unique(cseq[rows_of > 1]))
    leaves = leaves.set_column(leaves.schema.get_field_index("lord"), "lord", _positions(leaves))
    return Side(path=str(p), source="log", calls=_cast(calls, CALL_SCHEMA), leaves=_cast(leaves, LEAF_SCHEMA),
                stacks=stacks, task=meta.get("task"), level=meta.get("level"), framework=meta.get("framework"),
                producer=OURS)


def _positions(leaves: pa.Table) -> pa.Array:
    """Each leaf's position among the leaves of its (rank, step), in ``leaves``' order (log
    order): its ``lord``, the same whichever steps and ranks were loaded with it."""
    n = leaves.num_rows
    if n == 0:
        return pa.array([], pa.int64())
    rank, step = leaves["rank"].to_numpy(), leaves["step"].to_numpy()
    order = np.lexsort((np.arange(n), step, rank))
    r, st = rank[order], step[order]
    first = np.r_[True, (r[1:] != r[:-1]) | (st[1:] != st[:-1])]
    index = np.arange(n)
    positions = np.empty(n, np.int64)
    positions[order] = index - np.maximum.accumulate(np.where(first, index, 0))
    return pa.array(positions, pa.int64())


def _is_kernel_dump(p: Path) -> bool:
    from msprobe.kernel_dump.layout import is_kernel_dump

    return is_kernel_dump(p)


def _load_kernel_dump(p: Path) -> Side:
    """A MindSpore kernel dump (level L2) without an msprobe log: read into a temporary log
    (:func:`msprobe.kernel_dump.ingest.ingest_kernel_dump`), ``p`` itself left untouched;
    tensor files are read from ``p``."""
    import tempfile

    from msprobe.kernel_dump.ingest import ingest_kernel_dump

    with tempfile.TemporaryDirectory(prefix="msprobe_kernels_") as tmp:
        try:
            ingest_kernel_dump(p, log_path=tmp)
        except ValueError as exc:   # a malformed statistic.csv
            raise CompareInputError(f"{str(p)!r}: {exc}") from None
        side = _load_log(Path(tmp)) if (Path(tmp) / S.STORE_DIR / S.LOG_DIR).is_dir() else None
    if side is None:
        raise CompareInputError(f"{str(p)!r}: MindSpore kernel dump without any readable iteration")
    side.path = str(p)
    return side


def _last_per_slot(leaves: pa.Table, repeated: np.ndarray) -> pa.Table:
    """``leaves`` with, per (rank, step, call, io, arg), only the last leaf in log order
    (largest ``lord``), as dump.json keeps it (:func:`store.entries.build_entries`, rule
    2): a backward entry written again after a later backward pass (its sums over the
    passes) holds its last values. Only the leaves of calls whose ``cseq`` is in
    ``repeated`` (calls written in several rows) are looked at."""
    import pyarrow.compute as pc

    cand = np.isin(leaves["cseq"].to_numpy(), repeated)
    if not cand.any():
        return leaves
    keys = ["rank", "step", "cseq", "io", "arg"]
    sub = leaves.select(keys + ["lord"]).filter(pa.array(cand))
    last = sub.group_by(keys, use_threads=False).aggregate([("lord", "max")])
    if last.num_rows == sub.num_rows:
        return leaves
    dropped = pc.invert(pc.is_in(sub["lord"], value_set=last["lord_max"]))
    drop = pc.filter(sub["lord"], dropped)
    return leaves.filter(pc.invert(pc.is_in(leaves["lord"], value_set=drop)))


def _cast(table: pa.Table, schema: pa.Schema) -> pa.Table:
    return table.select(schema.names).cast(schema)


# --- upstream layouts --------------------------------------------------------------------
_RANK_DIR = re.compile(r"^rank(\d*)$")          # 26.x's non-distributed proc{pid} directory is rank 0
_PGRAD_INDEX = re.compile(r"\.parameters_grad\.(\d+)$")
_STEP_DIR = re.compile(r"^step(\d+)$")


def _find_dump_files(root: Path) -> list[Path]:
    found = sorted(set(root.rglob("dump.json")) | set(root.rglob("debug.json")))
    return [f for f in found if S.STORE_DIR not in f.parts]


def _rank_step(file: Path) -> tuple[int, int]:
    rank, step = 0, 0
    for part in file.parent.parts:
        m = _RANK_DIR.match(part)
        if m:
            rank = int(m.group(1) or 0)
        m = _STEP_DIR.match(part)
        if m:
            step = int(m.group(1))
    return rank, step


def _stack_id(frames: list) -> int:
    return zlib.crc32("\n".join(str(f) for f in frames).encode()) 


def _load_dump_files(root: Path, files: list[Path]) -> Side:
    calls: dict[str, list] = {k: [] for k in CALL_SCHEMA.names}
    leaves: dict[str, list] = {k: [] for k in LEAF_SCHEMA.names}
    stacks: dict[int, list] = {}
    header: dict[str, Any] = {}
    data_dirs = {}
    seen = set()
    stack_v26 = False
    indexed: list[str] = []
    for file in files:
        rank, step = _rank_step(file)
        if (rank, step) in seen:
            raise CompareInputError(f"{str(file)!r}: a second dump.json for rank {rank} step {step} under "
                                    f"{str(root)!r}; pass the step or rank directory instead")
        seen.add((rank, step))
        data_dirs[(rank, step)] = str(file.parent / "dump_tensor_data")
        parents = _read_small_json(file.parent / "construct.json")
        raw_stacks = _read_small_json(file.parent / "stack.json")
        stack_v26 = stack_v26 or _is_v26_stacks(raw_stacks)
        stack_of = _stack_map(raw_stacks)
        for sid, frames in stack_of.values():
            stacks.setdefault(sid, frames)
        seq = 0
        first_call = len(calls["name"])
        for name, entry in iter_entries(file):
            if name == "header":
                header = header or entry
                continue
            seq += 2
            kind = entry_kind(name)
            if kind == "parameters_grad":
                m = _PGRAD_INDEX.search(name)
                if m:       # 26.x: X.parameters_grad.{n}, n the micro-step; the first is ours' X.parameters_grad
                    indexed.append(name)
                    if m.group(1) == "0":
                        name = name[: m.start()] + ".parameters_grad"
            sid = stack_of.get(name, (None, None))[0]
            for key, value in ((
                "rank", rank), ("step", step), ("seq", seq), ("name", name), ("kind", kind),
                ("parent", parents.get(name) or None), ("stack_id", sid)):
                calls[key].append(value)
            for lord, leaf in enumerate(entry_leaves(kind, entry)):
                leaf.update(rank=rank, step=step, name=name, lord=lord)
                for key in LEAF_SCHEMA.names:
                    leaves[key].append(leaf.get(key))
        _move_parameters_grad(calls, first_call)
    call_seq = {(r, st, n): q for r, st, n, q in zip(calls["rank"], calls["step"], calls["name"], calls["seq"])}
    leaves["cseq"] = [call_seq[(r, st, n)] for r, st, n in zip(leaves["rank"], leaves["step"], leaves["name"])]
    leaf_table = pa.table(leaves, schema=LEAF_SCHEMA)
    return Side(
        path=str(root), source="dump.json",
        calls=pa.table(calls, schema=CALL_SCHEMA), leaves=leaf_table,
        stacks=stack_table({sid: [str(frame) for frame in frames] for sid, frames in stacks.items()}),
        task=header.get("task"), level=header.get("level"), framework=header.get("framework"),
        data_dirs=data_dirs, producer=detect(files, stack_v26=stack_v26, names=indexed, leaves=leaf_table),
    )


def _move_parameters_grad(calls: dict[str, list], first: int) -> None:
    """Upstream inserts ``P.parameters_grad`` right after ``P``'s first forward; the
    gradients arrive with ``P``'s backward, so order it just after its last backward."""
    last_backward: dict[str, int] = {}
    for i in range(first, len(calls["name"])):
        name = calls["name"][i]
        if calls["kind"][i] == "module_backward":
            last_backward[name.rsplit(".", 2)[0]] = calls["seq"][i]
    for i in range(first, len(calls["name"])):
        if calls["kind"][i] == "parameters_grad":
            seq = last_backward.get(re.sub(r"\.parameters_grad(\.\d+)?$", "", calls["name"][i]))
            if seq is not None:
                calls["seq"][i] = seq + 1


def _read_small_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CompareInputError(f"{str(path)!r}: malformed JSON: {exc}") from None
    return value if isinstance(value, dict) else {}


def _is_v26_entry(key: str, value) -> bool:
    return (key.isdigit() and isinstance(value, list) and len(value) == 2 and isinstance(value[0], list)
            and isinstance(value[1], list) and all(isinstance(n, str) for n in value[0]))


def _is_v26_stacks(raw: dict) -> bool:
    """Whether a stack.json has 26.x's deduplicated format (``{"0": [[names], [frames]]}``)."""
    return bool(raw) and all(_is_v26_entry(k, v) for k, v in raw.items())


def _stack_map(raw: dict) -> dict[str, tuple[int, list]]:
    """``{entry name: (stack_id, frames)}`` from a 1.2.2 (``{name: [frames]}``) or v26
    (``{"0": [[names], [frames]]}``) stack.json."""
    out: dict[str, tuple[int, list]] = {}
    for key, value in raw.items():
        if _is_v26_entry(key, value):
            names, frames = value
        else:
            names, frames = [key], value if isinstance(value, list) else [str(value)]
        sid = _stack_id(frames)
        for name in names:
            out[name] = (sid, frames)
    return out
