"""GRAPH_MODE level L2: a TrainOneStepCell run's kernel dump read into the event log,
queried, exported offline and compared (each run in a child process: MindSpore's mode and
kernel-dump config are per process)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from graph_run import ROOT, SCRIPT, train_in_graph_mode  # noqa: E402
from msprobe.cli import main as cli_main  # noqa: E402
from msprobe.kernel_dump.layout import execution_order, parse_file_name  # noqa: E402
from store import schema as S  # noqa: E402

D2_MATMUL = "Kernel.0.Default/network-WithLossCell/_backbone-Net/d2-Dense/MatMul-op0.0"


def _train(tmp: Path, name: str, config: dict, *flags: str) -> tuple[Path, str]:
    return train_in_graph_mode(tmp, name, {"level": "L2", **config}, *flags)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two 2-step runs recording every kernel (task tensor), the second with d2.weight
    perturbed; the first asks for level mix first."""
    tmp = tmp_path_factory.mktemp("graph_l2")
    config = {"task": "tensor", "tensor": {"list": []}}
    base, base_out = _train(tmp, "base", config, "--probe-level", "mix", "--live-steps")
    pert, _ = _train(tmp, "pert", config, "--perturb")
    return tmp, base, pert, base_out


def _query(dump: Path, sql: str, tmp: Path) -> list[dict]:
    out = tmp / "q.json"
    assert cli_main(["query", str(dump), sql, "--format", "json", "-o", str(out)]) == 0
    return json.loads(out.read_text())


def _np_stats(a: np.ndarray) -> tuple:
    """Independent float64 statistics (bool: any/all and no mean/norm)."""
    if a.dtype == np.bool_:
        return float(a.any()), float(a.all()), None, None
    f = a.astype(np.float64).ravel()
    return float(f.max()), float(f.min()), float(f.mean()), float(np.sqrt(np.sum(f * f)))


def test_mix_in_graph_mode_on_cpu_points_to_l0_and_l2(runs):
    """Level mix in GRAPH_MODE on CPU is a ConfigError naming the levels GRAPH_MODE records
    there (L0 Cells through pyfunc ops, L2 kernels); L0 itself records (test_ms_graph_cells.py)."""
    _tmp, _base, _pert, out = runs
    line = next(x for x in out.splitlines() if x.startswith("LEVEL"))
    assert line.startswith("LEVELERR config field `level`: got 'mix'; allowed: L0, L2")
    assert "level L0 for the Cells (CPU)" in line and "PYNATIVE_MODE" in line


def test_step_reads_finished_iterations_while_training_runs(runs):
    """After the second train step and step(), iteration 0 is in the log (iteration 1, the
    newest, waits for close())."""
    _tmp, _base, _pert, out = runs
    assert "LIVE_STEPS [0]" in out.splitlines()


def test_every_kernel_of_both_steps_is_in_the_log(runs):
    tmp, base, _pert, _out = runs
    order = execution_order(base, 0, 0)
    assert len(order) > 15 and any(s.startswith("Gradients/") for s in order)
    rows = _query(base, "SELECT step, name, kind FROM calls ORDER BY step, seq", tmp)
    assert {r["kind"] for r in rows} == {S.KERNEL}
    for step in (0, 1):
        names = [r["name"] for r in rows if r["step"] == step]
        kernels = [n for n in names if n.startswith("Kernel.")]
        # every kernel of the execution order, in that order, once per step
        assert kernels == [f"Kernel.0.{s}.0" for s in order]
        params = {n.split(".")[2] for n in names if n.startswith("Parameter.")}
        assert {"d1_weight", "d1_bias", "d2_weight", "d2_bias"} <= params
    # one leaf per dumped .npy file, each file named by exactly one leaf
    files = sorted(p.relative_to(base).as_posix() for p in base.glob("rank_0/Net/0/*/*.npy"))
    names = _query(base, "SELECT data_name FROM tensors ORDER BY data_name", tmp)
    assert [r["data_name"] for r in names] == files
    dirs = _query(base, "SELECT direction, count(*) AS n FROM tensors "
                        "WHERE name LIKE 'Kernel.0.Gradients/%' GROUP BY ALL", tmp)
    assert [d["direction"] for d in dirs] == ["backward"]


def test_query_statistics_equal_numpy_float64_on_the_npy_files(runs):
    tmp, base, _pert, _out = runs
    rows = _query(base, "SELECT step, name, api_type, io, arg, dtype, shape, numel, max, min, mean, norm, "
                        "has_nan, has_inf, data_name FROM tensors", tmp)
    assert len(rows) > 100
    for r in rows:
        f = base / r["data_name"]
        a = np.load(f)
        meta = parse_file_name(f.name)
        assert (r["dtype"], r["shape"], r["numel"]) == (meta.dtype, list(a.shape), a.size)
        assert r["step"] == int(f.parent.name)
        mx, mn, mean, norm = _np_stats(a)
        assert (r["max"], r["min"]) == (mx, mn), r
        if mean is None:
            assert r["mean"] is None and r["norm"] is None
        else:   # float64 sums: the project's one-pass order against numpy's pairwise sum
            assert r["mean"] == pytest.approx(mean, rel=1e-12, abs=1e-300)
            assert r["norm"] == pytest.approx(norm, rel=1e-12)
        assert r["has_nan"] is False and r["has_inf"] is False
    matmul = [r for r in rows if r["name"] == D2_MATMUL and r["step"] == 0]
    assert [(r["io"], r["arg"]) for r in matmul] == [("input", "0"), ("input", "1"), ("input", "2"),
                                                     ("input", "3"), ("output", "0")]


def test_recording_kernels_does_not_change_the_loss(runs):
    tmp, _base, _pert, out = runs
    plain = subprocess.run([sys.executable, "-c", _NO_DEBUGGER, str(SCRIPT)], cwd=tmp, capture_output=True,
                           text=True, timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                               [str(ROOT), str(SCRIPT.parent)])})
    assert plain.returncode == 0, plain.stderr[-2000:]
    losses = [x for x in out.splitlines() if x.startswith("LOSS")]
    assert len(losses) == 2 and losses == [x for x in plain.stdout.splitlines() if x.startswith("LOSS")]


# graph_train.py with a PrecisionDebugger that records nothing
_NO_DEBUGGER = """
import runpy, sys
import msprobe.mindspore as m
class _Off:
    def __init__(self, *a, **k): pass
    def step(self): pass
    def close(self): pass
m.PrecisionDebugger = _Off
sys.argv = [sys.argv[1], "unused.json"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_report_shows_the_kernels(runs, tmp_path):
    _tmp, base, _pert, _out = runs
    page = tmp_path / "report.html"
    assert cli_main(["report", str(base), "-o", str(page)]) == 0
    assert D2_MATMUL in page.read_text(encoding="utf-8")


def test_export_reads_a_kernel_dump_without_log_offline(runs, capsys):
    tmp, base, _pert, _out = runs
    copy = tmp / "offline"
    shutil.copytree(base, copy, ignore=shutil.ignore_patterns(S.LOG_DIR))
    assert cli_main(["export", str(copy)]) == 0
    assert "read 80 kernels" in capsys.readouterr().out
    sql = "SELECT step, seq, name, io, arg, max, min, mean, norm, data_name FROM tensors ORDER BY step, seq, io, arg"
    assert _query(copy, sql, tmp) == _query(base, sql, tmp)
    entry = json.loads((copy / "step1" / "rank_0" / "dump.json").read_text())["data"][D2_MATMUL]
    assert entry["output"][0]["data_name"] == _query(
        base, f"SELECT data_name FROM tensors WHERE step = 1 AND name = '{D2_MATMUL}' AND io = 'output'",
        tmp)[0]["data_name"]


def test_compare_names_the_first_kernel_consuming_the_perturbed_weight(runs, tmp_path):
    from msprobe.compare import compare

    _tmp, base, pert, _out = runs
    result = compare(pert, base, out=tmp_path / "cmp")
    assert result.summary["verdict"] == "diverged"
    rank = result.summary["ranks"][0]
    first = rank["first_diverged"] or rank["first_origin"]
    assert (first["name"], first["step"], first["direction"]) == (D2_MATMUL, 0, "forward")
    assert rank["counts"]["unpaired"] == 0
    # every kernel before it in step 0 passes: they do not read d2.weight
    calls = result.calls.filter("step = 0").order("ord").fetchall()
    names = [c[result.calls.columns.index("t_name")] for c in calls]
    verdicts = [c[result.calls.columns.index("verdict")] for c in calls]
    k = names.index(D2_MATMUL)
    assert set(verdicts[:k]) == {"pass"} and verdicts[k] != "pass"
    assert cli_main(["compare", str(pert), str(base)]) == 1


def test_compare_reads_kernel_dumps_without_log(runs, tmp_path):
    """MindSpore's own dump directories (no msprobe log): compare reads them into a
    temporary log, writes nothing into them, and finds the same first kernel."""
    from msprobe.compare import compare

    _tmp, base, pert, _out = runs
    plain = {}
    for name, src in (("base", base), ("pert", pert)):
        plain[name] = tmp_path / name
        shutil.copytree(src, plain[name], ignore=shutil.ignore_patterns(S.STORE_DIR, "kernel_dump_config.json"))
    rank = compare(plain["pert"], plain["base"]).summary["ranks"][0]
    first = rank["first_diverged"] or rank["first_origin"]
    assert (first["name"], first["step"]) == (D2_MATMUL, 0)
    assert rank["counts"]["unpaired"] == 0 and rank["counts"]["pass"] > 20
    assert not any((plain[n] / S.STORE_DIR).exists() for n in plain)


def test_several_kernel_names_step_and_statistics_on_cpu(tmp_path):
    """list ["MatMul", "ReLU"] selects those kernels only, step [1] iteration 1 only; task
    statistics on CPU: MindSpore dumps tensors, the reader reduces them (no data_name)."""
    dump, _ = _train(tmp_path, "sel", {"task": "statistics", "step": [1],
                                       "statistics": {"list": ["MatMul", "ReLU"]}})
    settings = json.loads((dump / "kernel_dump_config.json").read_text())["common_dump_settings"]
    assert (settings["dump_mode"], settings["kernels"], settings["saved_data"], settings["iteration"]) == \
        (1, ["MatMul", "ReLU"], "tensor", "1")
    rows = _query(dump, "SELECT DISTINCT step, api_type, data_name FROM tensors WHERE name LIKE 'Kernel.%'", tmp_path)
    assert {r["step"] for r in rows} == {1}
    types = {r["api_type"] for r in rows}   # MindSpore's own matching: "ReLU" also selects ReluGrad
    assert {"MatMul", "ReLU"} <= types and all("matmul" in t.lower() or "relu" in t.lower() for t in types)
    assert {r["data_name"] for r in rows} == {None}
    relu = _query(dump, "SELECT io, max, min FROM tensors WHERE api_type = 'ReLU' AND io = 'output'", tmp_path)
    files = list(dump.glob("rank_0/Net/0/1/ReLU.*.output.0.*.npy"))
    assert len(relu) == len(files) == 1
    a = np.load(files[0]).astype(np.float64)
    assert (relu[0]["max"], relu[0]["min"]) == (a.max(), a.min())


@pytest.mark.parametrize(("fields", "device", "expect"), [
    ({"task": "tensor"}, "CPU", {"dump_mode": 0, "kernels": [], "saved_data": "tensor", "iteration": "all",
                                 "input_output": 0}),
    ({"task": "tensor", "step": [0, 2], "tensor": {"list": ["Conv2D", "Default/net/MatMul-op3"],
                                                   "data_mode": ["input"]}},
     "CPU", {"dump_mode": 1, "kernels": ["Conv2D", "Default/net/MatMul-op3"], "iteration": "0|2", "input_output": 1}),
    ({"task": "statistics", "statistics": {"data_mode": ["output"]}}, "CPU",
     {"saved_data": "tensor", "input_output": 2}),
    ({"task": "statistics"}, "GPU", {"saved_data": "statistic", "statistic_category": [
        "max", "min", "avg", "l2norm", "count", "nan count", "negative inf count", "positive inf count"]}),
    ({"task": "statistics"}, "Ascend", {"saved_data": "statistic"}),
])
def test_kernel_dump_settings_map_the_config(tmp_path, fields, device, expect):
    from msprobe.core.config import load_config
    from msprobe.mindspore.graph_dump import kernel_dump_settings

    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"dump_path": str(tmp_path / "d"), "level": "L2", **fields}))
    common = kernel_dump_settings(load_config(str(cfg), framework="mindspore"), device)["common_dump_settings"]
    assert {k: common.get(k) for k in expect} == expect
    assert common["path"] == str(tmp_path / "d")
    if common["saved_data"] == "tensor":
        assert "statistic_category" not in common


def test_graph_example_runs_and_queries(tmp_path):
    """examples/ms_graph_l2.py: its final query lists each forward MatMul output per step,
    with Max equal to the .npy file's; run again, it replaces its earlier recording (one
    .npy file per kernel, four rows again)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    dump = tmp_path / "dump"
    for run in range(2):
        res = subprocess.run([sys.executable, str(ROOT / "examples" / "ms_graph_l2.py"), "--dump-path", str(dump)],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
        assert res.returncode == 0, res.stderr[-3000:]
        assert ("replaced the previous msprobe recording" in res.stdout) == (run == 1)
        lines = [x.split() for x in res.stdout.splitlines() if "MatMul" in x]
        assert [(x[0], x[1].split("/")[-2]) for x in lines] == [("0", "fc1-Dense"), ("0", "fc2-Dense"),
                                                                ("1", "fc1-Dense"), ("1", "fc2-Dense")]
        for step, name, mx, _norm in lines:
            scope = name[len("Kernel.0."):-len(".0")].replace("/", "_")
            (f,) = dump.glob(f"rank_0/Net/0/{step}/MatMul.{scope}.*.output.0.*.npy")
            assert float(mx.split("=")[1]) == pytest.approx(float(np.load(f).max()), rel=1e-5)
