"""``msprobe compare`` command line, outputs, options and bad input (exit 2)."""
from __future__ import annotations

import csv
import json

import pyarrow.parquet as pq
import pytest

import msprobe.compare as C
from msprobe.cli import main
from msprobe.compare.errors import CompareInputError
from msprobe.compare.options import parse_ranges, parse_tol


def test_cli_exit_codes_and_outputs(runs, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["compare", str(runs["same"]), str(runs["base"]), "-o", str(out)]) == 0
    assert main(["compare", str(runs["gelu"]), str(runs["base"]), "-o", str(out), "--mode", "md5"]) == 1
    text = capsys.readouterr().out
    assert "first origin: Functional.gelu.0.forward (step 0, forward) in Module.blocks.0.Block.forward.0" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdict"] == "diverged"
    rank = summary["ranks"][0]
    assert set(rank) == {"rank", "first_origin", "first_diverged", "counts"}
    assert set(rank["first_origin"]) >= {"name", "step", "direction", "module", "reason", "e", "stack"}
    assert rank["first_origin"]["e"] == 1.0
    # the origin's innermost user frame on one line: "File F, line N, in f: code"
    frame = rank["first_origin"]["stack"][0]
    head, code = frame.split("\n", 1)
    assert f"    at {head.rstrip().rstrip(',')}: {code.strip()}\n" in text
    # csv and parquet agree, and the calls table counts match the summary
    calls = pq.read_table(out / "calls.parquet").to_pylist()
    with open(out / "calls.csv", newline="") as handle:
        csv_rows = list(csv.DictReader(handle))
    assert [r["t_name"] for r in calls] == [r["t_name"] or None for r in csv_rows]
    for verdict, n in rank["counts"].items():
        assert sum(1 for r in calls if r["verdict"] == verdict) == n
    tensors = pq.read_table(out / "tensors.parquet")
    assert "Functional.gelu.0.forward" in tensors["t_call"].to_pylist()
    html = (out / "report.html").read_text()
    assert "Functional.gelu.0.forward" in html and "msprobe-data" in html and "http" not in html.replace(
        "http://www.w3.org/2000/svg", "")
    # msprobe query reads the OUT directory
    assert main(["query", str(out), "SELECT count(*) AS n FROM calls WHERE verdict = 'origin'", "--format", "csv"]) == 0
    assert capsys.readouterr().out.strip().splitlines() == ["n", str(rank["counts"]["origin"])]


def test_first_only_keeps_calls_up_to_first_origin(runs, tmp_path):
    r = C.compare(runs["gelu"], runs["base"], out=tmp_path / "o", first_only=True, formats="parquet")
    names = pq.read_table(tmp_path / "o" / "calls.parquet")["t_name"].to_pylist()
    assert names[-1] == "Functional.gelu.0.forward"
    assert names == ["Functional.linear.0.forward", "Module.blocks.0.fc1.Linear.forward.0", "Functional.gelu.0.forward"]
    assert not (tmp_path / "o" / "report.html").exists()
    assert r.first[0]["name"] == "Functional.gelu.0.forward"


def test_nan_origin(runs, tmp_path, capsys):
    assert main(["compare", str(runs["nan"]), "--nan-origin", "-o", str(tmp_path / "n")]) == 1
    assert "first NaN/Inf origin Functional.layer_norm.0.forward" in capsys.readouterr().out
    result = json.loads((tmp_path / "n" / "summary.json").read_text())
    assert result["ranks"][0]["first_origin"]["module"] == "Module.blocks.0.ln.LayerNorm.forward.0"
    assert main(["compare", str(runs["base"]), "--nan-origin"]) == 0
    # two dumps: the non-finite output is an origin too
    r = C.compare(runs["nan"], runs["base"])
    assert r.first[0]["name"] == "Functional.layer_norm.0.forward"
    assert r.first[0]["reason"].startswith("nonfinite output")


def test_nan_origin_outside_every_module_says_top_level(tmp_path, capsys):
    """A NaN made by a call outside every module: the origin's module is None in
    summary.json, and the line says ``(top level)``, as the HTML report does."""
    import torch

    from msprobe.pytorch import PrecisionDebugger

    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    torch.log(torch.tensor([-1.0, 1.0]))          # log(-1) = NaN from finite inputs
    dbg.stop()
    dbg.close()
    assert main(["compare", str(tmp_path / "d"), "--nan-origin", "-o", str(tmp_path / "n")]) == 1
    out = capsys.readouterr().out
    assert out.strip() == "rank 0: first NaN/Inf origin Torch.log.0.forward (step 0, forward) in (top level)"
    result = json.loads((tmp_path / "n" / "summary.json").read_text())
    assert result["ranks"][0]["first_origin"]["module"] is None


def test_query_on_compare_output(runs, tmp_path, capsys):
    """``msprobe query OUT``: a compare OUT with CSV tables only is queried from the CSV
    files; one without tables (``--format summary,xlsx``) gets an error saying what OUT is."""
    csv_out, bare = tmp_path / "csv", tmp_path / "bare"
    assert main(["compare", str(runs["gelu"]), str(runs["base"]), "-o", str(csv_out), "--format", "summary,csv"]) == 1
    assert main(["compare", str(runs["gelu"]), str(runs["base"]), "-o", str(bare), "--format", "summary"]) == 1
    capsys.readouterr()
    r = C.compare(runs["gelu"], runs["base"])
    (n,), = r.con.sql("SELECT count(*) FROM tensors").fetchall()
    assert main(["query", str(csv_out), "SELECT count(*) AS n FROM tensors", "--format", "csv"]) == 0
    assert capsys.readouterr().out == f"n\n{n}\n"
    assert main(["query", str(csv_out), "SELECT count(*) AS n FROM tensors", "--rank", "5"]) == 2
    assert "select rows in the SQL instead" in capsys.readouterr().err   # not silently ignored
    assert main(["query", str(bare), "SELECT 1"]) == 2
    err = capsys.readouterr().err
    assert "is an output directory of msprobe compare" in err and "--format parquet" in err
    assert "no msprobe log found" not in err


def test_loss_scale(runs):
    plain = C.compare(runs["scaled8"], runs["base"], mode="statistics")
    # the seed gradient (unrecorded) is 8x: no origin, the first diverged call is the first backward
    assert plain.exit_code == 1 and plain.first[0] is None
    first_diverged = plain.summary["ranks"][0]["first_diverged"]
    assert first_diverged["name"] == "Tensor.mean.0.backward" and first_diverged["direction"] == "backward"
    unscaled = C.compare(runs["scaled8"], runs["base"], mode="statistics", loss_scale=8)
    assert unscaled.exit_code == 0 and unscaled.summary["verdict"] == "close"
    # powers of two scale exactly: every backward statistic matches after dividing
    worst = unscaled.con.sql("SELECT max(e) FROM tensors").fetchall()[0][0]
    assert worst == 0.0


def test_tol_presets(runs):
    strict = C.compare(runs["gelu"], runs["base"], mode="statistics")
    assert strict.exit_code == 1
    loose = C.compare(runs["gelu"], runs["base"], mode="statistics", tol="loose")   # float32 1e-4 < 1e-3
    assert loose.exit_code == 1
    wide = C.compare(runs["gelu"], runs["base"], mode="statistics", tol="float32=0.01")
    assert wide.exit_code == 0 and wide.summary["verdict"] == "close"
    assert parse_tol("loose")["bfloat16"] == 5e-2
    assert parse_tol("bfloat16=0.1,float32=1e-5") == {"float64": 1e-7, "float32": 1e-5, "float16": 1e-3, "bfloat16": 0.1}
    with pytest.raises(CompareInputError, match="--tol: got 'int8=1'"):
        parse_tol("int8=1")
    with pytest.raises(CompareInputError, match="RTOL must be a number >= 0"):
        parse_tol("float16=-1")


def test_rank_step_selection(runs):
    r = C.compare(runs["two_steps"], runs["base"])
    # a step on one side only: what was compared agrees, but the answer is incomplete
    assert r.exit_code == 3 and r.summary["verdict"] == "incomplete"
    assert r.summary["verdict_of_compared"] in ("identical", "close")
    assert r.summary["incomplete"] == ["TARGET only (not compared): rank 0 step 1; missing from BASELINE"]
    assert any("TARGET only (not compared): rank 0 step 1" in n for n in r.summary["notes"])
    selected = C.compare(runs["two_steps"], runs["base"], step="0")  # the user chose what to compare
    assert selected.exit_code == 0 and selected.summary["incomplete"] == []
    r = C.compare(runs["two_steps"], runs["two_steps"], step="1", rank="0")
    assert {s for (s,) in r.con.sql("SELECT DISTINCT step FROM calls").fetchall()} == {1}
    with pytest.raises(CompareInputError, match="no calls left after --rank/--step"):
        C.compare(runs["two_steps"], runs["base"], step="5")
    assert parse_ranges("0,2-3", "rank") == {0, 2, 3}
    with pytest.raises(CompareInputError, match=r"--step: got '3-1'"):
        parse_ranges("3-1", "step")


def test_bad_input_exit_2(runs, tmp_path, capsys):
    missing = tmp_path / "nope"
    assert main(["compare", str(missing), str(runs["base"])]) == 2
    assert f"TARGET '{missing}': path does not exist" in capsys.readouterr().err
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    assert main(["compare", str(runs["base"]), str(empty_dir)]) == 2
    assert "no msprobe log" in capsys.readouterr().err
    assert main(["compare", str(runs["base"]), str(runs["base"]), "--mode", "fast"]) == 2
    assert "--mode: got 'fast'; allowed: auto, md5, statistics, tensor" in capsys.readouterr().err
    assert main(["compare", str(runs["base"]), str(runs["base"]), "--loss-scale", "0"]) == 2
    assert main(["compare", str(runs["base"]), str(runs["base"]), "--format", "pdf"]) == 2
    assert "--format: got 'pdf'" in capsys.readouterr().err
    assert main(["compare", str(runs["base"])]) == 2
    assert "BASELINE missing" in capsys.readouterr().err
    # md5 mode needs md5 on both sides
    assert main(["compare", str(runs["fp32"]), str(runs["base"]), "--mode", "md5"]) == 2
    assert "field 'md5' (CRC-32) missing from TARGET" in capsys.readouterr().err
    # the old subcommands still work
    assert main(["query", str(runs["base"]), "SELECT count(*) FROM calls"]) == 0


def test_upstream_spellings(runs, tmp_path, capsys):
    spec = tmp_path / "compare.json"
    spec.write_text(json.dumps({"npu_path": str(runs["gelu"] / "step0" / "rank" / "dump.json"),
                                "bench_path": str(runs["base"] / "step0" / "rank" / "dump.json"),
                                "stack_path": str(runs["gelu"] / "step0" / "rank" / "stack.json"),
                                "is_print_compare_log": True}))
    out = tmp_path / "o"
    assert main(["-f", "pytorch", "compare", "-i", str(spec), "-o", str(out), "-s", "-fm"]) == 1
    assert json.loads((out / "summary.json").read_text())["ranks"][0]["first_origin"]["name"] == \
        "Functional.gelu.0.forward"
    assert main(["compare", "-tp", str(runs["same"]), "-gp", str(runs["base"]), "-da"]) == 0
    capsys.readouterr()
    assert main(["compare", "-tp", str(runs["same"]), "-gp", str(runs["base"]), "-am", "map.yaml"]) == 2
    err = capsys.readouterr().err
    assert "-am/--api_mapping 'map.yaml': unreadable" in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"npu_path": "x"}')
    assert main(["compare", "-i", str(bad)]) == 2
    assert "fields 'npu_path' and 'bench_path' are required" in capsys.readouterr().err
    import importlib.util
    if importlib.util.find_spec("openpyxl") is None:   # with openpyxl: tests/compare/test_xlsx.py
        assert main(["compare", "-tp", str(runs["same"]), "-gp", str(runs["base"]), "--xlsx"]) == 2
        assert "--format xlsx: needs the openpyxl package" in capsys.readouterr().err


def test_python_api_is_lazy_and_callable(runs):
    import subprocess
    import sys

    code = ("import sys, msprobe; assert 'duckdb' not in sys.modules and 'msprobe.compare' not in sys.modules; "
            f"r = msprobe.compare({str(runs['gelu'])!r}, {str(runs['base'])!r}); "
            "print(r.first[0]['name'], r.exit_code, r.calls.count('*').fetchall()[0][0] > 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["Functional.gelu.0.forward", "1", "True"]


def test_levels_differ(runs, tmp_path, record_run):
    record = record_run
    l1 = record(tmp_path / "l1", level="L1", md5=True)
    l0 = record(tmp_path / "l0", level="L0", md5=True)
    r = C.compare(runs["gelu"], l1, mode="md5")        # mix vs L1: API calls only
    assert any("comparing the common entry kinds api_backward, api_forward" in n for n in r.summary["notes"])
    assert r.first[0]["name"] == "Functional.gelu.0.forward"
    assert r.summary["ranks"][0]["counts"]["unpaired"] == 0
    with pytest.raises(CompareInputError, match="levels differ: TARGET level 'L0'.*no entry kind in common"):
        C.compare(l0, l1)


def test_nan_origin_exit_status_ignores_intended_infinities(tmp_path, capsys):
    """A dump whose only infinities come from a mask built with float("-inf") (no call turns
    finite inputs into NaN/Inf) reports no origin and exits 0, though it holds non-finite values."""
    torch = pytest.importorskip("torch")
    from msprobe.pytorch import PrecisionDebugger

    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    mask = torch.triu(torch.full((4, 4), float("-inf")), diagonal=1)
    torch.softmax(torch.ones(4, 4) + mask, dim=-1)
    dbg.stop()
    dbg.close()
    from msprobe.compare.nan_origin import nan_origin

    assert nan_origin(str(tmp_path / "d"))["verdict"] == "nonfinite"
    assert main(["compare", str(tmp_path / "d"), "--nan-origin"]) == 0
    assert "rank 0: no NaN/Inf origin" in capsys.readouterr().out
