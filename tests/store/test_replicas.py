"""store.replicas: the ``replicas`` view over a hand-made source relation."""
from __future__ import annotations

import json

import duckdb
import pyarrow as pa
import pytest

from store.replicas import create_replicas_view, default_groups, group_text

COLUMNS = ["rank", "step", "pos", "name", "kind", "io", "arg", "leaf_kind", "dtype", "shape", "max", "min",
           "mean", "norm", "crc32", "requires_grad", "value_json"]


def leaf(rank, name, io, arg, *, kind="api_forward", pos=1, stats=(1.0, 0.0, 0.5, 2.0), crc=None, step=0,
         leaf_kind="tensor", value=None):
    return dict(zip(COLUMNS, [rank, step, pos, name, kind, io, arg, leaf_kind, "torch.float32", [2],
                              *stats, crc, True, None if value is None else json.dumps(value)]))


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
