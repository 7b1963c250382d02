"""GRAPH_MODE level L0 on CPU: Cell records through pyfunc ops (msprobe.mindspore.graph_cells).

A 2-step ``TrainOneStepCell`` run (graph_train.py, in a child process: MindSpore's mode is
per process) records every Cell's forward and backward; the recorded statistics are checked
against numpy float64 over the same Cells run in PyNative on the same weights and inputs
(gradients from ``mindspore.grad``, no msprobe), and the losses against a run without msprobe.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import Tensor, nn  # noqa: E402

from msprobe.cli import main as cli_main  # noqa: E402
from store import schema as S  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("graph_train.py")
CELLS = ("Cell.d1.Dense", "Cell.relu.ReLU", "Cell.d2.Dense")


def _run(tmp: Path, name: str, config: dict, *flags: str) -> tuple[Path, str]:
    dump = tmp / name
    cfg = tmp / f"{name}.json"
    cfg.write_text(json.dumps({"dump_path": str(dump), "level": "L0", **config}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(SCRIPT.parent)])}
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    res = subprocess.run([sys.executable, str(SCRIPT), str(cfg), *flags], cwd=tmp, capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return dump, res.stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A recorded 2-step run (task statistics) with its inputs and weights before each step,
    the same run with d2.weight + 1e-3, and the run without msprobe."""
    tmp = tmp_path_factory.mktemp("graph_l0")
    state = tmp / "state.npz"
    base, base_out = _run(tmp, "base", {"task": "statistics"}, "--start", "--save-state", str(state))
    pert, _ = _run(tmp, "pert", {"task": "statistics"}, "--start", "--perturb")
    _plain, plain_out = _run(tmp, "plain", {}, "--no-debugger")
    return tmp, base, pert, dict(np.load(state)), base_out, plain_out


def _losses(out: str) -> list[str]:
    return [x for x in out.splitlines() if x.startswith("LOSS")]


def _query(dump: Path, sql: str, tmp: Path) -> list[dict]:
    out = tmp / "q.json"
    assert cli_main(["query", str(dump), sql, "--format", "json", "-o", str(out)]) == 0
    return json.loads(out.read_text())


def _np_stats(a: np.ndarray) -> tuple[float, float, float, float]:
    f = np.asarray(a, dtype=np.float64).ravel()
    return float(f.max()), float(f.min()), float(f.mean()), float(np.sqrt(np.sum(f * f)))


class _Net(nn.Cell):
    """graph_train.py's network."""

    def __init__(self) -> None:
        super().__init__()
        self.d1 = nn.Dense(4, 3)
        self.relu = nn.ReLU()
        self.d2 = nn.Dense(3, 2)

    def construct(self, x):
        return self.d2(self.relu(self.d1(x)))


def _reference(state: dict, step: int) -> dict:
    """``(name, io, arg) -> array``: each Cell's inputs, parameters and outputs, and the
    gradient of the MSE loss w.r.t. each Cell's output, computed in PyNative without msprobe
    on the weights the graph run had before ``step``."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = _Net()
    for p in net.trainable_params():
        p.set_data(Tensor(state[f"s{step}.{p.name}"]))
    x, y = Tensor(state["x"]), Tensor(state["y"])
    loss = nn.MSELoss()
    h = net.d1(x)
    r = net.relu(h)
    o = net.d2(r)
    g_o = ms.grad(lambda o_: loss(o_, y))(o)
    g_r = ms.grad(lambda r_: loss(net.d2(r_), y))(r)
    g_h = ms.grad(lambda h_: loss(net.d2(net.relu(h_)), y))(h)
    ref = {}
    for cell, inp, out, grad, params in (("Cell.d1.Dense", x, h, g_h, "d1"), ("Cell.relu.ReLU", h, r, g_r, None),
                                         ("Cell.d2.Dense", r, o, g_o, "d2")):
        ref[(f"{cell}.forward.0", "input_args", "0")] = inp.asnumpy()
        ref[(f"{cell}.forward.0", "output", "0")] = out.asnumpy()
        ref[(f"{cell}.backward.0", "input", "0")] = grad.asnumpy()
        if params:
            for pname in ("weight", "bias"):
                ref[(f"{cell}.forward.0", "parameters", pname)] = state[f"s{step}.{params}.{pname}"]
    return ref


def test_recording_cells_does_not_change_the_loss(runs):
    _tmp, _base, _pert, _state, base_out, plain_out = runs
    assert len(_losses(base_out)) == 2 and _losses(base_out) == _losses(plain_out)


def test_cell_statistics_equal_numpy_float64_of_the_pynative_cells(runs):
    """Every recorded tensor of both steps against numpy float64 over the PyNative
    reference: inputs and weights (not computed by a kernel) exactly, Cell outputs and
    gradients within a few float32 ulps (graph and PyNative kernels may round differently)."""
    tmp, base, _pert, state, _o, _p = runs
    rows = _query(base, "SELECT step, name, io, arg, dtype, shape, max, min, mean, norm FROM tensors", tmp)
    for step in (0, 1):
        ref = _reference(state, step)
        got = {(r["name"], r["io"], r["arg"]): r for r in rows if r["step"] == step}
        assert set(got) == set(ref)
        for key, a in ref.items():
            r = got[key]
            assert (r["dtype"], r["shape"]) == ("Float32", list(a.shape)), key
            mx, mn, mean, norm = _np_stats(a)
            exact = key[1] == "parameters" or key[0] == "Cell.d1.Dense.forward.0" and key[1] == "input_args"
            if exact:
                assert (r["max"], r["min"]) == (mx, mn), key
                assert r["mean"] == pytest.approx(mean, rel=1e-12) and r["norm"] == pytest.approx(norm, rel=1e-12)
            else:
                for field, want in zip(("max", "min", "mean", "norm"), (mx, mn, mean, norm)):
                    assert r[field] == pytest.approx(want, rel=1e-6, abs=1e-7), (key, field)


def test_entries_names_order_and_dump_json(runs):
    """Per step: forwards N=0 in execution order, then backwards in reverse order (as
    PyNative records them); dump.json holds the same entries with the backward ``input``
    only; construct.json parents are absent (top-level Cells)."""
    tmp, base, _pert, _state, _o, _p = runs
    rows = _query(base, "SELECT step, name, kind FROM calls ORDER BY step, seq", tmp)
    for step in (0, 1):
        names = [r["name"] for r in rows if r["step"] == step]
        assert names == [f"{c}.forward.0" for c in CELLS] + [f"{c}.backward.0" for c in reversed(CELLS)]
        data = json.loads((base / f"step{step}" / "rank" / "dump.json").read_text())["data"]
        assert list(data) == names
        assert all(list(data[f"{c}.backward.0"]) == ["input"] for c in CELLS)
        assert set(data["Cell.d1.Dense.forward.0"]["parameters"]) == {"weight", "bias"}
        construct = json.loads((base / f"step{step}" / "rank" / "construct.json").read_text())
        assert construct == dict.fromkeys(names)
    kinds = {r["name"].split(".")[-2]: r["kind"] for r in rows}
    assert kinds == {"forward": S.MODULE_FORWARD, "backward": S.MODULE_BACKWARD}


def test_compare_names_the_cell_holding_the_perturbed_weight(runs, tmp_path):
    from msprobe.compare import compare

    _tmp, base, pert, _state, _o, _p = runs
    result = compare(pert, base, out=tmp_path / "cmp")
    assert result.summary["verdict"] == "diverged"
    rank = result.summary["ranks"][0]
    first = rank["first_diverged"] or rank["first_origin"]
    assert (first["name"], first["step"], first["direction"]) == ("Cell.d2.Dense.forward.0", 0, "forward")
    assert rank["counts"]["unpaired"] == 0
