"""store.select and the readers built on it: --rank/--step choose the files to read before
anything is read; compacted parts and the log tail give the same answers as the log."""
from __future__ import annotations

import pytest

import store.select as select_module
from msprobe.check_ranks import CORRUPTION, check_ranks
from msprobe.cli import main
from store.compact import compact
from store.export import export_log
from store.log_writer import LogWriter
from store.query import query
from store.records import Call, Marker
from store.select import StoreReader


@pytest.fixture
def reads(monkeypatch):
    """The names of the log files a reader opens."""
    opened: list[str] = []

    class Recording(select_module.LogReader):
        def read_new(self):
            opened.append(self.path.name)
            return super().read_new()

    monkeypatch.setattr(select_module, "LogReader", Recording)
    return opened


def _three_ranks(root, sample):
    for r in (0, 1, 2):
        sample.write_scenario(root, rank=r, meta={**sample.META_MIX, "rank_dir": f"rank{r}"}, flush_rows=5)
    return root


SQLS = ("SELECT * FROM tensors ORDER BY rank, seq, io, arg",
        "SELECT * FROM calls ORDER BY rank, seq, name",
        "SELECT * FROM stacks ORDER BY stack_id, depth",
        "SELECT * FROM summary")


def test_rank_selection_opens_only_that_ranks_log(tmp_path, sample, reads):
    dump = _three_ranks(tmp_path / "d", sample)
    found = query(dump, "SELECT DISTINCT rank FROM tensors", ranks=[1]).to_pylist()
    assert found == [{"rank": 1}]
    assert len(reads) == 1 and reads[0].startswith("rank1.")


def test_after_compaction_closed_logs_are_not_read(tmp_path, sample, reads):
    dump = _three_ranks(tmp_path / "d", sample)
    full = [repr(query(dump, sql).to_pylist()) for sql in SQLS]
    compact(dump)
    reads.clear()
    assert [repr(query(dump, sql).to_pylist()) for sql in SQLS] == full
    assert reads == []                                  # every row came from the parts
    reader = StoreReader(dump, ranks=[2], steps=[1])
    assert reader.part_files() and all("rank=2" in f for f in reader.part_files())
    assert reader.tail.num_rows == 0 and reader.step_values() == [1] and reader.rank_values() == [2]


@pytest.mark.parametrize("compacted", [False, True])
def test_selected_views_equal_the_full_views_filtered(tmp_path, sample, compacted):
    dump = _three_ranks(tmp_path / "d", sample)
    if compacted:
        compact(dump)
    for sql in SQLS:
        got = query(dump, sql, ranks=[0, 2], steps=[1]).to_pylist()
        if "stacks" in sql:   # stacks are not per step: every stack of the selected ranks
            expected = query(dump, sql).to_pylist()
        else:
            expected = query(dump, f"SELECT * FROM ({sql}) WHERE rank IN (0, 2) AND step = 1").to_pylist()
        assert repr(got) == repr(expected) and expected, sql


def test_cli_query_rank_step_and_bad_lists(tmp_path, sample, capsys):
    dump = _three_ranks(tmp_path / "d", sample)
    assert main(["query", str(dump), "SELECT rank, step, count(*) AS n FROM tensors GROUP BY ALL ORDER BY ALL",
                 "--rank", "1-2", "--step", "1", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["rank,step,n", "1,1,2", "2,1,2"]
    assert main(["query", str(dump), "SELECT 1", "--rank", "2-1"]) == 2
    assert "--rank: got '2-1'" in capsys.readouterr().err


def test_export_of_one_rank_and_step_is_the_full_exports_directory(tmp_path, sample, json_files):
    dump = _three_ranks(tmp_path / "d", sample)
    export_log(dump, tmp_path / "all")
    compact(dump)
    report = export_log(dump, tmp_path / "one", ranks=[2], steps=[1])
    assert report.groups == ((2, 1),)
    one = json_files(tmp_path / "one")
    assert sorted(one) == ["step1/rank2/construct.json", "step1/rank2/dump.json", "step1/rank2/stack.json"]
    everything = json_files(tmp_path / "all")
    assert {k: everything[k] for k in one} == one


def _replicas(root, odd_rank: int, odd_step: int):
    """Three ranks, two steps of one Linear whose weight CRC-32 differs on ``odd_rank`` at
    ``odd_step``; written through the LogWriter (one log file per rank)."""
    for rank in (0, 1, 2):
        meta = {"task": "statistics", "level": "L0", "framework": "pytorch", "dump_data_dir": None,
                "rank_dir": f"rank{rank}", "world_size": 3}
        with LogWriter(root, rank, flush_rows=4, flush_interval_s=3600) as writer:
            writer.append_marker(Marker(step=0, kind="start", meta=meta))
            for step in (0, 1):
                crc = "deadbeef" if (rank, step) == (odd_rank, odd_step) else f"0000000{step}"
                writer.append(Call(step=step, kind="module_forward", name="Module.fc.Linear.forward.0",
                                   api_type="Module", keys=("input_args", "input_kwargs", "output", "parameters"),
                                   leaves=(Leaf_tensor("parameters", ("weight",), crc),
                                           Leaf_tensor("output", (0,), f"1000000{step}"))))
                writer.append_marker(Marker(step=step, kind="step_end", meta=meta))
    return root


def Leaf_tensor(io, path, crc):
    from store.records import Leaf

    return Leaf(io=io, path=path, leaf_kind="tensor", type="torch.Tensor", dtype="torch.float32", shape=(2,),
                numel=2, max=1.0, min=0.0, mean=0.5, norm=1.0, crc32=crc, requires_grad=True,
                has_nan=False, has_inf=False)


@pytest.mark.parametrize("compacted", [False, True])
def test_check_ranks_step_by_step_over_parts_and_log(tmp_path, compacted):
    dump = _replicas(tmp_path / "d", odd_rank=2, odd_step=1)
    if compacted:
        compact(dump)
    result = check_ranks(dump)
    (g,) = result.groups
    # compared: the weight at both steps, and step 0's output (its inputs, the weight,
    # agree there); step 1's output is not (rank 2's weight differs)
    assert g.ranks == (0, 1, 2) and g.steps == (0, 1) and g.compared == g.exact == 3
    f = g.first
    assert (f.step, f.name, f.io, f.arg, f.odd, f.majority, f.verdict) == (
        1, "Module.fc.Linear.forward.0", "parameters", "weight", (2,), (0, 1), CORRUPTION)
    assert f.values == {0: "00000001", 1: "00000001", 2: "deadbeef"}
    only_step0 = check_ranks(dump, steps=[0])
    assert only_step0.exit_code == 0 and only_step0.groups[0].steps == (0,)
    # a group of ranks 0 and 1 only: rank 2's file is not needed, and they agree
    assert check_ranks(dump, groups=[[0, 1]]).exit_code == 0
    assert result.source == "log"


def test_parts_alone_answer_once_the_logs_are_archived(tmp_path, sample):
    dump = _three_ranks(tmp_path / "d", sample)
    full = [repr(query(dump, sql).to_pylist()) for sql in SQLS]
    compact(dump)
    (dump / ".msprobe" / "log").rename(tmp_path / "archived")
    assert [repr(query(dump, sql).to_pylist()) for sql in SQLS] == full
    assert check_ranks(dump).exit_code == 0


def test_damaged_manifest_says_how_to_rebuild_the_parts(tmp_path, sample, capsys):
    import shutil

    from store.manifest import MANIFEST_NAME, parquet_dir

    dump = _three_ranks(tmp_path / "d", sample)
    full = [repr(query(dump, sql).to_pylist()) for sql in SQLS]
    compact(dump)
    (parquet_dir(dump) / MANIFEST_NAME).write_text("{not json")
    # readers fall back to the log (tests/store/test_damaged_parts.py); compact refuses and says how
    assert [repr(query(dump, sql).to_pylist()) for sql in SQLS] == full
    capsys.readouterr()
    assert main(["compact", str(dump)]) == 2
    assert "run msprobe compact again" in capsys.readouterr().err
    shutil.rmtree(parquet_dir(dump))                   # what the message says
    assert main(["compact", str(dump)]) == 0
    assert [repr(query(dump, sql).to_pylist()) for sql in SQLS] == full


@pytest.mark.parametrize("command", ["query", "export", "report"])
def test_a_selection_that_matches_nothing_is_named(tmp_path, sample, capsys, command):
    dump = _three_ranks(tmp_path / "d", sample)
    steps = sorted(set(query(dump, "SELECT DISTINCT step FROM calls").column("step").to_pylist()))
    args = {"query": [str(dump), "SELECT count(*) AS n FROM calls"], "export": [str(dump), "-o", str(tmp_path / "e")],
            "report": [str(dump), "-o", str(tmp_path / "r.html")]}[command]
    absent_step = max(steps) + 1
    assert main([command, *args, "--rank", "1,7-8", "--step", f"{steps[0]},{absent_step}"]) == 0
    err = capsys.readouterr().err
    assert f"selected ranks 7, 8: not in {str(dump)!r} (ranks there: 0, 1, 2)\n" in err
    assert f"selected step(s) {absent_step} not in the recording under {dump} (of the selected ranks)\n" in err
    assert main([command, *args, "--rank", "1", "--step", str(steps[0])]) == 0
    err = capsys.readouterr().err
    assert "not in the recording" not in err and "not in" not in err


@pytest.mark.parametrize("compacted", [False, True])
def test_a_narrowed_reader_reads_what_a_fresh_reader_of_that_selection_reads(tmp_path, sample, reads, compacted):
    from store.query import connect

    dump = _three_ranks(tmp_path / "d", sample)
    if compacted:
        compact(dump)
    whole = StoreReader(dump, ranks=[1, 2])
    opened = len(reads)
    narrow = whole.narrowed(ranks=[0, 1], steps=[1])
    assert len(reads) == opened                 # nothing read again
    fresh = StoreReader(dump, ranks=[1], steps=[1])
    assert (narrow.ranks, narrow.steps) == (frozenset({1}), frozenset({1}))
    assert narrow.part_files() == fresh.part_files() and [f.name for f in narrow.files] == [f.name for f in fresh.files]
    assert narrow.tail.to_pylist() == fresh.tail.to_pylist()
    for sql in SQLS:
        got, expected = (connect(dump, reader=r).sql(sql).fetchall() for r in (narrow, fresh))
        assert got == expected and expected, sql


@pytest.mark.parametrize("compacted", [False, True])
def test_table_of_chosen_columns_reads_only_those(tmp_path, sample, compacted):
    dump = _three_ranks(tmp_path / "d", sample)
    if compacted:
        compact(dump)
    reader = StoreReader(dump, ranks=[0, 2], steps=[1])
    whole = reader.table()
    some = reader.table(columns=["max", "rank", "row", "name"])
    from store.select import TAIL_SCHEMA
    assert some.column_names == [n for n in TAIL_SCHEMA.names if n in ("max", "rank", "row", "name")]
    assert some.num_rows == whole.num_rows > 0
    assert some.to_pylist() == whole.select(some.column_names).to_pylist()
    assert set(some["rank"].to_pylist()) == {0, 2}
    with pytest.raises(KeyError, match="nosuch"):
        reader.table(columns=["max", "nosuch"])


@pytest.mark.parametrize("compacted", [False, True])
def test_table_without_side_rows_and_with_dictionary_columns(tmp_path, sample, compacted):
    dump = _three_ranks(tmp_path / "d", sample)
    if compacted:
        compact(dump)
    reader = StoreReader(dump, ranks=[0, 2], steps=[1])
    whole = reader.table(columns=["rank", "row", "name", "io", "max"])
    lean = reader.table(columns=["rank", "row", "name", "io", "max"], side_rows=False, dictionary=["row", "name"])
    import pyarrow as pa
    assert pa.types.is_dictionary(lean.schema.field("name").type)
    assert not pa.types.is_dictionary(lean.schema.field("io").type)
    kept = [r for r in whole.to_pylist() if r["row"] in ("call", "leaf")]
    assert len(kept) < whole.num_rows and kept           # the sample has stack and marker rows
    key = lambda r: (r["rank"], r["row"], r["name"] or "", r["io"] or "", repr(r["max"]))  # noqa: E731
    assert sorted(lean.to_pylist(), key=key) == sorted(kept, key=key)
    with pytest.raises(KeyError, match="nosuch"):
        reader.table(columns=["max"], dictionary=["nosuch"])
