"""``msprobe compare`` of two of our stores with several steps works one step (or group of
steps) at a time (msprobe/compare/stepwise.py): each side is read one group at a time, the
tables are appended to the output files group by group, and the summary, notes, exit status
and table rows equal those of the comparison of every step at once
(``engine.STEP_AT_A_TIME = False``); with one step per group the tables' row order is
(step, rank) instead of (rank, step)."""
from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import msprobe.compare as C
from msprobe.compare import engine, load, stepwise
from store import schema as S

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.store_scale import template_step  # noqa: E402
from store.log_writer import LogWriter  # noqa: E402
from store.records import LEAF_FIELDS, Call, Marker, Stack, make_leaf  # noqa: E402

RANKS, STEPS = 4, 4
ORIGIN_A = (1, 1)       # (rank, step) of a TARGET output scaled by 1.01
ORIGIN_B = (3, 2)       # another one, at another call
NAN_AT = (2, 3)         # (rank, step) of a TARGET output that holds NaN


def _out_calls(calls) -> list[int]:
    """Indexes of the calls of kind api_forward with an output tensor."""
    return [i for i, c in enumerate(calls) if c["kind"] == "api_forward"
            and any(v[S.IO] == "output" and v[S.LEAF_KIND] == S.LEAF_TENSOR for v in c["leaves"])]


def _write(dump: Path, template, steps: int, changes: dict) -> Path:
    """The template step replayed for RANKS ranks x ``steps`` steps (statistics scaled by
    1 + 1e-3 * step); ``changes``: {(rank, step): (call index, "scale" | "nan")} applied to
    that call's output tensors."""
    calls, stacks, meta = template
    for rank in range(RANKS):
        rank_meta = {**meta, "rank_dir": f"rank{rank}", "world_size": RANKS}
        with LogWriter(dump, rank, flush_rows=512, flush_interval_s=3600) as writer:
            writer.append_marker(Marker(step=0, kind=S.MARKER_START, meta=rank_meta))
            for sid, frames in stacks.items():
                writer.append_stack(Stack(stack_id=sid, frames=frames))
            for step in range(steps):
                scale = 1.0 + 1e-3 * step
                change = changes.get((rank, step))
                for i, call in enumerate(calls):
                    leaves = []
                    for values in call["leaves"]:
                        v = dict(values)
                        for c in (S.MAX, S.MIN, S.MEAN, S.NORM, S.MAX_FINITE, S.MIN_FINITE):
                            if isinstance(v[c], float):
                                v[c] = v[c] * scale
                        if change and change[0] == i and v[S.IO] == "output" and v[S.LEAF_KIND] == S.LEAF_TENSOR:
                            if change[1] == "nan":
                                v[S.NORM], v[S.MEAN], v[S.HAS_NAN] = math.nan, math.nan, True
                            else:
                                for c in (S.MAX, S.MIN, S.MEAN, S.NORM):
                                    if isinstance(v[c], float):
                                        v[c] = v[c] * 1.01
                        leaves.append(make_leaf(tuple(v[f] for f in LEAF_FIELDS)))
                    writer.append(Call(step=step, kind=call["kind"], name=call["name"], api_type=call["api_type"],
                                       parent=call["parent"], stack_id=call["stack_id"],
                                       is_recompute=call["is_recompute"], keys=call["keys"], leaves=tuple(leaves)))
                writer.append_marker(Marker(step=step, kind=S.MARKER_STEP_END, meta=rank_meta))
    return dump


@pytest.fixture(scope="module")
def stores(tmp_path_factory, record_run):
    d = tmp_path_factory.mktemp("stepwise")
    template = template_step(record_run(d / "rec", steps=1))
    calls = _out_calls(template[0])
    a, b, n = calls[2], calls[len(calls) // 2], calls[-3]
    changes = {ORIGIN_A: (a, "scale"), ORIGIN_B: (b, "scale"), NAN_AT: (n, "nan")}
    out = {"template": template, "names": {ORIGIN_A: template[0][a]["name"], ORIGIN_B: template[0][b]["name"],
                                           NAN_AT: template[0][n]["name"]},
           "base": _write(d / "base", template, STEPS, {}),
           "same": _write(d / "same", template, STEPS, {}),
           "diff": _write(d / "diff", template, STEPS, changes),
           "short": _write(d / "short", template, STEPS - 1, {})}
    # rank 3's log gone (the markers say 4 ranks recorded)
    out["no_rank3"] = d / "no_rank3"
    shutil.copytree(out["diff"], out["no_rank3"])
    for f in (out["no_rank3"] / S.STORE_DIR / S.LOG_DIR).glob("*"):
        if f.name.startswith("rank3") or ".rank3." in f.name or f.name.split(".")[0].endswith("3"):
            f.unlink()
    # rank 2's log torn: its last bytes cut off
    out["torn"] = d / "torn"
    shutil.copytree(out["base"], out["torn"])
    logs = sorted((out["torn"] / S.STORE_DIR / S.LOG_DIR).glob("*"))
    from store.log_writer import parse_log_file_name
    victim = next(f for f in logs if (parse_log_file_name(f.name) or (None,))[0] == 2)
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) * 2 // 3])
    # compacted copies: the parts' row groups of one step are read, not the log
    from store.compact import compact
    for name in ("base", "diff"):
        out[f"{name}_parts"] = d / f"{name}_parts"
        shutil.copytree(out[name], out[f"{name}_parts"])
        compact(out[f"{name}_parts"])
    return out


@pytest.fixture(autouse=True)
def one_step_per_group(monkeypatch):
    """Every step is a group of its own (the test runs are far below the default budget)."""
    monkeypatch.setattr(stepwise, "GROUP_ROWS", 1)


def _compare_both(monkeypatch, tmp_path, target, baseline, **options):
    """(result one step at a time, the groups of steps loaded, whole-run result); outputs
    under tmp_path/streamed and tmp_path/whole."""
    loaded, whole_loads = [], []
    real_steps, real_side = load.load_log_steps, load.load_side

    def spy_steps(reader, steps, stacks, meta, tail=None):
        loaded.append((str(reader.dump_path), tuple(steps)))
        return real_steps(reader, steps, stacks, meta, tail)

    monkeypatch.setattr(load, "load_log_steps", spy_steps)
    monkeypatch.setattr(engine, "load_side", lambda *a, **k: whole_loads.append(k.get("steps")) or real_side(*a, **k))
    streamed = C.compare(target, baseline, out=tmp_path / "streamed", **options)
    assert whole_loads == []            # no side was loaded whole
    monkeypatch.setattr(engine, "STEP_AT_A_TIME", False)
    whole = C.compare(target, baseline, out=tmp_path / "whole", **options)
    monkeypatch.setattr(engine, "STEP_AT_A_TIME", True)
    return streamed, loaded, whole


def _by_rank_step(table: pa.Table) -> pa.Table:
    order = np.lexsort((table["step"].to_numpy(), table["rank"].to_numpy()))   # stable: (step, rank) -> (rank, step)
    return table.take(pa.array(order))


def _values(column: pa.ChunkedArray) -> list:
    return ["NaN" if isinstance(v, float) and v != v else v for v in column.to_pylist()]


def _assert_same(streamed, whole, tmp_path: Path, one_step_groups: bool = True) -> None:
    s, w = json.loads((tmp_path / "streamed" / "summary.json").read_text()), \
        json.loads((tmp_path / "whole" / "summary.json").read_text())
    assert s == w
    assert streamed.summary == whole.summary and streamed.notes == whole.notes
    assert streamed.exit_code == whole.exit_code and streamed.notices == whole.notices
    for name in ("tensors", "calls", "alignment"):
        mine = pq.read_table(tmp_path / "streamed" / f"{name}.parquet")
        theirs = pq.read_table(tmp_path / "whole" / f"{name}.parquet")
        assert mine.num_rows == theirs.num_rows > 0 and mine.schema.names == theirs.schema.names
        # step by step: (step, rank) order, each (rank, step)'s rows in the whole run's order
        if one_step_groups:
            keys = list(zip(mine["step"].to_pylist(), mine["rank"].to_pylist()))
            assert keys == sorted(keys)
        mine = _by_rank_step(mine)
        for column in theirs.schema.names:
            assert _values(mine[column]) == _values(theirs[column]), (name, column)
        # the CSV file holds the Parquet file's rows (one header)
        csv_mine = pacsv.read_csv(tmp_path / "streamed" / f"{name}.csv")
        csv_theirs = pacsv.read_csv(tmp_path / "whole" / f"{name}.csv")
        assert csv_mine.num_rows == csv_theirs.num_rows and csv_mine.column_names == csv_theirs.column_names
        assert sorted(map(str, csv_mine.to_pylist())) == sorted(map(str, csv_theirs.to_pylist()))
        # the result's view reads the same rows
        assert streamed.con.sql(f"SELECT count(*) FROM {name}").fetchall()[0][0] == theirs.num_rows
    assert not list((tmp_path / "streamed").glob(".*.tmp"))


def test_differences_in_several_steps_and_a_nan_origin(stores, monkeypatch, tmp_path):
    streamed, loaded, whole = _compare_both(monkeypatch, tmp_path, stores["diff"], stores["base"])
    # each side read one step at a time, every step once
    for side in (stores["diff"], stores["base"]):
        assert sorted(steps for path, steps in loaded if path == str(side)) == [(s,) for s in range(STEPS)]
    _assert_same(streamed, whole, tmp_path)
    assert streamed.verdict == "diverged" and streamed.exit_code == 1
    names = stores["names"]
    for (rank, step) in (ORIGIN_A, ORIGIN_B, NAN_AT):
        origin = streamed.first[rank]
        assert (origin["name"], origin["step"]) == (names[(rank, step)], step)
    assert streamed.first[0] is None
    assert streamed.summary["global_origin"]["rank"] == 1
    # counts: every call of the template (a call written in several rows counts once) paired
    # on every rank and step
    n_calls = len({c["name"] for c in stores["template"][0]})
    for r in streamed.summary["ranks"]:
        assert sum(r["counts"].values()) == n_calls * STEPS
        assert r["counts"]["unpaired"] == 0
    # the tensors: one pair per tensor leaf, NaN on the TARGET side where it was written
    n_leaves = len({(c["name"], v[S.IO], v[S.ARG]) for c in stores["template"][0] for v in c["leaves"]})
    (rows,), = streamed.con.sql("SELECT count(*) FROM tensors").fetchall()
    assert rows == n_leaves * STEPS * RANKS
    nan_rows = sum(1 for (norm,) in streamed.con.sql(
        f"SELECT t_norm FROM tensors WHERE t_has_nan AND rank = {NAN_AT[0]} AND step = {NAN_AT[1]}").fetchall()
        if math.isnan(norm))
    expect = sum(1 for c in stores["template"][0] if c["name"] == names[NAN_AT] for v in c["leaves"]
                 if v[S.IO] == "output" and v[S.LEAF_KIND] == S.LEAF_TENSOR)
    assert nan_rows == expect >= 1


def test_identical_stores_compacted_and_not(stores, monkeypatch, tmp_path):
    streamed, _, whole = _compare_both(monkeypatch, tmp_path, stores["base_parts"], stores["same"])
    _assert_same(streamed, whole, tmp_path)
    assert streamed.verdict == "identical" and streamed.exit_code == 0
    assert streamed.summary["incomplete"] == []


def test_compacted_differences(stores, monkeypatch, tmp_path):
    streamed, _, whole = _compare_both(monkeypatch, tmp_path, stores["diff_parts"], stores["base_parts"])
    _assert_same(streamed, whole, tmp_path)
    assert {r: f["step"] for r, f in streamed.first.items() if f} == {1: 1, 3: 2, 2: 3}


def test_a_step_on_one_side_only_stays_incomplete(stores, monkeypatch, tmp_path):
    streamed, _, whole = _compare_both(monkeypatch, tmp_path, stores["base"], stores["short"])
    _assert_same(streamed, whole, tmp_path)
    assert streamed.verdict == "incomplete" and streamed.exit_code == 3
    only = ", ".join(f"rank {r} step {STEPS - 1}" for r in range(RANKS))
    assert f"TARGET only (not compared): {only}; missing from BASELINE" in streamed.summary["incomplete"]


def test_a_missing_rank_and_a_torn_log_stay_incomplete(stores, monkeypatch, tmp_path):
    streamed, _, whole = _compare_both(monkeypatch, tmp_path, stores["torn"], stores["same"])
    _assert_same(streamed, whole, tmp_path)
    assert streamed.verdict == "incomplete" and streamed.exit_code == 3
    assert any(line.startswith("TARGET: ") for line in streamed.summary["incomplete"])
    assert streamed.summary["log_skipped"] or any("end-of-stream" in x for x in streamed.summary["incomplete"])

    gone = tmp_path / "gone"
    gone.mkdir()
    streamed, _, whole = _compare_both(monkeypatch, gone, stores["no_rank3"], stores["base"])
    _assert_same(streamed, whole, gone)
    assert streamed.verdict == "diverged"       # a divergence found stands; what is missing is listed
    assert "TARGET: rank 3 has no readable log (the run recorded it)" in streamed.summary["incomplete"]
    assert [r["rank"] for r in streamed.summary["ranks"]] == [0, 1, 2]


def test_options_that_need_every_step_load_the_run_whole(stores, monkeypatch, tmp_path):
    seen = []
    real = load.load_side
    monkeypatch.setattr(engine, "load_side", lambda *a, **k: seen.append(k.get("steps")) or real(*a, **k))
    result = C.compare(stores["diff"], stores["base"], first_only=True)
    assert seen == [None, None]
    assert result.first[1]["step"] == ORIGIN_A[1]
    seen.clear()
    C.compare(stores["diff"], stores["base"], step="1-2")      # two steps selected: one at a time
    assert seen == []
    seen.clear()
    from store.select import StoreReader
    opened = []
    real_init = StoreReader.__init__
    monkeypatch.setattr(StoreReader, "__init__", lambda self, *a, **k: opened.append(a[0]) or real_init(self, *a, **k))
    C.compare(stores["diff"], stores["base"], step="2")        # one step: loaded as selected
    assert seen == [frozenset({2})] * 2
    assert sorted(map(str, opened)) == sorted([str(stores["diff"]), str(stores["base"])])   # each log read once


def test_without_out_the_tables_are_still_queryable(stores, monkeypatch, tmp_path):
    result = C.compare(stores["diff"], stores["base"], formats=["summary"])
    (n,), = result.con.sql("SELECT count(*) FROM calls WHERE verdict = 'origin'").fetchall()
    assert n == sum(r["counts"]["origin"] for r in result.summary["ranks"]) >= 3
    spill = Path(result.sink.parquet["tensors"]).parent
    assert spill.is_dir()
    result.con.close()
    del result
    import gc
    gc.collect()
    assert not spill.exists()


def test_report_and_workbook_read_the_step_files(stores, monkeypatch, tmp_path):
    pytest.importorskip("openpyxl")
    streamed = C.compare(stores["diff"], stores["base"], out=tmp_path / "s", formats=["summary", "html", "xlsx"])
    monkeypatch.setattr(engine, "STEP_AT_A_TIME", False)
    whole = C.compare(stores["diff"], stores["base"], out=tmp_path / "w", formats=["summary", "html", "xlsx"])
    assert (tmp_path / "s" / "report.html").stat().st_size > 0
    assert not (tmp_path / "s" / "tensors.parquet").exists()        # not asked for: kept in a temporary directory
    page_s = (tmp_path / "s" / "report.html").read_text()
    page_w = (tmp_path / "w" / "report.html").read_text()
    assert len(page_s) == pytest.approx(len(page_w), rel=0.02)
    assert streamed.summary == whole.summary


def test_groups_of_steps_give_the_same_answer(stores, monkeypatch, tmp_path):
    # a budget of two steps' rows (call rows and tensor leaves of both sides, as counted
    # from the template): steps 0-1 and 2-3 are read together
    calls = stores["template"][0]
    per_step = 2 * RANKS * (len(calls) + sum(1 for c in calls for v in c["leaves"] if v[S.LEAF_KIND] == S.LEAF_TENSOR))
    monkeypatch.setattr(stepwise, "GROUP_ROWS", 2 * per_step)
    streamed, loaded, whole = _compare_both(monkeypatch, tmp_path, stores["diff_parts"], stores["base"])
    assert sorted({steps for _, steps in loaded}) == [(0, 1), (2, 3)]
    _assert_same(streamed, whole, tmp_path, one_step_groups=False)
    assert streamed.verdict == "diverged"


def test_group_cutting():
    assert stepwise._groups([0, 1, 2, 3, 5], {0: 5, 1: 5, 2: 20, 3: 1, 5: 2}, 10) == [[0, 1], [2], [3, 5]]
    assert stepwise._groups([0, 1], {}, 0) == [[0, 1]]          # steps of no rows join the group
    assert stepwise._groups([4], {4: 99}, 10) == [[4]]


def test_summary_only_keeps_no_table(stores, tmp_path):
    import tempfile

    before = set(Path(tempfile.gettempdir()).glob("msprobe-compare-*"))
    result = C.compare(stores["diff"], stores["base"], out=tmp_path, formats=["summary"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
    assert set(Path(tempfile.gettempdir()).glob("msprobe-compare-*")) == before
    assert json.loads((tmp_path / "summary.json").read_text())["verdict"] == result.verdict == "diverged"


def test_tensor_mode_step_by_step(tmp_path_factory, record_run, scaled_fn, monkeypatch, tmp_path):
    d = tmp_path_factory.mktemp("stepwise_tensor")
    target = record_run(d / "t", task="tensor", steps=3, perturb={"F.gelu": scaled_fn(1 + 1e-3)})
    baseline = record_run(d / "b", task="tensor", steps=3)
    streamed, loaded, whole = _compare_both(monkeypatch, tmp_path, target, baseline)
    assert sorted(steps for _, steps in loaded) == [(0,), (0,), (1,), (1,), (2,), (2,)]
    assert streamed.summary["mode"] == "tensor" and streamed.stats["tensor_pairs"] == whole.stats["tensor_pairs"] > 0
    _assert_same(streamed, whole, tmp_path)
    assert streamed.verdict == "diverged" and streamed.first[0]["name"] == "Functional.gelu.0.forward"


def test_cli_without_out_writes_no_table(stores, capsys):
    import tempfile

    from msprobe.cli import main

    before = set(Path(tempfile.gettempdir()).glob("msprobe-compare-*"))
    assert main(["compare", str(stores["diff"]), str(stores["base"])]) == 1
    assert set(Path(tempfile.gettempdir()).glob("msprobe-compare-*")) == before
    out = capsys.readouterr().out
    assert out.startswith("verdict: diverged") and f"first origin: {stores['names'][ORIGIN_A]} (step 1" in out
