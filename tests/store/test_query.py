"""store.query: the views tensors / calls / stacks over the shared two-step run."""
from __future__ import annotations

import math

import pytest

from store.errors import LogNotFoundError, QueryError
from store.query import connect, query


@pytest.fixture
def dump(tmp_path, sample):
    path = tmp_path / "dump"
    sample.write_scenario(path, flush_rows=5)
    sample.write_scenario(path, rank=1, meta=dict(sample.META_MIX, rank_dir="rank1"))
    return path


def rows(dump, sql):
    return query(dump, sql).to_pylist()


def test_view_columns_are_the_contract(dump):
    con = connect(dump)
    try:
        def columns(view):
            return [d[0] for d in con.execute(f"SELECT * FROM {view} LIMIT 0").description]

        assert columns("tensors") == [
            "rank", "step", "seq", "name", "api_type", "direction", "io", "arg", "dtype", "shape",
            "numel", "max", "min", "mean", "norm", "crc32", "requires_grad", "has_nan", "has_inf",
            "data_name",
        ]
        assert columns("calls") == [
            "rank", "step", "seq", "name", "kind", "parent", "stack_id", "is_recompute",
        ]
        assert columns("stacks") == ["stack_id", "depth", "frame"]
    finally:
        con.close()


def test_counts(dump):
    # per rank, tensors of step 0: 3 + 3 + 4 + 2 (forward) + 2 + 1 + 1 + 1 (backward); step 1: 2
    assert rows(dump, "SELECT rank, step, count(*) AS n FROM tensors GROUP BY ALL ORDER BY ALL") == [
        {"rank": 0, "step": 0, "n": 17}, {"rank": 0, "step": 1, "n": 2},
        {"rank": 1, "step": 0, "n": 17}, {"rank": 1, "step": 1, "n": 2},
    ]
    # 10 call rows in step 0, the two parameters_grad rows of Module.fc.Linear merge
    assert rows(dump, "SELECT step, count(*) AS n FROM calls WHERE rank = 0 GROUP BY step ORDER BY step") == [
        {"step": 0, "n": 8}, {"step": 1, "n": 1},
    ]
    assert rows(dump, "SELECT count(*) AS n FROM stacks") == [{"n": 3}]


def test_tensor_values(dump):
    found = rows(dump, "SELECT * FROM tensors WHERE rank = 0 AND has_nan ORDER BY seq")
    assert len(found) == 1
    row = found[0]
    assert math.isnan(row.pop("max")) and math.isnan(row.pop("mean")) and math.isnan(row.pop("norm"))
    assert row == {
        "rank": 0, "step": 0, "seq": 1, "name": "Functional.linear.0.forward",
        "api_type": "Functional", "direction": "forward", "io": "output", "arg": "0",
        "dtype": "torch.float32", "shape": [2, 4], "numel": 8, "min": -math.inf,
        "crc32": "8e0be875", "requires_grad": True, "has_nan": True, "has_inf": True,
        "data_name": None,
    }
    nested = rows(dump, "SELECT arg, max FROM tensors WHERE rank = 0 AND name = 'Torch.cat.0.forward' "
                        "AND io = 'input_args' ORDER BY arg")
    assert nested == [{"arg": "0.0", "max": 1.0}, {"arg": "0.1", "max": 2.0}]
    directions = rows(dump, "SELECT direction, count(*) AS n FROM tensors WHERE rank = 0 AND step = 0 "
                            "GROUP BY direction ORDER BY direction")
    assert directions == [{"direction": "backward", "n": 5}, {"direction": "forward", "n": 12}]
    params = rows(dump, "SELECT arg, norm FROM tensors WHERE rank = 0 AND io = 'parameters' ORDER BY arg")
    assert params == [{"arg": "bias", "norm": 0.5}, {"arg": "weight", "norm": 2.0}]


def test_calls_merge_parameters_grad_and_keep_attributes(dump):
    found = rows(dump, "SELECT * FROM calls WHERE rank = 0 AND step = 0 ORDER BY seq")
    assert [(r["seq"], r["name"], r["kind"]) for r in found] == [
        (1, "Functional.linear.0.forward", "api_forward"),
        (2, "Torch.cat.0.forward", "api_forward"),
        (3, "Module.fc.Linear.forward.0", "module_forward"),
        (4, "Module.head.ReLU.forward.0", "module_forward"),
        (5, "Functional.linear.0.backward", "api_backward"),
        (6, "Module.fc.Linear.parameters_grad", "parameters_grad"),
        (7, "Module.fc.Linear.backward.0", "module_backward"),
        (9, "Module.other.Lin.parameters_grad", "parameters_grad"),
    ]
    first = found[0]
    assert first == {"rank": 0, "step": 0, "seq": 1, "name": "Functional.linear.0.forward",
                     "kind": "api_forward", "parent": "Module.fc.Linear.forward.0", "stack_id": 11,
                     "is_recompute": False}
    assert found[1]["is_recompute"] is True and found[1]["stack_id"] is None


def test_stacks_view(dump, sample):
    found = rows(dump, "SELECT * FROM stacks ORDER BY stack_id, depth")
    assert found == [
        {"stack_id": 11, "depth": 0, "frame": sample.FRAMES_LINEAR[0]},
        {"stack_id": 11, "depth": 1, "frame": sample.FRAMES_LINEAR[1]},
        {"stack_id": 12, "depth": 0, "frame": sample.FRAMES_MODULE[0]},
    ]
    joined = rows(dump, "SELECT c.name, s.frame FROM calls c JOIN stacks s USING (stack_id) "
                        "WHERE c.rank = 0 AND s.depth = 0 AND c.kind = 'module_forward'")
    assert joined == [{"name": "Module.fc.Linear.forward.0", "frame": sample.FRAMES_MODULE[0]}]


def test_bad_sql_raises_query_error(dump):
    with pytest.raises(QueryError, match="query failed: .*syntax error"):
        query(dump, "SELEC 1")
    with pytest.raises(QueryError, match="query failed: .*no_such_view"):
        query(dump, "SELECT * FROM no_such_view")


def test_sql_cannot_touch_files(dump, tmp_path):
    target = tmp_path / "leak.csv"
    for sql in (
        f"COPY (SELECT * FROM tensors) TO '{target}'",
        f"SELECT * FROM read_csv('{dump}/step0/rank0/dump.json')",
        f"ATTACH '{tmp_path / 'x.db'}'",
        "SET enable_external_access = true",
    ):
        with pytest.raises(QueryError):
            query(dump, sql)
    assert not target.exists()


def test_statement_without_result_gives_a_table(dump):
    result = query(dump, "CREATE VIEW scratch AS SELECT 1 AS x")
    assert result.num_rows == 0


def test_query_without_log(tmp_path):
    with pytest.raises(LogNotFoundError):
        query(tmp_path, "SELECT 1")


def test_two_runs_in_one_dump_path_keep_their_calls_apart(tmp_path, sample):
    """Two runs that wrote into one dump path (msprobe warns): calls keeps each run's calls
    as rows of their own, as tensors keeps each run's tensors, while the parameters_grad
    rows of one run still merge into one call."""
    one, mixed = tmp_path / "one", tmp_path / "mixed"
    sample.write_scenario(one, flush_rows=5)
    sample.write_scenario(mixed, flush_rows=5)
    sample.write_scenario(mixed, flush_rows=5)
    for view in ("tensors", "calls"):
        single = rows(one, f"SELECT count(*) AS n FROM {view}")[0]["n"]
        assert single > 0 and rows(mixed, f"SELECT count(*) AS n FROM {view}")[0]["n"] == 2 * single
    assert rows(mixed, "SELECT step, count(*) AS n FROM calls GROUP BY step ORDER BY step") == [
        {"step": 0, "n": 16}, {"step": 1, "n": 2},
    ]
    later = rows(mixed, "SELECT name, seq FROM calls WHERE step = 1 ORDER BY seq")
    assert later[0]["name"] == later[1]["name"] and later[0]["seq"] < later[1]["seq"]
    # each run's call joins to its own tensors by (rank, step, name) and the seq range
    assert rows(mixed, "SELECT count(DISTINCT seq) AS n FROM calls WHERE name = 'Module.fc.Linear.parameters_grad'") \
        == [{"n": 2}]


def test_one_file_per_rank_gives_the_calls_of_each_rank_as_a_single_rank_run(tmp_path, sample):
    """A distributed run (one log file per rank): each rank's calls are exactly those of a
    one-rank run of the same events (the file column splits nothing within a rank)."""
    one, dist = tmp_path / "one", tmp_path / "dist"
    sample.write_scenario(one, flush_rows=5)
    for rank in (0, 1, 2):
        sample.write_scenario(dist, rank=rank, meta=dict(sample.META_MIX, rank_dir=f"rank{rank}"), flush_rows=5)
    columns = "step, seq, name, kind, parent, stack_id, is_recompute"
    single = rows(one, f"SELECT {columns} FROM calls ORDER BY ALL")
    assert single
    for rank in (0, 1, 2):
        assert rows(dist, f"SELECT {columns} FROM calls WHERE rank = {rank} ORDER BY ALL") == single
