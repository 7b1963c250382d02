"""store.replicas: the ``replicas`` view over a hand-made source relation."""
from __future__ import annotations

import json

import duckdb
import pyarrow as pa
import pytest

from store.replicas import create_replicas_view, default_groups, group_text

COLUMNS = ["rank", "step", "pos", "name", "kind", "io", "arg", "leaf_kind", "dtype", "shape", "max", "min",
           "mean", "norm", "crc32", "requires_grad", "value_json", "parent"]


def leaf(rank, name, io, arg, *, kind="api_forward", pos=1, stats=(1.0, 0.0, 0.5, 2.0), crc=None, step=0,
         leaf_kind="tensor", value=None, parent=None):
    return dict(zip(COLUMNS, [rank, step, pos, name, kind, io, arg, leaf_kind, "torch.float32", [2],
                              *stats, crc, True, None if value is None else json.dumps(value), parent]))


def view(rows, groups, tol=0.0):
    con = duckdb.connect()
    con.register("src", pa.Table.from_pylist(rows))
    create_replicas_view(con, "SELECT * FROM src", groups, tol=tol)
    cur = con.execute("SELECT * FROM replicas ORDER BY grp, step, pos, io_order, name, io, arg, process_group")
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def test_categories_and_agreement_by_crc32():
    rows = []
    for r in range(3):
        rows.append(leaf(r, "Module.fc.Linear.forward.0", "parameters", "weight", kind="module_forward",
                         crc="aaaaaaaa" if r != 1 else "bbbbbbbb"))
        rows.append(leaf(r, "Distributed.all_gather.0.forward", "output", "0.1", pos=2, crc=f"{r:08x}"[:8]))
        rows.append(leaf(r, "Distributed.all_gather.0.forward", "output", "1", pos=2, crc=f"{r:08x}"))
        rows.append(leaf(r, "Functional.relu.0.forward", "input_args", "0", pos=3, crc="cccccccc"))
    got = {(v["name"], v["arg"]): v for v in view(rows, [[0, 1, 2]])}
    w = got[("Module.fc.Linear.forward.0", "weight")]
    assert (w["category"], w["exact"], w["agree"], w["ranks"]) == ("parameter", True, False, [0, 1, 2])
    assert w["crc32"] == ["aaaaaaaa", "bbbbbbbb", "aaaaaaaa"]
    assert got[("Distributed.all_gather.0.forward", "0.1")]["category"] == "collective"
    # the second positional argument (the local input) is no replica
    assert got[("Distributed.all_gather.0.forward", "1")]["category"] == "call"
    relu = got[("Functional.relu.0.forward", "0")]
    assert relu["agree"] and relu["io_order"] == 0 and relu["n_ranks"] == 3


def test_statistics_tolerance_is_relative():
    rows = [leaf(0, "Torch.add.0.forward", "output", "0", stats=(1.0, 0.0, 0.5, 2.0)),
            leaf(1, "Torch.add.0.forward", "output", "0", stats=(1.0, 0.0, 0.5, 2.0 * (1 + 1e-7)))]
    assert view(rows, [[0, 1]])[0]["agree"] is False           # tol 0: equal statistics
    assert view(rows, [[0, 1]], tol=1e-6)[0]["agree"] is True
    assert view(rows, [[0, 1]], tol=1e-8)[0]["agree"] is False
    nan = [leaf(r, "Torch.add.0.forward", "output", "0", stats=(float("nan"),) * 4) for r in (0, 1)]
    assert view(nan, [[0, 1]])[0]["agree"] is True               # NaN on both ranks: the same record


def test_groups_and_process_groups_partition_ranks():
    rows = []
    for r in range(4):
        sub = [0, 1] if r < 2 else [2, 3]
        rows.append(leaf(r, "Distributed.all_reduce.0.forward", "output", "0", crc="1111111" + str(r // 2)))
        rows.append(leaf(r, "Distributed.all_reduce.0.forward", "input_kwargs", "group", leaf_kind="value",
                         value={"type": "torch.distributed.ProcessGroup", "value": sub}))
    got = view(rows, [[0, 1, 2, 3]])
    assert [(v["process_group"], v["ranks"], v["agree"]) for v in got] == [("[0,1]", [0, 1], True),
                                                                          ("[2,3]", [2, 3], True)]
    got = view(rows[:4], [[0], [1]])     # two one-rank groups: nothing to compare, agree
    assert [(v["grp"], v["n_ranks"], v["agree"]) for v in got] == [(0, 1, True), (1, 1, True)]


def test_must_agree_by_category_and_input_agreement():
    """3 ranks, each its own batch: what must agree is parameters, replicated collective
    outputs and outputs of calls whose inputs (tensors and values; a backward's forward
    inputs too) agree, except random APIs, calls nested around them and Distributed calls."""
    rows = []

    def call(name, ins, outs, *, pos, kind="api_forward", parent=None, values=()):
        """``ins``/``outs``: per leaf a function rank -> CRC-32; ``values``: (arg, rank -> value)."""
        for r in range(3):
            for i, crc in enumerate(ins):
                io = "input" if kind.endswith("backward") else "input_args"
                rows.append(leaf(r, name, io, str(i), kind=kind, pos=pos, crc=crc(r), parent=parent))
            for arg, value in values:
                rows.append(leaf(r, name, "input_args", arg, kind=kind, pos=pos, leaf_kind="value",
                                 value={"type": "int", "value": value(r)}, parent=parent))
            for i, crc in enumerate(outs):
                rows.append(leaf(r, name, "output", str(i), kind=kind, pos=pos, crc=crc(r), parent=parent))

    same = lambda r: "aaaaaaaa"             # noqa: E731
    per_rank = lambda r: f"0000000{r}"      # noqa: E731
    odd2 = lambda r: "bbbbbbbb" if r == 2 else "cccccccc"   # noqa: E731
    call("Functional.embedding.0.forward", [per_rank, same], [per_rank], pos=1)      # tokens differ by rank
    call("Torch.add.0.forward", [same, same], [same], pos=2)                         # equal in, equal out
    call("Torch.mul.0.forward", [same, same], [odd2], pos=3)                         # equal in, rank 2 out differs
    call("Functional.dropout.0.forward", [same], [per_rank], pos=4, parent="Module.blk.Block.forward.0")
    call("Module.blk.Block.forward.0", [same], [per_rank], pos=5, kind="module_forward")
    call("Torch.narrow.0.forward", [same], [per_rank], pos=6, values=[("1", lambda r: 2 * r)])
    call("Distributed.reduce_scatter.0.forward", [same], [per_rank], pos=7)
    call("Functional.embedding.0.backward", [same], [per_rank], pos=8, kind="api_backward")
    call("Torch.add.0.backward", [same], [same], pos=9, kind="api_backward")
    call("Distributed.all_to_all.0.forward", [same], [per_rank], pos=12, parent="Module.moe.Experts.forward.0")
    call("Module.moe.Experts.forward.0", [same], [per_rank], pos=13, kind="module_forward")   # holds all_to_all
    call("Distributed.all_reduce.0.forward", [same], [same], pos=14, parent="Module.tp.Reduce.forward.0")
    call("Module.tp.Reduce.forward.0", [same], [same], pos=15, kind="module_forward")         # a replicated one
    call("Torch.empty_like.0.forward", [same], [per_rank], pos=16)                            # uninitialised
    for r in range(3):
        rows.append(leaf(r, "Module.fc.Linear.forward.0", "parameters", "weight", kind="module_forward", pos=10,
                         crc="dddddddd"))
        rows.append(leaf(r, "Module.fc.Linear.parameters_grad", "weight", "", kind="parameters_grad", pos=11,
                         crc=per_rank(r)))
    got = {(v["name"], v["io"], v["arg"]): v for v in view(rows, [[0, 1, 2]])}

    def row(name, io="output", arg="0"):
        v = got[(name, io, arg)]
        return v["inputs_agree"], v["must_agree"], v["agree"]

    assert row("Functional.embedding.0.forward") == (False, False, False)
    assert row("Functional.embedding.0.forward", "input_args", "0")[1:] == (False, False)   # the batch
    assert row("Torch.add.0.forward") == (True, True, True)
    assert row("Torch.mul.0.forward") == (True, True, False)           # a corruption: checked and caught
    assert row("Functional.dropout.0.forward") == (True, False, False)   # random
    assert row("Module.blk.Block.forward.0") == (True, False, False)     # holds a random call
    assert row("Torch.narrow.0.forward") == (False, False, False)       # a value input differs by rank
    assert row("Distributed.reduce_scatter.0.forward") == (True, False, False)
    assert row("Functional.embedding.0.backward") == (False, False, False)   # its forward's inputs differ
    assert row("Torch.add.0.backward") == (True, True, True)
    assert row("Module.moe.Experts.forward.0") == (True, False, False)
    assert row("Module.tp.Reduce.forward.0") == (True, True, True)
    assert row("Torch.empty_like.0.forward") == (True, False, False)
    assert row("Module.fc.Linear.forward.0", "parameters", "weight")[1:] == (True, True)
    assert row("Module.fc.Linear.parameters_grad", "weight", "") == (None, False, False)   # local gradient


def test_bad_values():
    con = duckdb.connect()
    con.register("src", pa.Table.from_pylist([leaf(0, "Torch.add.0.forward", "output", "0")]))
    with pytest.raises(ValueError, match="tol: got -1"):
        create_replicas_view(con, "SELECT * FROM src", [[0]], tol=-1)
    with pytest.raises(ValueError, match="group 0 is empty"):
        create_replicas_view(con, "SELECT * FROM src", [[]])
    with pytest.raises(ValueError, match="group 0 holds -2"):
        create_replicas_view(con, "SELECT * FROM src", [[-2]])


def test_default_groups_and_group_text():
    assert default_groups(4, [0, 2]) == [[0, 1, 2, 3]]
    assert default_groups(None, [3, 1, 3]) == [[1, 3]]
    assert group_text([6, 0, 1, 2, 3]) == "0-3,6"


def test_the_view_without_lists_is_the_view_less_its_lists():
    rows = []
    for r in range(4):
        rows.append(leaf(r, "Module.fc.Linear.forward.0", "parameters", "weight", kind="module_forward",
                         crc="aaaaaaaa" if r != 3 else "bbbbbbbb"))
        rows.append(leaf(r, "Functional.linear.0.forward", "input_args", "0", pos=2,
                         stats=(1.0, 0.0, 0.5, 2.0 + (r == 2) * 1e-3)))
        rows.append(leaf(r, "Functional.linear.0.forward", "output", "0", pos=2, stats=(3.0, -1.0, 0.5, 4.0)))
        rows.append(leaf(r, "Functional.dropout.0.forward", "output", "0", pos=3, parent="Module.fc.Linear.forward.0"))
    lists = ("ranks", "crc32", "max", "min", "mean", "norm", "dtype", "shape")
    for tol in (0.0, 1e-2):
        con = duckdb.connect()
        con.register("src", pa.Table.from_pylist(rows))
        create_replicas_view(con, "SELECT * FROM src", [[0, 1, 2, 3], [0, 1]], tol=tol)
        create_replicas_view(con, "SELECT * FROM src", [[0, 1, 2, 3], [0, 1]], tol=tol, lists=False, name="flags")
        order = " ORDER BY grp, step, pos, io_order, name, io, arg"
        full, flags = (con.sql(f"SELECT * FROM {v}{order}").to_arrow_table() for v in ("replicas", "flags"))
        assert flags.column_names == [c for c in full.column_names if c not in lists]
        assert flags.to_pylist() == full.select(flags.column_names).to_pylist()
        # the rows differ in what they say: the weight (rank 3), the linear input within tol 1e-2 only
        agree = {(r["grp"], r["name"], r["io"]): r["agree"] for r in flags.to_pylist()}
        assert agree[(0, "Module.fc.Linear.forward.0", "parameters")] is False
        assert agree[(1, "Module.fc.Linear.forward.0", "parameters")] is True
        assert agree[(0, "Functional.linear.0.forward", "input_args")] is (tol > 0)


@pytest.mark.parametrize("tol", [0.0, 1e-3])
@pytest.mark.parametrize("odd, agree", [(float("nan"), False), (float("inf"), False), (-float("inf"), False),
                                        (0.5, True)])
def test_a_non_finite_statistic_agrees_only_with_itself(tol, odd, agree):
    """NaN or +-Inf on one rank against a finite Mean on the others disagrees at any
    tolerance (the spread max - min is NaN or Inf); the same value on every rank agrees."""
    rows = [leaf(r, "Torch.add.0.forward", "output", "0", stats=(1.0, 0.0, odd if r == 2 else 0.5, 2.0))
            for r in range(3)]
    assert view(rows, [[0, 1, 2]], tol=tol)[0]["agree"] is agree
    same = [leaf(r, "Torch.add.0.forward", "output", "0", stats=(1.0, 0.0, odd, 2.0)) for r in range(3)]
    assert view(same, [[0, 1, 2]], tol=tol)[0]["agree"] is True
    signs = [leaf(r, "Torch.add.0.forward", "output", "0", stats=(1.0, 0.0, (-1) ** r * float("inf"), 2.0))
             for r in range(2)]
    assert view(signs, [[0, 1]], tol=tol)[0]["agree"] is False
