"""``--mode tensor``: metrics from the saved tensor values
(payload shards of our logs, ``.pt`` files of exported/upstream layouts), checked against
numpy float64 recomputation from the recorded tensors."""
from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import torch

import msprobe.compare as C
from msprobe.cli import main
from msprobe.compare.errors import CompareInputError
from msprobe.compare.tensordata import numpy_dtype, _from_bytes

GELU_LINE = "h = F.gelu(h)"


@pytest.fixture(scope="module")
def truns(tmp_path_factory, record_run, scaled_fn):
    d = tmp_path_factory.mktemp("tensor_runs")
    return {
        "base": record_run(d / "base", task="tensor"),
        "same": record_run(d / "same", task="tensor"),
        "gelu": record_run(d / "gelu", task="tensor", perturb={"F.gelu": scaled_fn(1 + 1e-3)}),
        "stats": record_run(d / "stats"),
    }


def test_identical_runs_tensor_mode(truns, tmp_path):
    r = C.compare(truns["same"], truns["base"], mode="tensor", out=tmp_path / "o")
    assert r.exit_code == 0 and r.summary["verdict"] == "identical"
    assert r.con.sql("SELECT DISTINCT verdict FROM tensors WHERE t_leaf_kind = 'tensor'").fetchall() == [("identical",)]
    n = r.con.sql("SELECT count(*) FROM tensors WHERE cosine IS NOT NULL OR euc_dist = 0").fetchall()[0][0]
    assert n == r.stats["tensor_pairs"] > 50
    assert main(["compare", str(truns["same"]), str(truns["base"]), "--mode", "tensor",
                 "-o", str(tmp_path / "cli")]) == 0
    # auto picks tensor when both sides hold tensor data
    assert C.compare(truns["same"], truns["base"]).stats.get("tensor_pairs") == n


def test_perturbed_gelu_tensor_mode(truns):
    r = C.compare(truns["gelu"], truns["base"], mode="tensor")
    assert r.exit_code == 1
    first = r.first[0]
    assert first["name"] == "Functional.gelu.0.forward" and first["direction"] == "forward"
    assert first["module"] == "Module.blocks.0.Block.forward.0"
    assert GELU_LINE in first["stack"][0]
    assert r.summary["ranks"][0]["first_diverged"] is None
    (cos, euc, e, mae, mre, r1, r5), = r.con.sql(
        "SELECT cosine, euc_dist, e, max_abs_err, max_rel_err, one_thousandth_ratio, five_thousandths_ratio "
        "FROM tensors WHERE t_call = 'Functional.gelu.0.forward' AND io = 'output'").fetchall()
    # recompute from the saved .pt files of both dumps (exported layout)
    def pt(run):
        return torch.load(run / "step0" / "rank" / "dump_tensor_data" / "Functional.gelu.0.forward.output.0.pt",
                          weights_only=True).double().numpy().ravel()
    n, b = pt(truns["gelu"]), pt(truns["base"])
    d = n - b
    rel = np.abs(d) / np.where(b == 0, np.finfo(np.float64).eps, np.abs(b))
    assert cos == pytest.approx(n @ b / np.linalg.norm(n) / np.linalg.norm(b), rel=1e-12)
    assert euc == pytest.approx(np.linalg.norm(d), rel=1e-12)
    assert e == pytest.approx(np.linalg.norm(d) / np.linalg.norm(b), rel=1e-12)
    assert e == pytest.approx(1e-3, rel=2e-3)       # float32 rounding of the 1.001 factor
    assert mae == pytest.approx(np.abs(d).max(), rel=1e-12)
    assert mre == pytest.approx(rel.max(), rel=1e-12)
    assert r1 == pytest.approx(float((rel < 0.001).mean())) and r5 == pytest.approx(float((rel < 0.005).mean()))
    assert r5 == 1.0
    before = r.con.sql("SELECT DISTINCT verdict FROM calls WHERE ord < (SELECT ord FROM calls "
                       "WHERE t_name = 'Functional.gelu.0.forward')").fetchall()
    assert before == [("pass",)]


def test_tensor_mode_from_exported_files_only(truns, tmp_path):
    """Upstream layout (dump.json + .pt files, no log): read with torch.load."""
    for name in ("gelu", "base"):
        shutil.copytree(truns[name] / "step0", tmp_path / name / "step0")
    r = C.compare(tmp_path / "gelu", tmp_path / "base", mode="tensor")
    assert r.first[0]["name"] == "Functional.gelu.0.forward"
    # a missing tensor file is missing_data, not a crash
    victim = tmp_path / "base" / "step0" / "rank" / "dump_tensor_data" / "Functional.linear.0.forward.output.0.pt"
    victim.unlink()
    r = C.compare(tmp_path / "gelu", tmp_path / "base", mode="tensor")
    got = r.con.sql("SELECT verdict FROM tensors WHERE t_call = 'Functional.linear.0.forward' AND io = 'output'").fetchall()
    assert got == [("missing_data",)]
    assert r.first[0]["name"] == "Functional.gelu.0.forward"


def test_tensor_mode_needs_tensor_data(truns):
    with pytest.raises(CompareInputError, match=r"--mode tensor: BASELINE .* no tensor data"):
        C.compare(truns["base"], truns["stats"], mode="tensor")


def test_bfloat16_bytes_widen_exactly():
    t = torch.tensor([1.5, -2.25, 3.0e38, 1e-40], dtype=torch.bfloat16)
    raw = t.view(torch.int16).numpy().tobytes()
    got = _from_bytes(raw, "torch.bfloat16", (4,))
    assert got.dtype == np.float32 and np.array_equal(got, t.float().numpy())
    assert numpy_dtype("Float16") is np.float16
    with pytest.raises(ValueError, match="allowed"):
        numpy_dtype("torch.qint8")


def _rows(rel):
    """All rows of a relation, sorted, with floats compared exactly (NaN as a string)."""
    out = []
    for row in rel.fetchall():
        out.append(tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in row))
    return sorted(out, key=repr)


def test_workers_give_the_same_tensors_table(truns):
    one = C.compare(truns["gelu"], truns["base"], mode="tensor", workers=1)
    three = C.compare(truns["gelu"], truns["base"], mode="tensor", workers=3)
    assert one.stats["tensor_pairs"] == three.stats["tensor_pairs"] > 50
    assert one.tensors.columns == three.tensors.columns
    assert _rows(one.tensors) == _rows(three.tensors)
    assert one.summary == three.summary
    # the gelu output pair carries real metrics: e = |N - B| / |B| = 1e-3 for N = B * (1 + 1e-3)
    (e, cos), = one.con.sql("SELECT e, cosine FROM tensors WHERE t_call = 'Functional.gelu.0.forward' "
                            "AND io = 'output'").fetchall()
    assert e == pytest.approx(1e-3, rel=1e-3) and cos == pytest.approx(1.0, abs=1e-9)


def test_workers_bad_value_exit_2(truns, capsys):
    assert main(["compare", str(truns["gelu"]), str(truns["base"]), "--workers", "0"]) == 2
    assert "--workers: got 0; allowed: an integer from 1 to 256" in capsys.readouterr().err
    assert main(["compare", str(truns["gelu"]), str(truns["base"]), "--workers", "two"]) == 2
    with pytest.raises(CompareInputError, match="--workers"):
        C.compare(truns["gelu"], truns["base"], workers=True)


def test_first_only_tensor_mode_stops_early_same_origin(truns, tmp_path):
    full = C.compare(truns["gelu"], truns["base"], mode="tensor")
    first = C.compare(truns["gelu"], truns["base"], mode="tensor", first_only=True, workers=2,
                      out=tmp_path / "o", formats="parquet")
    # the first origin (gelu of block 0, the 3rd call) is known from the first chunk of pairs
    assert first.first == full.first
    assert first.first[0]["name"] == "Functional.gelu.0.forward"
    assert first.first[0]["stack"][0].endswith(GELU_LINE)
    assert first.stats["tensor_pairs"] < full.stats["tensor_pairs"]
    # the leaf metrics that were read equal the full run's
    keys = "rank, step, aid, io, arg, state, e, cosine, max_abs_err"
    read = _rows(first.con.sql(f"SELECT {keys} FROM tensors WHERE cosine IS NOT NULL"))
    assert read and set(read) <= set(_rows(full.con.sql(f"SELECT {keys} FROM tensors")))
    # outputs end at the first origin
    import pyarrow.parquet as pq
    names = pq.read_table(tmp_path / "o" / "calls.parquet")["t_name"].to_pylist()
    assert names[-1] == "Functional.gelu.0.forward"


def test_first_only_tensor_mode_without_origin_reads_everything(truns):
    full = C.compare(truns["same"], truns["base"], mode="tensor")
    first = C.compare(truns["same"], truns["base"], mode="tensor", first_only=True)
    assert first.verdict == full.verdict == "identical"
    assert first.stats["tensor_pairs"] == full.stats["tensor_pairs"]
    assert first.summary["ranks"][0]["counts"] == full.summary["ranks"][0]["counts"]
