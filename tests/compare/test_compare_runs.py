"""Compare on seeded tiny CPU models whose differences are known by construction (see
conftest.record). Tensor mode: test_tensor_mode.py; PyTorch vs MindSpore:
test_compare_mindspore.py; torchrun: test_compare_distributed.py."""
from __future__ import annotations

import json

import pytest

import msprobe.compare as C

GELU_LINE = "h = F.gelu(h)"


def calls_by_verdict(result, verdict):
    return [n for (n,) in result.con.sql(f"SELECT coalesce(t_name, b_name) FROM calls WHERE verdict = '{verdict}' "
                                         "ORDER BY step, ord").fetchall()]


# --- 1. identical runs ---------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["md5", "statistics"])
def test_identical_runs(runs, mode, tmp_path):
    r = C.compare(runs["same"], runs["base"], mode=mode, out=tmp_path / "o")
    assert r.summary["verdict"] == "identical" and r.exit_code == 0
    verdicts = r.con.sql("SELECT DISTINCT verdict FROM tensors").fetchall()
    assert verdicts == [("identical",)]
    n_calls = r.con.sql("SELECT count(*) FROM t_calls").fetchall()[0][0]
    assert r.summary["ranks"] == [{"rank": 0, "first_origin": None, "first_diverged": None,
                                   "counts": {"pass": n_calls, "propagated": 0, "origin": 0, "unpaired": 0}}]
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["verdict"] == "identical"


@pytest.mark.parametrize("level", ["L0", "L1"])
def test_identical_runs_other_levels(tmp_path, level, record_run):
    record = record_run
    a = record(tmp_path / "a", level=level, md5=True)
    b = record(tmp_path / "b", level=level, md5=True)
    r = C.compare(a, b, mode="md5")
    assert r.summary["verdict"] == "identical"
    kinds = {k for (k,) in r.con.sql("SELECT DISTINCT kind FROM calls").fetchall()}
    assert kinds <= ({"module_forward", "module_backward", "parameters_grad"} if level == "L0"
                     else {"api_forward", "api_backward"})


# --- 2. one op perturbed -------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["md5", "statistics"])
def test_perturbed_gelu_is_first_origin(runs, mode):
    r = C.compare(runs["gelu"], runs["base"], mode=mode)
    assert r.summary["verdict"] == "diverged" and r.exit_code == 1
    first = r.first[0]
    assert first["name"] == "Functional.gelu.0.forward"
    assert first["direction"] == "forward"
    assert first["module"] == "Module.blocks.0.Block.forward.0"
    assert "conftest.py" in first["stack"][0] and GELU_LINE in first["stack"][0]
    assert r.summary["ranks"][0]["first_diverged"] is None
    # every call before it passes
    before = r.con.sql("SELECT DISTINCT verdict FROM calls WHERE ord < (SELECT ord FROM calls "
                       "WHERE t_name = 'Functional.gelu.0.forward')").fetchall()
    assert before == [("pass",)]
    if mode == "statistics":
        (e,), = r.con.sql("SELECT e FROM tensors WHERE t_call = 'Functional.gelu.0.forward' AND io = 'output'").fetchall()
        assert e == pytest.approx(1e-3, rel=1e-3)   # every statistic scales by 1 + 1e-3


def test_one_ulp_md5_names_op_statistics_passes(runs):
    md5 = C.compare(runs["ulp"], runs["base"], mode="md5")
    assert md5.first[0]["name"] == "Functional.gelu.0.forward"
    stats = C.compare(runs["ulp"], runs["base"], mode="statistics")
    assert stats.summary["verdict"] in ("close", "identical") and stats.exit_code == 0
    assert stats.first[0] is None


# --- 3. inserted ops -----------------------------------------------------------------------
def test_inserted_ops_pair_true_counterparts(runs):
    r = C.compare(runs["ins"], runs["base"])
    assert r.exit_code == 0 and r.first[0] is None
    inserted = {n for (n,) in r.con.sql("SELECT t_name FROM alignment WHERE how = 'inserted'").fetchall()}
    assert inserted == {f"{op}.0.{d}" for op in ("Torch.tanh", "Tensor.__mul__", "Tensor.__add__")
                        for d in ("forward", "backward")}
    assert r.con.sql("SELECT count(*) FROM alignment WHERE how = 'deleted'").fetchall() == [(0,)]
    pairs = dict(r.con.sql("SELECT t_name, b_name FROM alignment WHERE b_name IS NOT NULL").fetchall())
    assert pairs["Tensor.__add__.1.forward"] == "Tensor.__add__.0.forward"
    assert pairs["Tensor.__add__.2.forward"] == "Tensor.__add__.1.forward"
    assert pairs["Tensor.__add__.1.backward"] == "Tensor.__add__.0.backward"
    assert all(t == b for t, b in pairs.items() if not t.startswith("Tensor.__add__"))
    assert r.summary["ranks"][0]["counts"]["unpaired"] == 6


def test_inserted_ops_and_later_perturbation(runs):
    r = C.compare(runs["ins_ln"], runs["base"])
    first = r.first[0]
    assert first["name"] == "Functional.layer_norm.0.forward"
    assert first["module"] == "Module.blocks.0.ln.LayerNorm.forward.0"
    assert r.summary["ranks"][0]["counts"]["unpaired"] == 6


# --- 4. bf16 autocast vs fp32 --------------------------------------------------------------
def test_bf16_autocast_pairs_everything_no_origin(runs):
    r = C.compare(runs["bf16"], runs["fp32"])
    counts = r.summary["ranks"][0]["counts"]
    assert counts["unpaired"] == 0 and counts["origin"] == 0
    assert r.first[0] is None and r.summary["ranks"][0]["first_diverged"] is None
    assert r.exit_code == 0
    dtypes = set(r.con.sql("SELECT DISTINCT t_dtype, b_dtype FROM tensors WHERE t_dtype <> b_dtype").fetchall())
    assert ("torch.bfloat16", "torch.float32") in dtypes       # autocast really ran
    ln = r.con.sql("SELECT verdict FROM calls WHERE t_name LIKE '%layer_norm%'").fetchall()
    assert ln and all(v == "pass" for (v,) in ln)


def test_bf16_fragile_op_is_first_origin(runs):
    r = C.compare(runs["bf16_fragile"], runs["fp32_fragile"])
    first = r.first[0]
    assert first["name"] == "Tensor.__sub__.0.forward"
    assert "var = (z * z).mean() - z.mean() ** 2" in first["stack"][0]
    assert r.summary["ranks"][0]["counts"]["unpaired"] == 0


def test_mostly_unpaired_calls_get_a_note(tmp_path):
    """The verdict speaks for paired calls only: when most calls found no partner (other
    models, or a dump path holding several runs' logs) the summary says so."""
    import torch

    from msprobe.compare.outputs import console_summary
    from msprobe.pytorch import PrecisionDebugger

    def run(path, ops):
        dbg = PrecisionDebugger(dump_path=str(path), level="L1")
        dbg.start()
        x = torch.linspace(0.1, 1.0, 8)
        for op in ops:  # looked up while recording: the API hooks replace torch's functions
            x = getattr(torch, op)(x)
        dbg.stop()
        dbg.close()
        return path

    a = run(tmp_path / "a", ["relu", "exp", "sin", "cos", "sqrt"])
    b = run(tmp_path / "b", ["relu", "tanh", "sigmoid", "abs", "square"])
    r = C.compare(a, b)
    counts = r.summary["ranks"][0]["counts"]
    paired = counts["pass"] + counts["propagated"] + counts["origin"]
    assert counts["unpaired"] > paired >= 1
    expected = f"rank 0: {counts['unpaired']} calls found no partner against {paired} paired"
    assert any(n.startswith(expected) for n in r.summary["notes"])
    assert "note: " + expected in console_summary(r.summary)
    same = C.compare(a, a)
    assert not any("found no partner" in n for n in same.summary["notes"])


def test_relative_error_of_equal_zeros_is_zero(runs):
    """LayerNorm's bias is 0 at step 0 on both sides: the relative errors are 0 %, not NaN."""
    r = C.compare(runs["same"], runs["base"])
    rows = r.con.sql("SELECT max_rel_pct, min_rel_pct, mean_rel_pct, norm_rel_pct FROM tensors "
                     "WHERE t_max = 0 AND b_max = 0 AND t_norm = 0 AND b_norm = 0").fetchall()
    assert rows and all(v == 0.0 for row in rows for v in row)
    (n,), = r.con.sql("SELECT count(*) FROM tensors WHERE isnan(max_rel_pct) OR isnan(norm_rel_pct)").fetchall()
    assert n == 0
