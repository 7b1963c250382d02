"""The ``replicas`` view: one row per tensor that ranks of one replica group recorded,
with every rank's fingerprint side by side and whether they agree.

In data parallelism many tensors must be identical on every replica. The view classifies
each recorded tensor leaf (``category``):

``parameter``
    a module's own parameter, recorded at its forward (``io = 'parameters'`` of a
    ``module_forward`` entry: the values the forward used; levels L0 and mix).
``collective``
    a tensor in ``output[0]`` of a ``Distributed.{api}`` entry (the first positional
    argument after the call: the buffer the collective wrote) whose API leaves the same
    result on every member of its process group: :data:`REPLICATED_COLLECTIVES`
    (``all_reduce``, ``broadcast``, ``all_gather``, ...). The other positional arguments
    in ``output`` (``all_gather``'s local input) are not replicas. ``reduce``, ``gather``,
    ``scatter``, ``reduce_scatter``, ``all_to_all`` and point-to-point calls are not.
``call``
    every other tensor (activations, gradients, API inputs): replicas only where they
    were computed from agreeing inputs (``must_agree``), or where the ranks were fed the
    same data (a determinism test).

Whether a row must agree (``must_agree``) follows from the category and, for a call, from
whether its inputs matched across the group's ranks (``inputs_agree``): parameters and
replicated collective outputs always; an output of a call whose recorded inputs all agree
(every input tensor, every non-tensor input value by its JSON record, and for a backward
entry its forward entry's inputs too) unless the call is a ``Distributed.*`` call, an API
of :data:`RANDOM_APIS`, a random module class (``Dropout``, ``AlphaDropout``, ``RReLU``)
or an entry that contains one of those or a ``Distributed.*`` call other than
:data:`REPLICATED_COLLECTIVES` (through ``parent``: a module whose result depends on
other ranks' data). Call inputs, outputs of
calls with differing inputs (data-dependent activations in data parallelism) and entries
without a recorded input tensor (``parameters_grad``) need not agree.

Rows are grouped by (``grp``, step, name, io, arg) and, for collectives, by the process
group the call names (``process_group``, its ranks as JSON text, NULL = the default
group), so a collective over a sub-group is compared among that sub-group's members only.
Columns:

``grp, step, name, io, arg, category, process_group``
    the key; ``grp`` is the index of the rank group (see :func:`create_replicas_view`).
``pos``
    the entry's smallest position among the group's ranks (1 = first entry of the step in
    call order; orders the rows of a step).
``io_order``
    0 for inputs (``input_args``, ``input_kwargs``, ``parameters``, backward ``input``),
    1 for outputs: within one entry, inputs come first.
``ranks, crc32, max, min, mean, norm, dtype, shape``
    lists, one element per rank that recorded the tensor, in rank order.
``n_ranks``
    how many of the group's ranks recorded it (ranks that did not are not compared).
``requires_grad``
    true when every rank recorded ``requires_grad`` true.
``exact``
    every rank has a CRC-32 (summary_mode md5): agreement is CRC-32 equality.
``agree``
    exact: one distinct CRC-32 (and dtype and shape); otherwise dtype and shape equal and
    each statistic's spread over ranks (max - min) at most ``tol`` times its largest
    magnitude (``tol`` = 0: bitwise-equal statistics; NaN and +-Inf equal only themselves,
    never a finite value or the other sign, whatever ``tol``). A tensor recorded
    by one rank only agrees.
``parent``
    the entry's parent entry (the module it ran in), as the ``calls`` view has it.
``inputs_agree``
    every input leaf of the entry agrees across the group (above); NULL when the entry
    (with, for a backward entry, its forward entry) has no recorded input tensor, or when a
    backward entry's forward entry was not recorded.
``must_agree``
    the row is one replicas must agree on (above): what ``msprobe check-ranks`` compares
    by default.

The view reads a *source* relation with one row per leaf and columns rank, step,
pos, name, kind, io, arg, leaf_kind, dtype, shape, max, min, mean, norm, crc32,
requires_grad, value_json, parent (the log's names, store.schema); :func:`log_source_sql` builds it
over the event log, ``msprobe.check_ranks`` over upstream dump.json files.
"""
from __future__ import annotations

from typing import Optional, Sequence

import duckdb
import pyarrow as pa

from store import schema as S

__all__ = ["REPLICATED_COLLECTIVES", "VIEW_REPLICAS", "create_replicas_view", "default_groups",
           "group_text", "log_source_sql", "merged_sql", "partial_sql", "recorded_world_size", "set_groups"]

VIEW_REPLICAS = "replicas"
#: Distributed APIs whose output buffers hold the same values on every member of the group
REPLICATED_COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
                          "all_gather_coalesced", "all_reduce_coalesced", "_all_gather_base")
#: the categories, in the order ``msprobe check-ranks`` checks them by default
CATEGORIES = ("parameter", "collective", "call")
_GROUP_TABLE = "msprobe_replica_groups"
#: APIs whose outputs are no function of their inputs (the second part of the entry name,
#: ``Functional.dropout``): random draws, in which replicas seeded apart legitimately
#: differ, and uninitialised memory (``empty``)
RANDOM_APIS = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
               "native_dropout", "fused_dropout", "bernoulli", "bernoulli_", "multinomial", "normal", "normal_",
               "uniform_", "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
               "random_", "exponential_", "geometric_", "cauchy_", "log_normal_", "poisson", "rrelu", "rrelu_",
               "gumbel_softmax")
_RANDOM_RE = "^_*(" + "|".join(RANDOM_APIS) + ")$"
#: a backward entry's name (``Functional.linear.0.backward``, ``Module.fc.Linear.backward.0``)
#: and the replacement giving its forward entry's name
_BACKWARD_RE = r"\.backward(\.[0-9]+)?$"
_FORWARD_OF = r".forward\1"
#: module classes that draw random numbers (``Module.drop.Dropout.forward.0``, ``Cell.x.Dropout...``)
_RANDOM_MODULE_RE = r"\.(Dropout[123]?d?|AlphaDropout|FeatureAlphaDropout|RReLU)\.(forward|backward)\.[0-9]+$"
_INPUT_IOS = ("input_args", "input_kwargs", "parameters", "input")


def _sql_list(values: Sequence[str]) -> str:
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


def log_source_sql(log_table: str, calls_view: str) -> str:
    """The source relation (see module docstring) over the log table ``log_table`` and the
    ``calls`` view ``calls_view`` of :mod:`store.query`: tensor and value leaves, each with
    its entry's position in its rank's step (``row_number`` over the entry's first seq)."""
    return (
        f"SELECT l.{S.RANK}, l.{S.STEP}, c.pos, l.{S.NAME}, l.{S.KIND}, l.{S.IO}, l.{S.ARG}, "
        f"l.{S.LEAF_KIND}, l.{S.DTYPE}, l.{S.SHAPE}, l.{S.MAX}, l.{S.MIN}, l.{S.MEAN}, l.{S.NORM}, "
        f"l.{S.CRC32}, l.{S.REQUIRES_GRAD}, l.{S.VALUE_JSON}, c.{S.PARENT} FROM {log_table} l JOIN "
        f"(SELECT {S.RANK}, {S.STEP}, {S.NAME}, {S.PARENT}, row_number() OVER "
        f"(PARTITION BY {S.RANK}, {S.STEP} ORDER BY {S.SEQ}) AS pos FROM {calls_view}) c "
        f"USING ({S.RANK}, {S.STEP}, {S.NAME}) WHERE l.{S.ROW} = '{S.ROW_LEAF}'"
    )


def recorded_world_size(con: duckdb.DuckDBPyConnection, log_table: str) -> Optional[int]:
    """The largest ``world_size`` in the markers' ``meta`` of ``log_table`` (None when no
    marker has one: a run without torch.distributed, or a log written before the key)."""
    row = con.execute(
        f"SELECT max(TRY_CAST(json_extract({S.META}, '$.world_size') AS INTEGER)) FROM {log_table} "
        f"WHERE {S.ROW} = '{S.ROW_MARKER}'").fetchall()
    row = row[0] if row else None
    return None if row is None or row[0] is None else int(row[0])


def default_groups(world_size: Optional[int], ranks: Sequence[int]) -> list[list[int]]:
    """One group: ranks ``0 .. world_size-1`` when the world size is known, else the
    ranks that recorded something (sorted).

    >>> default_groups(4, [0, 2])
    [[0, 1, 2, 3]]
    >>> default_groups(None, [3, 1])
    [[1, 3]]
    """
    if world_size:
        return [list(range(world_size))]
    return [sorted(set(ranks))]


def create_replicas_view(con: duckdb.DuckDBPyConnection, source_sql: str, groups: Sequence[Sequence[int]],
                         *, tol: float = 0.0, lists: bool = True, name: str = VIEW_REPLICAS) -> None:
    """Create (or replace) the view ``replicas`` (or ``name``) on ``con``.

    Args:
        con: a DuckDB connection holding the relations ``source_sql`` reads.
        source_sql: a SELECT giving the source relation (module docstring).
        groups: rank groups whose members are replicas of each other, e.g.
            ``[[0, 1, 2, 3]]``; a rank may belong to several groups.
        tol: relative tolerance on statistics where no CRC-32 is recorded (>= 0).
        lists: False leaves out the per-rank lists (``ranks``, ``crc32``, ``max``, ``min``,
            ``mean``, ``norm``, ``dtype``, ``shape``); every other column is the same.
            Building the lists is most of the view's cost (about two thirds at 512 ranks).
        name: the view's name.
    Raises:
        ValueError: ``tol`` negative or not finite, a group empty, or a rank negative.
    """
    set_groups(con, groups)
    tensors, values = partial_sql(source_sql, lists=lists)
    con.execute(f"CREATE OR REPLACE VIEW {name} AS {merged_sql(f'({tensors})', f'({values})', tol=tol, lists=lists)}")


def set_groups(con: duckdb.DuckDBPyConnection, groups: Sequence[Sequence[int]]) -> None:
    """Hold ``groups`` (see :func:`create_replicas_view`) in ``con`` for :func:`partial_sql`.

    Raises:
        ValueError: a group empty, or a rank negative or not an integer.
    """
    pairs_rank, pairs_grp = [], []
    for g, members in enumerate(groups):
        members = list(members)
        if not members:
            raise ValueError(f"groups: group {g} is empty; expected a list of ranks >= 0")
        for r in members:
            if not isinstance(r, int) or isinstance(r, bool) or r < 0:
                raise ValueError(f"groups: group {g} holds {r!r}; expected ranks (integers >= 0)")
            pairs_rank.append(r)
            pairs_grp.append(g)
    con.register("msprobe_groups_source", pa.table({"rank": pa.array(pairs_rank, pa.int32()),
                                                   "grp": pa.array(pairs_grp, pa.int32())}))
    con.execute(f"CREATE OR REPLACE TABLE {_GROUP_TABLE} AS SELECT * FROM msprobe_groups_source")
    con.unregister("msprobe_groups_source")


#: the per-tensor columns a partial row carries: (column of the source, its partial columns'
#: stem); statistics keep their largest and smallest value, strings and shapes too
_SPREAD = ((S.MAX, "max"), (S.MIN, "min"), (S.MEAN, "mean"), (S.NORM, "norm"),
           (S.CRC32, "crc32"), (S.DTYPE, "dtype"), (S.SHAPE, "shape"))
_LISTED = (S.RANK, S.CRC32, S.MAX, S.MIN, S.MEAN, S.NORM, S.DTYPE, S.SHAPE)
_KEY = f"grp, {S.STEP}, {S.NAME}, {S.IO}, {S.ARG}, category, process_group"


def partial_sql(source_sql: str, *, lists: bool = False) -> tuple[str, str]:
    """Two SELECTs over the source relation ``source_sql`` that hold all :func:`merged_sql`
    needs of those ranks: per tensor key (grp, step, name, io, arg, category,
    process_group) its smallest ``pos`` and rank, the counts, the smallest and largest of
    each statistic, CRC-32, dtype and shape, and (``lists``) the per-rank lists; per
    non-tensor input key the smallest and largest JSON text. Partial rows of disjoint rank
    sets merge into the rows of their union, so a step can be read a few ranks at a time.
    The group table of :func:`set_groups` must be in the connection."""
    collective = _sql_list(REPLICATED_COLLECTIVES)
    head = f"""WITH src AS ({source_sql}),
pg AS (
    SELECT {S.RANK}, {S.STEP}, {S.NAME}, min(json_extract(CAST({S.VALUE_JSON} AS JSON), '$.value')::VARCHAR)
           AS process_group
    FROM src
    WHERE {S.LEAF_KIND} = '{S.LEAF_VALUE}' AND {S.NAME} LIKE 'Distributed.%'
      AND {S.IO} IN ('input_args', 'input_kwargs')
      AND json_extract_string(CAST({S.VALUE_JSON} AS JSON), '$.type') = 'torch.distributed.ProcessGroup'
    GROUP BY ALL),
t AS (
    SELECT s.*, g.grp,
           CASE WHEN s.{S.KIND} = '{S.MODULE_FORWARD}' AND s.{S.IO} = 'parameters' THEN 'parameter'
                WHEN s.{S.NAME} LIKE 'Distributed.%' AND s.{S.IO} = 'output'
                     AND (s.{S.ARG} = '0' OR s.{S.ARG} LIKE '0.%')
                     AND split_part(s.{S.NAME}, '.', 2) IN ({collective}) THEN 'collective'
                ELSE 'call' END AS category,
           CASE WHEN s.{S.NAME} LIKE 'Distributed.%' THEN pg.process_group END AS process_group
    FROM src s JOIN {_GROUP_TABLE} g USING ({S.RANK}) LEFT JOIN pg USING ({S.RANK}, {S.STEP}, {S.NAME})
    WHERE s.{S.LEAF_KIND} = '{S.LEAF_TENSOR}')"""
    spread = "".join(f"min({c}) AS {stem}_lo, max({c}) AS {stem}_hi, " for c, stem in _SPREAD)
    listed = "".join(f"list({c} ORDER BY {S.RANK}) AS list_{c}, " for c in _LISTED) if lists else ""
    tensors = (f"{head}\nSELECT {_KEY}, min(pos) AS pos, min({S.RANK}) AS first_rank, {listed}"
               f"count(*) AS n_ranks, count({S.CRC32}) AS n_crc32, "
               f"bool_and(coalesce({S.REQUIRES_GRAD}, false)) AS {S.REQUIRES_GRAD}, {spread}"
               f"min({S.PARENT}) AS {S.PARENT} FROM t GROUP BY {_KEY}")
    values = (f"WITH src AS ({source_sql})\n"
              f"SELECT g.grp, v.{S.STEP}, v.{S.NAME}, v.{S.IO}, v.{S.ARG}, "
              f"min(coalesce(CAST(v.{S.VALUE_JSON} AS VARCHAR), 'null')) AS value_lo, "
              f"max(coalesce(CAST(v.{S.VALUE_JSON} AS VARCHAR), 'null')) AS value_hi "
              f"FROM src v JOIN {_GROUP_TABLE} g USING ({S.RANK}) "
              f"WHERE v.{S.LEAF_KIND} <> '{S.LEAF_TENSOR}' AND v.{S.IO} IN ({_sql_list(_INPUT_IOS)}) "
              f"GROUP BY g.grp, v.{S.STEP}, v.{S.NAME}, v.{S.IO}, v.{S.ARG}")
    return tensors, values


def merged_sql(tensors: str, values: str, *, tol: float = 0.0, lists: bool = False) -> str:
    """The ``replicas`` rows (module docstring) from the partial rows of :func:`partial_sql`
    in the relations ``tensors`` and ``values`` (table names or parenthesised SELECTs),
    whatever the split of ranks they were computed over; ``lists`` needs partial rows made
    with lists.

    Raises:
        ValueError: ``tol`` negative or not finite.
    """
    if not (isinstance(tol, (int, float)) and 0 <= tol < float("inf")):
        raise ValueError(f"tol: got {tol!r}; allowed: a finite number >= 0")
    tol_sql = repr(float(tol))
    collective = _sql_list(REPLICATED_COLLECTIVES)

    def spread_ok(stem: str) -> str:
        hi, lo = f"max({stem}_hi)", f"min({stem}_lo)"
        # NaN and +-Inf agree only with themselves (IS NOT DISTINCT FROM): in DuckDB NaN
        # compares greater than every number, so a NaN or infinite spread would pass <=
        return (f"({hi} IS NOT DISTINCT FROM {lo} OR (isfinite({hi}) AND isfinite({lo}) "
                f"AND {hi} - {lo} <= {tol_sql} * greatest(abs({hi}), abs({lo}))))")

    stats_agree = " AND ".join(spread_ok(stem) for stem in ("max", "min", "mean", "norm"))
    listed = "".join(f"flatten(list(list_{c} ORDER BY first_rank)) AS {'ranks' if c == S.RANK else c}, "
                     for c in _LISTED) if lists else ""
    return f"""
WITH RECURSIVE rows AS (
SELECT {_KEY}, min(pos) AS pos,
       CASE WHEN {S.IO} IN ({_sql_list(_INPUT_IOS)}) THEN 0 ELSE 1 END AS io_order,
       {listed}
       sum(n_ranks)::BIGINT AS n_ranks, bool_and({S.REQUIRES_GRAD}) AS {S.REQUIRES_GRAD},
       sum(n_crc32) = sum(n_ranks) AS exact,
       min(dtype_lo) IS NOT DISTINCT FROM max(dtype_hi) AND min(shape_lo) IS NOT DISTINCT FROM max(shape_hi) AND
       CASE WHEN sum(n_crc32) = sum(n_ranks) THEN min(crc32_lo) = max(crc32_hi)
            ELSE {stats_agree} END AS agree,
       min({S.PARENT}) AS {S.PARENT}
FROM {tensors} GROUP BY {_KEY}),
vals AS (
    SELECT grp, {S.STEP}, {S.NAME}, min(value_lo) = max(value_hi) AS agree
    FROM {values} GROUP BY grp, {S.STEP}, {S.NAME}, {S.IO}, {S.ARG}),
own AS (
    SELECT grp, {S.STEP}, {S.NAME}, bool_and(agree) AS ok, count(*) FILTER (WHERE tensor) AS n_tensors
    FROM (SELECT grp, {S.STEP}, {S.NAME}, agree, true AS tensor FROM rows WHERE io_order = 0
          UNION ALL SELECT grp, {S.STEP}, {S.NAME}, agree, false FROM vals)
    GROUP BY ALL),
entries AS (
    SELECT DISTINCT grp, {S.STEP}, {S.NAME},
           regexp_replace({S.NAME}, '{_BACKWARD_RE}', '{_FORWARD_OF}') AS forward_name,
           regexp_matches({S.NAME}, '{_BACKWARD_RE}') AS is_backward
    FROM rows),
inputs AS (
    SELECT e.grp, e.{S.STEP}, e.{S.NAME},
           CASE WHEN coalesce(o.n_tensors, 0) + CASE WHEN e.is_backward THEN coalesce(f.n_tensors, 0) ELSE 0 END = 0
                     OR (e.is_backward AND f.ok IS NULL) THEN NULL
                ELSE coalesce(o.ok, true) AND (NOT e.is_backward OR f.ok) END AS inputs_agree
    FROM entries e
    LEFT JOIN own o ON o.grp = e.grp AND o.{S.STEP} = e.{S.STEP} AND o.{S.NAME} = e.{S.NAME}
    LEFT JOIN own f ON e.is_backward AND f.grp = e.grp AND f.{S.STEP} = e.{S.STEP} AND f.{S.NAME} = e.forward_name),
tree AS (SELECT DISTINCT grp, {S.STEP}, {S.NAME}, {S.PARENT} FROM rows),
random_calls AS (
    SELECT grp, {S.STEP}, {S.NAME} FROM tree
    WHERE (NOT starts_with({S.NAME}, 'Module.') AND NOT starts_with({S.NAME}, 'Cell.')
           AND regexp_matches(split_part({S.NAME}, '.', 2), '{_RANDOM_RE}'))
       OR regexp_matches({S.NAME}, '{_RANDOM_MODULE_RE}')
       OR (starts_with({S.NAME}, 'Distributed.') AND split_part({S.NAME}, '.', 2) NOT IN ({collective}))
    UNION
    SELECT t.grp, t.{S.STEP}, t.{S.PARENT} FROM random_calls c JOIN tree t
      ON t.grp = c.grp AND t.{S.STEP} = c.{S.STEP} AND t.{S.NAME} = c.{S.NAME}
    WHERE t.{S.PARENT} IS NOT NULL)
SELECT r.*, i.inputs_agree,
       CASE WHEN r.category <> 'call' THEN true
            ELSE r.io_order = 1 AND coalesce(i.inputs_agree, false) AND NOT starts_with(r.{S.NAME}, 'Distributed.')
                 AND NOT EXISTS (SELECT 1 FROM random_calls c WHERE c.grp = r.grp AND c.{S.STEP} = r.{S.STEP}
                                 AND c.{S.NAME} = r.{S.NAME}) END AS must_agree
FROM rows r LEFT JOIN inputs i ON i.grp = r.grp AND i.{S.STEP} = r.{S.STEP} AND i.{S.NAME} = r.{S.NAME}
"""


def group_text(members: Sequence[int]) -> str:
    """Ranks as ranges: ``[0, 1, 2, 3, 6]`` → ``'0-3,6'``."""
    members = sorted(set(members))
    parts, i = [], 0
    while i < len(members):
        j = i
        while j + 1 < len(members) and members[j + 1] == members[j] + 1:
            j += 1
        parts.append(str(members[i]) if i == j else f"{members[i]}-{members[j]}")
        i = j + 1
    return ",".join(parts)
