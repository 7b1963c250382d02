"""GRAPH_MODE level L0 on CPU: Cell records through pyfunc ops (msprobe.mindspore.graph_cells).

A 2-step ``TrainOneStepCell`` run (graph_train.py, in a child process: MindSpore's mode is
per process) records every Cell's forward and backward; the recorded statistics are checked
against numpy float64 over the same Cells run in PyNative on the same weights and inputs
(gradients from ``mindspore.grad``, no msprobe), and the losses against a run without msprobe.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import Tensor, nn  # noqa: E402

from graph_nets import BlockNet, Net  # noqa: E402
from graph_run import train_in_graph_mode  # noqa: E402
from msprobe.cli import main as cli_main  # noqa: E402
from store import schema as S  # noqa: E402

CELLS = ("Cell.d1.Dense", "Cell.relu.ReLU", "Cell.d2.Dense")


def _run(tmp: Path, name: str, config: dict, *flags: str, stderr: bool = False) -> tuple[Path, str]:
    return train_in_graph_mode(tmp, name, {"level": "L0", **config}, *flags, stderr=stderr)


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


@pytest.fixture(scope="module")
def block_runs(tmp_path_factory):
    """graph_nets.BlockNet (a Cell applied twice, a Cell returning a tuple, nested Cells):
    a recorded 2-step run with its weights, and the run without msprobe."""
    tmp = tmp_path_factory.mktemp("graph_l0_block")
    state = tmp / "state.npz"
    dump, out = _run(tmp, "block", {"task": "statistics"}, "--net", "block", "--start", "--save-state", str(state))
    _plain, plain_out = _run(tmp, "plain", {}, "--net", "block", "--no-debugger")
    return tmp, dump, dict(np.load(state)), out, plain_out


def _losses(out: str) -> list[str]:
    return [x for x in out.splitlines() if x.startswith("LOSS")]


def _query(dump: Path, sql: str, tmp: Path) -> list[dict]:
    out = tmp / "q.json"
    assert cli_main(["query", str(dump), sql, "--format", "json", "-o", str(out)]) == 0
    return json.loads(out.read_text())


def _np_stats(a: np.ndarray) -> tuple[float, float, float, float]:
    f = np.asarray(a, dtype=np.float64).ravel()
    return float(f.max()), float(f.min()), float(f.mean()), float(np.sqrt(np.sum(f * f)))


def _pynative(net: nn.Cell, state: dict, step: int) -> tuple:
    """``(net, x, y, loss)`` in PyNative mode with the weights the graph run had before ``step``."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    for p in net.trainable_params():
        p.set_data(Tensor(state[f"s{step}.{p.name}"]))
    return net, Tensor(state["x"]), Tensor(state["y"]), nn.MSELoss()


def _check_stats(rows: list[dict], ref: dict, step: int, exact: set) -> None:
    """The recorded tensors of ``step`` are exactly the keys of ``ref`` (``(name, io, arg)``),
    with float32 dtype, the reference's shape and its numpy float64 statistics: exactly for
    the keys in ``exact`` (values no kernel computed), within a few float32 ulps otherwise."""
    got = {(r["name"], r["io"], r["arg"]): r for r in rows if r["step"] == step}
    assert set(got) == set(ref)
    for key, a in ref.items():
        r = got[key]
        assert (r["dtype"], r["shape"]) == ("Float32", list(a.shape)), key
        mx, mn, mean, norm = _np_stats(a)
        if key in exact or key[1] == "parameters":
            assert (r["max"], r["min"]) == (mx, mn), key
            assert r["mean"] == pytest.approx(mean, rel=1e-12) and r["norm"] == pytest.approx(norm, rel=1e-12)
        else:
            for field, want in zip(("max", "min", "mean", "norm"), (mx, mn, mean, norm)):
                assert r[field] == pytest.approx(want, rel=1e-6, abs=1e-7), (key, field)


def _parameter_grads(net: nn.Cell, x, y, loss, cells: dict) -> dict:
    """``(f"{prefix}.parameters_grad", name, "0") -> array``: the gradient of the loss w.r.t.
    each Parameter of the Cells ``cells`` (``prefix -> Cell attribute path``), by
    ``mindspore.grad`` over all trainable parameters (PyNative, no msprobe)."""
    params = net.trainable_params()
    grads = ms.grad(lambda x_: loss(net(x_), y), grad_position=None, weights=params)(x)
    by_name = {p.name: g.asnumpy() for p, g in zip(params, grads)}
    return {(f"{prefix}.parameters_grad", pname, "0"): by_name[f"{path}.{pname}"]
            for prefix, path in cells.items() for pname in ("weight", "bias")}


def _reference(state: dict, step: int) -> dict:
    """``(name, io, arg) -> array``: each Cell's inputs, parameters and outputs, the gradient
    of the MSE loss w.r.t. each Cell's output and w.r.t. each Parameter, computed in PyNative
    without msprobe on the weights the graph run had before ``step``."""
    net, x, y, loss = _pynative(Net(), state, step)
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
    ref.update(_parameter_grads(net, x, y, loss, {"Cell.d1.Dense": "d1", "Cell.d2.Dense": "d2"}))
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
        _check_stats(rows, _reference(state, step), step, {("Cell.d1.Dense.forward.0", "input_args", "0")})


def test_entries_names_order_and_dump_json(runs):
    """Per step: forwards N=0 in execution order, then backwards in reverse order (as
    PyNative records them), the parameter gradients in their arrival order; dump.json holds
    the same entries with the backward ``input`` only; construct.json parents are absent
    (top-level Cells)."""
    tmp, base, _pert, _state, _o, _p = runs
    rows = _query(base, "SELECT step, name, kind FROM calls ORDER BY step, seq", tmp)
    for step in (0, 1):
        names = [r["name"] for r in rows if r["step"] == step and r["kind"] != S.PARAMETERS_GRAD]
        assert names == [f"{c}.forward.0" for c in CELLS] + [f"{c}.backward.0" for c in reversed(CELLS)]
        grads = {r["name"] for r in rows if r["step"] == step and r["kind"] == S.PARAMETERS_GRAD}
        assert grads == {"Cell.d1.Dense.parameters_grad", "Cell.d2.Dense.parameters_grad"}
        data = json.loads((base / f"step{step}" / "rank" / "dump.json").read_text())["data"]
        assert [n for n in data if n not in grads] == names and grads <= set(data)
        assert all(list(data[f"{c}.backward.0"]) == ["input"] for c in CELLS)
        assert set(data["Cell.d1.Dense.forward.0"]["parameters"]) == {"weight", "bias"}
        construct = json.loads((base / f"step{step}" / "rank" / "construct.json").read_text())
        assert {k: v for k, v in construct.items() if k not in grads} == dict.fromkeys(names)
    kinds = {r["name"].split(".")[-2]: r["kind"] for r in rows if r["kind"] != S.PARAMETERS_GRAD}
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


def test_graph_mode_run_compares_identical_to_a_pynative_run(runs, tmp_path):
    """The same training recorded at L0 in PyNative: every entry pairs (the same names,
    parameters_grad included) and every statistic agrees."""
    from msprobe.compare import compare

    _tmp, base, _pert, _state, _o, _p = runs
    pynative, out = _run(tmp_path, "pynative", {"task": "statistics"}, "--start", "--pynative")
    assert _losses(out) == _losses(_o)
    result = compare(base, pynative)
    # "close" where a graph kernel rounds differently from PyNative's on some CPU
    assert result.summary["verdict"] in ("identical", "close")
    counts = result.summary["ranks"][0]["counts"]
    assert counts["unpaired"] == 0 and counts["pass"] == 2 * 8


def _block_reference(state: dict, step: int) -> dict:
    """BlockNet's Cells in PyNative (as :func:`_reference`): ``fc`` twice, ``split``'s two
    outputs and their gradients, ``block`` around them."""
    net, x, y, loss = _pynative(BlockNet(), state, step)
    fc, split = net.block.fc, net.block.split
    u = net.inp(x)
    f0 = fc(u)
    f1 = fc(f0)
    a, b = split(f1)
    z = a * b
    o = net.out(z)
    g_o = ms.grad(lambda o_: loss(o_, y))(o)
    g_z = ms.grad(lambda z_: loss(net.out(z_), y))(z)
    g_a, g_b = ms.grad(lambda a_, b_: loss(net.out(a_ * b_), y), grad_position=(0, 1))(a, b)
    g_f1 = ms.grad(lambda f_: loss(net.out(_product(split(f_))), y))(f1)
    g_f0 = ms.grad(lambda f_: loss(net.out(_product(split(fc(f_)))), y))(f0)
    g_u = ms.grad(lambda u_: loss(net.out(net.block(u_)), y))(u)
    ref = {}
    for cell, inp, outs, grads, params in (
            ("Cell.inp.Dense.forward.0", x, [u], [g_u], "inp"),
            ("Cell.block.fc.Dense.forward.0", u, [f0], [g_f0], "block.fc"),
            ("Cell.block.fc.Dense.forward.1", f0, [f1], [g_f1], "block.fc"),
            ("Cell.block.split.Split.forward.0", f1, [a, b], [g_a, g_b], None),
            ("Cell.block.Block.forward.0", u, [z], [g_z], None),
            ("Cell.out.Dense.forward.0", z, [o], [g_o], "out")):
        ref[(cell, "input_args", "0")] = inp.asnumpy()
        bwd = cell.replace(".forward.", ".backward.")
        for k, (t, g) in enumerate(zip(outs, grads)):
            ref[(cell, "output", str(k))] = t.asnumpy()
            ref[(bwd, "input", str(k))] = g.asnumpy()
        if params:
            for pname in ("weight", "bias"):
                ref[(cell, "parameters", pname)] = state[f"s{step}.{params}.{pname}"]
    # fc reads its Parameters twice: no parameters_grad (a sum formed inside the graph)
    ref.update(_parameter_grads(net, x, y, loss, {"Cell.inp.Dense": "inp", "Cell.out.Dense": "out"}))
    return ref


def _product(pair):
    """Block's last operation: the product of ``split``'s outputs."""
    return pair[0] * pair[1]


def test_cell_applied_twice_and_tuple_output_in_graph_mode(block_runs):
    """``fc`` applied twice gets forward/backward 0 and 1 (backward N paired with forward N,
    though MindSpore chains its hook once per call), ``split``'s tuple output two slots in
    forward ``output`` and backward ``input``; statistics as the PyNative reference; nested
    Cells parented by ``Cell.block.Block``; losses as without msprobe."""
    tmp, dump, state, out, plain_out = block_runs
    assert len(_losses(out)) == 2 and _losses(out) == _losses(plain_out)
    rows = _query(dump, "SELECT step, name, io, arg, dtype, shape, max, min, mean, norm FROM tensors", tmp)
    for step in (0, 1):
        _check_stats(rows, _block_reference(state, step), step, {("Cell.inp.Dense.forward.0", "input_args", "0")})
        construct = json.loads((dump / f"step{step}" / "rank" / "construct.json").read_text())
        inner = ["Cell.block.fc.Dense.forward.0", "Cell.block.fc.Dense.forward.1", "Cell.block.split.Split.forward.0"]
        assert [k for k in construct if not k.endswith(".parameters_grad")] == (["Cell.inp.Dense.forward.0"] + inner + [
            "Cell.block.Block.forward.0", "Cell.out.Dense.forward.0", "Cell.out.Dense.backward.0",
            "Cell.block.Block.backward.0", "Cell.block.split.Split.backward.0", "Cell.block.fc.Dense.backward.1",
            "Cell.block.fc.Dense.backward.0", "Cell.inp.Dense.backward.0"])
        construct = {k: v for k, v in construct.items() if not k.endswith(".parameters_grad")}
        for name, parent in construct.items():
            nested = ".block.fc." in name or ".block.split." in name
            direction = "forward" if ".forward." in name else "backward"
            assert parent == (f"Cell.block.Block.{direction}.0" if nested else None), name


def test_task_tensor_and_step_filter_in_graph_mode(runs, tmp_path):
    """Task tensor with ``step: [1]``: only step 1 is recorded, and its ``.npy`` files hold
    the Cells' tensors (the input and the weights bit for bit, the outputs and gradients as
    the PyNative reference within float32 rounding)."""
    _tmp, _base, _pert, state, _o, _p = runs
    dump, _out = _run(tmp_path, "tensor", {"task": "tensor", "step": [1]}, "--start")
    assert not (dump / "step0").exists()
    data_dir = dump / "step1" / "rank" / "dump_tensor_data"
    ref = _reference(state, 1)
    entries = json.loads((dump / "step1" / "rank" / "dump.json").read_text())["data"]
    checked = 0
    for (name, io, arg), want in ref.items():
        if name.endswith(".parameters_grad"):
            record = entries[name][io][0]
        elif io == "parameters":
            record = entries[name][io][arg]
        else:
            record = entries[name][io][int(arg)]
        got = np.load(data_dir / record["data_name"])
        if io == "parameters" or (name, io) == ("Cell.d1.Dense.forward.0", "input_args"):   # no kernel computed them
            assert got.tobytes() == want.tobytes(), (name, io, arg)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=str((name, io, arg)))
        checked += 1
    # 3 Cells: 3 inputs, 3 outputs, 3 output gradients; 2 Dense: 4 Parameters, 4 gradients
    assert checked == len(ref) == 17


def test_a_fault_in_a_pyfunc_callback_stops_recording_without_raising(tmp_path, caplog):
    """The pyfunc callbacks (called here directly, as MindSpore calls them from a running
    graph) with a tag naming no hooked Cell: the error is logged once and recording stops;
    nothing is raised to the caller (MindSpore's runtime)."""
    from msprobe.core.config import load_config
    from msprobe.core.session import Session
    from msprobe.mindspore.graph_cells import GraphCellRecorder

    session = Session(load_config(None, dump_path=str(tmp_path / "d"), level="L0", framework="mindspore"),
                      framework="mindspore")
    recorder = GraphCellRecorder(session)
    recorder.add_cell("Cell.fc.Dense", None, [])
    session.recording = True
    with caplog.at_level("ERROR", logger="msprobe"):
        recorder.on_record(np.array([7, 2, 0, 1, 1]), np.zeros(3, np.float32))
        recorder.on_grad(np.array([7, 2, 0, 1, 1]), np.zeros(3, np.float32))
    assert session.disabled and not session.recording
    assert [r.getMessage() for r in caplog.records].count(
        "msprobe: internal error, recording stopped: IndexError: list index out of range") == 1


def _dump_data(dump: Path, step: int) -> dict:
    return json.loads((dump / f"step{step}" / "rank" / "dump.json").read_text())["data"]


def test_tied_weights_train_and_record_like_pynative(tmp_path):
    """A weight shared by two Cells (``b.weight = a.weight``): MindSpore compiles no
    Parameter hook on it, so msprobe records it through each holder's forward hook. The
    losses equal the run without msprobe; every ``forward`` entry (both Cells' ``parameters``
    included) equals the PyNative L0 record; ``parameters_grad`` holds the unshared
    Parameters with PyNative's values and no shared weight."""
    cfg = {"task": "statistics"}
    graph, out = _run(tmp_path, "tied", cfg, "--net", "tied", "--start")
    _plain, plain_out = _run(tmp_path, "plain", {}, "--net", "tied", "--no-debugger")
    pynative, _p = _run(tmp_path, "pyn", cfg, "--net", "tied", "--start", "--pynative")
    assert len(_losses(out)) == 2 and _losses(out) == _losses(plain_out)
    for step in (0, 1):
        got, want = _dump_data(graph, step), _dump_data(pynative, step)
        for cell in ("Cell.a.Dense", "Cell.b.Dense"):
            params = got[f"{cell}.forward.0"]["parameters"]
            assert set(params) == {"weight", "bias"} and params == want[f"{cell}.forward.0"]["parameters"]
            assert params["weight"]["requires_grad"] is True
            assert list(got[f"{cell}.parameters_grad"]) == ["bias"]
            g, w = got[f"{cell}.parameters_grad"]["bias"][0], want[f"{cell}.parameters_grad"]["bias"][0]
            for stat in ("Max", "Min", "Mean", "Norm"):
                assert g[stat] == pytest.approx(w[stat], rel=1e-6, abs=1e-7), (cell, stat)
        assert got["Cell.a.Dense.forward.0"]["parameters"]["weight"] == got["Cell.b.Dense.forward.0"]["parameters"][
            "weight"]
        assert got["Cell.c.Dense.forward.0"]["parameters"] == want["Cell.c.Dense.forward.0"]["parameters"]
        assert list(got["Cell.c.Dense.parameters_grad"]) == ["weight"]


def test_weight_read_outside_its_cell_gets_no_partial_gradient(tmp_path):
    """``out(a(x) @ a.weight.T)``: the network's own read of ``a.weight`` would bypass the
    Parameter hook, so ``a.weight`` is recorded in ``parameters`` (as PyNative) and gets no
    ``parameters_grad`` (its hooked reads alone would give a partial gradient); ``a.bias``'s
    gradient equals PyNative's; the losses equal the run without msprobe."""
    cfg = {"task": "statistics"}
    graph, out = _run(tmp_path, "proj", cfg, "--net", "projection", "--start")
    _plain, plain_out = _run(tmp_path, "plain", {}, "--net", "projection", "--no-debugger")
    pynative, _p = _run(tmp_path, "pyn", cfg, "--net", "projection", "--start", "--pynative")
    assert len(_losses(out)) == 2 and _losses(out) == _losses(plain_out)
    for step in (0, 1):
        got, want = _dump_data(graph, step), _dump_data(pynative, step)
        assert got["Cell.a.Dense.forward.0"]["parameters"] == want["Cell.a.Dense.forward.0"]["parameters"]
        assert list(got["Cell.a.Dense.parameters_grad"]) == ["bias"]
        g, w = got["Cell.a.Dense.parameters_grad"]["bias"][0], want["Cell.a.Dense.parameters_grad"]["bias"][0]
        for stat in ("Max", "Min", "Mean", "Norm"):
            assert g[stat] == pytest.approx(w[stat], rel=1e-6, abs=1e-7), stat


def test_cell_called_twice_on_one_input_writes_no_wrong_parameter_gradient(tmp_path):
    """``fc(h) * fc(h)``: the graph computes ``fc(h)`` once and ``fc``'s Parameters get two
    gradient contributions of equal value. No ``Cell.fc.Dense.parameters_grad`` is written
    (one warning says why), the other Cells' gradients equal ``mindspore.grad``'s, and the
    losses equal the run without msprobe."""
    state_path = tmp_path / "state.npz"
    dump, out = _run(tmp_path, "twice", {"task": "statistics"}, "--net", "twice", "--start", "--save-state",
                     str(state_path), stderr=True)
    _plain, plain_out = _run(tmp_path, "plain", {}, "--net", "twice", "--no-debugger")
    assert len(_losses(out)) == 2 and _losses(out) == _losses(plain_out)
    assert out.count("msprobe: Cell.fc.Dense.parameters_grad not recorded") == 1
    state = dict(np.load(state_path))
    from graph_nets import TwiceNet

    for step in (0, 1):
        data = _dump_data(dump, step)
        grads = {k for k in data if k.endswith(".parameters_grad")}
        assert grads == {"Cell.inp.Dense.parameters_grad", "Cell.out.Dense.parameters_grad"}
        net, x, y, loss = _pynative(TwiceNet(), state, step)
        ref = _parameter_grads(net, x, y, loss, {"Cell.inp.Dense": "inp", "Cell.out.Dense": "out"})
        for (name, pname, _i), want in ref.items():
            got = data[name][pname][0]
            _mx, _mn, _mean, norm = _np_stats(want)
            assert got["Norm"] == pytest.approx(norm, rel=1e-6), (step, name, pname)


def test_start_after_the_graph_compiled_warns_once(tmp_path):
    """``start(net)`` after the first call compiled the graph: nothing can be recorded, and
    one warning names the cause; training goes on with the same losses."""
    dump, out = _run(tmp_path, "late", {"task": "statistics"}, "--start", "--compile-first", stderr=True)
    _plain, plain_out = _run(tmp_path, "plain", {}, "--compile-first", "--no-debugger")
    assert len(_losses(out)) == 3 and _losses(out) == _losses(plain_out)
    assert out.count("recorded nothing: no Cell of the model ran through msprobe's hooks") == 1
    assert "call debugger.start(net) before the first call that compiles the graph" in out
    assert not any(_dump_data(dump, step) for step in (0, 1) if (dump / f"step{step}" / "rank").exists())


def _hook_net():
    from graph_nets import Net
    from msprobe.core.config import load_config
    from msprobe.core.session import Session
    from msprobe.mindspore.graph_cells import GraphCellRecorder

    session = Session(load_config(None, dump_path="unused", level="L0", framework="mindspore"), framework="mindspore")
    return Net(), GraphCellRecorder(session)


def test_parameter_hooks_are_restored_and_a_users_hook_is_not_overwritten():
    """``remove()`` leaves each Parameter's forward hook and each Cell's Parameter-hook
    switch as before; a Parameter already holding a forward hook (the user's, another
    debugger's) is a ConfigError before anything is installed."""
    from msprobe.core.errors import ConfigError
    from msprobe.mindspore.graph_cells import GraphCellHooks

    net, rec = _hook_net()
    hooks = GraphCellHooks([net], False, rec)
    assert net.d1.weight.__parameter_forward_hook__ is not None and net.d1._forward_hook
    hooks.remove()
    params = list(net.get_parameters())
    assert all(getattr(p, "__parameter_forward_hook__", None) is None for p in params)
    assert net.d1.__no_parameter_forward_hook__ is True and rec.cells == [None] * 3

    def user_hook(p):
        return p

    net.d2.bias._register_forward_hook(user_hook)
    with pytest.raises(ConfigError) as info:
        GraphCellHooks([net], False, rec)
    assert "Parameter d2.bias already has a forward hook" in str(info.value)
    assert net.d2.bias.__parameter_forward_hook__ is user_hook
    assert all(getattr(p, "__parameter_forward_hook__", None) is None for p in params if p is not net.d2.bias)
    assert all(not c._forward_hook for _n, c in net.cells_and_names())


def test_l0_on_a_mindspore_without_its_private_apis_is_a_config_error(monkeypatch):
    """Level L0 in GRAPH_MODE on CPU uses MindSpore 2.10's private graph APIs: without one,
    the ConfigError (at PrecisionDebugger construction) names the MindSpore version and the API."""
    import mindspore.graph.api as graph_api

    from msprobe.core.errors import ConfigError
    from msprobe.mindspore import graph_levels

    monkeypatch.delattr(graph_api, "_set_parameter_forward_hook_enabled")
    with pytest.raises(ConfigError) as info:
        graph_levels.check_graph_mode_level("L0", "CPU")
    text = str(info.value)
    assert text.startswith("config field `level`: got 'L0'; allowed: L2")
    assert f"MindSpore {ms.__version__} lacks (mindspore.graph.api._set_parameter_forward_hook_enabled;" in text


def test_parent_lookup_is_linear_in_the_number_of_cells():
    """999 nested Cells get their parents from maps built once per model: hooking them
    takes well under a second (a lookup per Cell over every Cell took seconds)."""
    import time

    from msprobe.mindspore.graph_cells import _ParentFinder
    from mindspore import nn as msnn

    top = msnn.SequentialCell([msnn.SequentialCell([msnn.ReLU() for _ in range(36)]) for _ in range(27)])
    pairs = list(top.cells_and_names())
    cells_of = {id(c): f"Cell.{n}" for n, c in pairs}
    t0 = time.process_time()
    finder = _ParentFinder([top], cells_of)
    parents = {n: finder.parent(c, cells_of[id(c)]) for n, c in pairs}
    elapsed = time.process_time() - t0
    assert len(pairs) == 1 + 27 + 27 * 36
    assert parents["3.5"] == "Cell.3" and parents["3"] == "Cell." and parents[""] is None
    assert elapsed < 0.5


def test_a_fault_inside_the_running_graph_stops_recording_not_training(tmp_path):
    """The recorder fails in a pyfunc callback of the running graph: training completes with
    the losses of the run without msprobe, the error is logged once and recording stops."""
    _dump, out = _run(tmp_path, "fault", {"task": "statistics"}, "--start", "--fault", stderr=True)
    _plain, plain_out = _run(tmp_path, "plain", {}, "--no-debugger")
    assert len(_losses(out)) == 2 and _losses(out) == _losses(plain_out)
    assert out.count("msprobe: internal error, recording stopped: RuntimeError: injected fault") == 1


def test_new_model_replaces_the_hooked_cells(tmp_path):
    """``start()`` with another network removes the first one's hooks and forgets its Cells
    (a graph compiled with them still calls back: ignored); the debugger holds the hooked
    networks weakly."""
    import gc
    import weakref

    from graph_nets import Net
    from msprobe.mindspore import PrecisionDebugger

    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0", task="statistics")
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    first, second = Net(), Net()
    dbg.start(first)
    assert [c.prefix for c in dbg.recorder.cells] == ["Cell.d1.Dense", "Cell.relu.ReLU", "Cell.d2.Dense"]
    dbg.start(second)
    cells = dbg.recorder.cells
    assert cells[:3] == [None] * 3 and [c.prefix for c in cells[3:]] == ["Cell.d1.Dense", "Cell.relu.ReLU",
                                                                          "Cell.d2.Dense"]
    assert all(not c._forward_hook for _n, c in first.cells_and_names())
    assert getattr(first.d1.weight, "__parameter_forward_hook__", None) is None
    dbg.recorder.on_record(np.array([0, 2, 0, 1, 1]), np.zeros(3, np.float32))   # the first network's graph
    assert not dbg.session.failed and not dbg.recorder.cells[3].queues
    ref = weakref.ref(first)
    del first
    gc.collect()
    assert ref() is None
    dbg.close()


def test_a_non_tensor_last_input_is_a_none_leaf(tmp_path):
    """A Cell called as ``cell(x, 2)``: its forward hook records ``x`` only, with the call's
    two positional inputs in the tag; ``input_args`` holds ``x`` and a ``none`` leaf, as
    PyNative's record of the same call."""
    from msprobe.core.config import load_config
    from msprobe.core.session import Session
    from msprobe.mindspore.graph_cells import ROLE_INPUT, ROLE_OUTPUT, GraphCellRecorder

    session = Session(load_config(None, dump_path=str(tmp_path / "d"), level="L0", framework="mindspore"),
                      framework="mindspore")
    recorder = GraphCellRecorder(session)
    recorder.add_cell("Cell.scale.Scale", None, [])
    calls = []
    session.emit = calls.append
    session.recording = True
    x = np.array([1.0, -2.0, 3.0], np.float32)
    recorder.on_record(np.array([0, ROLE_INPUT, 0, 2, 1]), x)
    recorder.on_record(np.array([0, ROLE_OUTPUT, 0, 1, 1]), x * 2)
    (call,) = calls
    args = [leaf for leaf in call.leaves if leaf.io == "input_args"]
    assert [(leaf.path, leaf.leaf_kind) for leaf in args] == [((0,), "tensor"), ((1,), "none")]
    assert (args[0].max, args[0].min) == (3.0, -2.0)


def test_dtype_names_come_without_a_deprecation_line(capfd):
    """Every recorded array's dtype is named as MindSpore names it, without the log line
    ``mstype.pytype_to_dtype`` writes per call in MindSpore 2.10."""
    from msprobe.mindspore.graph_cells import _ms_dtype

    names = {"float16": "Float16", "float32": "Float32", "float64": "Float64", "int8": "Int8",
             "int32": "Int32", "int64": "Int64", "uint8": "UInt8", "bool": "Bool", "complex64": "Complex64"}
    assert {d: _ms_dtype(np.zeros(2, d)) for d in names} == names
    assert "deprecated" not in capfd.readouterr().err
