"""Debug save, MsprobeStep with mindspore.train.Model, seed_all, task tensor, L2, SQL."""
from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from ms_helpers import load_dump, make_input, make_net, np_stats, tensor_records, train_loop
from msprobe.core.errors import ConfigError
from msprobe.mindspore import PrecisionDebugger, seed_all
from msprobe.mindspore.common.utils import MsprobeStep

import mindspore as ms  # noqa: E402
from mindspore import Tensor, mint, nn, ops  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_debug_save_forward_and_grad(tmp_path):
    x = Tensor(np.array([1.0, -2.0, 3.0], np.float32))
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="debug", task="statistics")

    def f(t):
        y = ops.mul(t, t)
        PrecisionDebugger.save(y, "y")
        PrecisionDebugger.save({"k": [y, 2], "s": "text"}, "nested", save_backward=False)
        return (y * 3.0).sum()

    g = ms.grad(f)(x)
    dbg.close()
    assert not any(p.name.startswith("step") for p in (tmp_path / "d").iterdir())
    doc = json.loads((tmp_path / "d" / "rank" / "debug.json").read_text())
    assert doc["level"] == "debug" and doc["framework"] == "mindspore"
    data = doc["data"]
    assert list(data) == ["y.0", "y_grad.0", "nested.0"]
    assert data["y.0"]["Max"] == 9.0 and data["y.0"]["Min"] == 1.0
    assert data["y_grad.0"]["Max"] == 3.0 and data["y_grad.0"]["Norm"] == pytest.approx(np.sqrt(27))
    assert data["nested.0"]["k"][1] == {"type": "int", "value": 2}
    assert data["nested.0"]["s"] == {"type": "str", "value": "text"}
    np.testing.assert_array_equal(g.asnumpy(), 6 * x.asnumpy())


def test_save_bad_arguments(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="debug")
    try:
        with pytest.raises(ConfigError, match="name"):
            PrecisionDebugger.save(Tensor([1.0]), 3)
        with pytest.raises(ConfigError, match="save_backward"):
            PrecisionDebugger.save(Tensor([1.0]), "a", save_backward="yes")
    finally:
        dbg.close()  # its hooks (the grad-end wrapper of level debug) go with it


def test_msprobe_step_with_model_train(tmp_path):
    from mindspore import dataset as ds
    from mindspore.train import Model

    rng = np.random.default_rng(0)
    data = rng.standard_normal((16, 4)).astype(np.float32)
    label = rng.standard_normal((16, 2)).astype(np.float32)
    dataset = ds.NumpySlicesDataset({"data": data, "label": label}, shuffle=False).batch(4)
    net = nn.SequentialCell([nn.Dense(4, 3), nn.ReLU(), nn.Dense(3, 2)])
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0", step=[0, "2-3"])
    dbg.start(net)  # register Cell hooks once before Model.train (seeds 7.2.1.2)
    dbg.stop()
    model = Model(net, loss_fn=nn.MSELoss(), optimizer=nn.SGD(net.trainable_params(), 0.01))
    model.train(1, dataset, callbacks=[MsprobeStep(dbg)], dataset_sink_mode=False)
    dbg.close()
    steps = sorted(p.name for p in (tmp_path / "d").iterdir() if p.name.startswith("step"))
    assert steps == ["step0", "step2", "step3"]
    names = list(load_dump(tmp_path / "d", step=2)[0]["data"])
    assert names[:3] == ["Cell.0.Dense.forward.0", "Cell.0.Dense.parameters_grad", "Cell.1.ReLU.forward.0"]
    assert "Cell.2.Dense.backward.0" in names
    pg = load_dump(tmp_path / "d", step=2)[0]["data"]["Cell.2.Dense.parameters_grad"]
    assert pg["weight"][0]["shape"] == [2, 3]


def test_seed_all(monkeypatch):
    from mindspore.mint.nn import functional as mint_f
    from mindspore.ops import operations as P
    for owner, name in ((ops, "Dropout"), (ops, "Dropout2D"), (ops, "Dropout3D"), (P, "Dropout"),
                        (P, "Dropout2D"), (P, "Dropout3D"), (mint.nn, "Dropout"), (mint_f, "dropout")):
        monkeypatch.setattr(owner, name, getattr(owner, name))  # restored after the test
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    monkeypatch.setenv("HCCL_DETERMINISTIC", "False")
    seed_all(42, mode=True)
    a = (random.random(), np.random.rand())
    assert ms.get_seed() == 42 and ms.get_context("deterministic") == "ON"
    import os
    assert os.environ["PYTHONHASHSEED"] == "42" and os.environ["HCCL_DETERMINISTIC"] == "True"
    seed_all(42, mode=False)
    assert (random.random(), np.random.rand()) == a and ms.get_context("deterministic") == "OFF"
    x = Tensor(np.ones((2, 3, 4, 4), np.float32))
    out, mask = ops.Dropout(keep_prob=0.5)(x)
    np.testing.assert_array_equal(out.asnumpy(), x.asnumpy())
    out2, _ = ops.Dropout2D(keep_prob=0.5)(x)
    np.testing.assert_array_equal(out2.asnumpy(), x.asnumpy())
    d = mint.nn.Dropout(p=0.5)
    d.set_train(True)
    np.testing.assert_array_equal(d(x).asnumpy(), x.asnumpy())
    assert mint.nn.functional.dropout(x, p=0.9, training=True) is x
    for bad in ({"seed": -1}, {"seed": 1.5}, {"seed": 2**32}, {"mode": 1}, {"rm_dropout": "no"}):
        with pytest.raises(ConfigError):
            seed_all(**bad)


def test_task_tensor_npy_files(tmp_path):
    net, x = make_net(), make_input()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix", task="tensor")
    train_loop(net, x, dbg, steps=1)
    dbg.close()
    dump = load_dump(tmp_path / "d")[0]
    tdir = tmp_path / "d" / "step0" / "rank" / "dump_tensor_data"
    assert dump["dump_data_dir"] == str(tdir.resolve())
    data = dump["data"]
    rec = data["Primitive.matmul.MatMul.0.forward"]["input_args"][1]
    assert rec["data_name"] == "Primitive.matmul.MatMul.0.forward.input.1.npy"
    assert data["Cell.d1.Dense.forward.0"]["parameters"]["weight"]["data_name"] == \
        "Cell.d1.Dense.forward.0.parameters.weight.npy"
    assert data["Cell.d1.Dense.parameters_grad"]["bias"][0]["data_name"] == "Cell.d1.Dense.parameters_grad.bias.npy"
    assert data["Cell.d2.Dense.backward.0"]["input"][0]["data_name"] == "Cell.d2.Dense.backward.0.input.0.npy"
    checked = 0
    for entry in data.values():
        for rec in tensor_records(entry):
            arr = np.load(tdir / rec["data_name"])
            st = np_stats(arr)
            for key in ("Max", "Min", "Mean", "Norm"):
                assert rec[key] == pytest.approx(st[key], rel=1e-9, abs=1e-12)
            checked += 1
    assert checked > 50


def test_bf16_tensor_file_is_float32(tmp_path):
    t = Tensor(np.array([1.5, -2.0, 0.25], np.float32)).astype(ms.bfloat16)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1", task="tensor")
    dbg.start()
    ops.neg(t)
    dbg.stop()
    dbg.close()
    rec = load_dump(tmp_path / "d")[0]["data"]["Functional.neg.0.forward"]["output"][0]
    assert rec["dtype"] == "BFloat16"
    arr = np.load(tmp_path / "d" / "step0" / "rank" / "dump_tensor_data" / rec["data_name"])
    assert arr.dtype == np.float32
    np.testing.assert_array_equal(arr, [-1.5, 2.0, -0.25])


def test_structure_task(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix", task="structure")
    train_loop(make_net(), make_input(), dbg, steps=1)
    dbg.close()
    dump, stack, construct = load_dump(tmp_path / "d")
    assert dump["data"] == {} and "Cell.d1.Dense.forward.0" in construct and stack


def test_sql_over_mindspore_dump(tmp_path):
    from store.query import query
    net, x = make_net(), make_input()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    train_loop(net, x, dbg, steps=2)
    dbg.close()
    t = query(str(tmp_path / "d"), "SELECT step, name, dtype, max FROM tensors WHERE name = "
              "'Functional.mul.0.forward' AND io = 'output' ORDER BY step").to_pylist()
    data0 = load_dump(tmp_path / "d", step=0)[0]["data"]
    assert [r["step"] for r in t] == [0, 1]
    assert t[0]["dtype"] == "Float32" and t[0]["max"] == data0["Functional.mul.0.forward"]["output"][0]["Max"]
    calls = query(str(tmp_path / "d"), "SELECT count(*) AS n FROM calls WHERE step = 0").to_pylist()
    assert calls[0]["n"] == len(data0)


def test_l2_in_pynative_is_a_clear_error(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"task": "tensor", "dump_path": "%s", "level": "L2", "tensor": {"list": ["MatMul"]}}'
                   % (tmp_path / "d"))
    with pytest.raises(ConfigError, match="GRAPH_MODE"):
        PrecisionDebugger(config_path=str(cfg))


def test_graph_mode_l2_kernel_dump(tmp_path):
    """GRAPH_MODE + L2 configures MindSpore's kernel dump (a fresh process: the mode is global)."""
    cfg = tmp_path / "c.json"
    out = tmp_path / "d"
    cfg.write_text(json.dumps({"task": "tensor", "dump_path": str(out), "level": "L2",
                               "tensor": {"list": ["MatMul"]}}))
    script = textwrap.dedent(f"""
        import numpy as np, mindspore as ms
        from mindspore import nn, Tensor
        ms.set_context(mode=ms.GRAPH_MODE); ms.set_device("CPU")
        from msprobe.mindspore import PrecisionDebugger
        try:
            PrecisionDebugger(config_path={str(cfg)!r}, level="mix")
        except Exception as e:
            print("MIXERR", type(e).__name__)
        dbg = PrecisionDebugger(config_path={str(cfg)!r})
        dbg.start(); dbg.stop(); dbg.step()
        class Net(nn.Cell):
            def __init__(self):
                super().__init__(); self.d = nn.Dense(3, 2)
            def construct(self, x):
                return self.d(x).sum()
        print(Net()(Tensor(np.ones((2, 3), np.float32))))
    """)
    path = tmp_path / "graph_l2.py"  # MindSpore compiles graphs from source files only
    path.write_text(script)
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, str(path)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "MIXERR ConfigError" in res.stdout
    files = {".".join(p.name.split(".")[-5:-3]): p for p in out.rglob("*.npy")}
    assert files and all(p.name.startswith("MatMul.") for p in files.values()), list(files)
    assert (out / "kernel_dump_config.json").is_file()
    # the kernel's recorded output equals x @ W^T recomputed from its recorded inputs
    x, w, y = (np.load(files[k]) for k in ("input.0", "input.1", "output.0"))
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    # float32 kernel vs float64 product: error bounded by a few ulps of the summed magnitudes
    bound = 4 * np.finfo(np.float32).eps * (np.abs(x64) @ np.abs(w64).T)
    assert np.all(np.abs(y.astype(np.float64) - x64 @ w64.T) <= bound), (y, x64 @ w64.T)


def test_debug_save_task_tensor_files(tmp_path):
    x = Tensor(np.array([1.0, -2.0, 3.0], np.float32))
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="debug", task="tensor")

    def f(t):
        y = t * 2.0
        PrecisionDebugger.save(y, "y")
        PrecisionDebugger.save({"b": [y]}, "d", save_backward=False)
        return (y * y).sum()

    ms.grad(f)(x)
    dbg.close()
    rank = tmp_path / "d" / "rank"
    data = json.loads((rank / "debug.json").read_text())["data"]
    tdir = rank / "dump_tensor_data"
    assert data["y.0"]["data_name"] == "y.0.tensor.npy"
    assert data["d.0"]["b"][0]["data_name"] == "d.0.tensor.b.0.npy"
    np.testing.assert_array_equal(np.load(tdir / "y.0.tensor.npy"), [2.0, -4.0, 6.0])
    np.testing.assert_array_equal(np.load(tdir / data["y_grad.0"]["data_name"]), [4.0, -8.0, 12.0])


@pytest.mark.parametrize("where", ["host", "device_record", "device_flush"])
def test_internal_error_never_breaks_training(tmp_path, monkeypatch, caplog, where):
    """Statistics fail on the host path (summary_mode md5), when a tensor's device copy is
    queued, or when the flush resolves the device statistics."""
    import msprobe.mindspore.leaves as leaves_mod
    from msprobe.mindspore.device_stats import DeviceStats

    x = make_input()
    expected = train_loop(make_net(), x, None, steps=2)

    def broken(*_a):
        raise RuntimeError("stats exploded")

    if where == "host":
        monkeypatch.setattr(leaves_mod, "array_stats", broken)
        cfg = tmp_path / "c.json"
        cfg.write_text('{"dump_path": "%s", "level": "mix", "statistics": {"summary_mode": "md5"}}' % (tmp_path / "d"))
        dbg = PrecisionDebugger(config_path=str(cfg))
    else:
        monkeypatch.setenv("MSPROBE_MS_DEVICE_STATS", "1")
        monkeypatch.setattr(DeviceStats, "add" if where == "device_record" else "resolve", broken)
        dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    with caplog.at_level("ERROR", logger="msprobe"):
        got = train_loop(make_net(), x, dbg, steps=2)
    dbg.close()
    assert [a.tobytes() for a in got] == [b.tobytes() for b in expected]
    assert dbg.session.disabled
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "stats exploded" in errors[0].getMessage()


@pytest.mark.parametrize("level", ["mix", "debug"])
def test_offline_export_reproduces_live_files(tmp_path, level):
    from store.export import export_log

    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level=level)
    if level == "debug":
        x = Tensor(np.array([1.0, 2.0], np.float32))
        ms.grad(lambda t: (PrecisionDebugger.save(t * 2.0, "y") or t * 2.0).sum())(x)
    else:
        train_loop(make_net(), make_input(), dbg, steps=2)
    dbg.close()
    export_log(tmp_path / "d", tmp_path / "again")
    live = sorted(p.relative_to(tmp_path / "d") for p in (tmp_path / "d").rglob("*.json") if ".msprobe" not in p.parts)
    assert live and live == sorted(p.relative_to(tmp_path / "again") for p in (tmp_path / "again").rglob("*.json"))
    for rel in live:
        assert (tmp_path / "d" / rel).read_bytes() == (tmp_path / "again" / rel).read_bytes(), rel


def test_rerun_into_the_same_dump_path_warns_once(tmp_path, caplog):
    """The MindSpore adapter gets the core session's earlier-run warning: a rank-0 log of
    another process in the dump path (an earlier run) is named once; a fresh path and this
    process's own earlier log are not."""
    import logging
    import os

    dump = tmp_path / "d"
    x = make_input()

    def record(steps):
        dbg = PrecisionDebugger(dump_path=str(dump), level="mix")
        train_loop(make_net(), x, dbg, steps=steps)
        dbg.close()

    def warnings():
        return [r.getMessage() for r in caplog.records if r.name == "msprobe" and r.levelno >= logging.WARNING]

    caplog.set_level(logging.WARNING, logger="msprobe")
    record(1)
    record(1)                                    # this process's own log: no earlier run
    assert warnings() == []
    for path in (dump / ".msprobe" / "log").glob(f"rank0.{os.getpid()}.*.arrows"):
        path.rename(path.with_name(path.name.replace(f".{os.getpid()}.", f".{os.getpid() + 1}.", 1)))
    record(2)
    assert warnings() == [
        f"msprobe: dump_path {str(dump)!r} already holds 2 earlier logs of rank 0 (written by another "
        "process, e.g. a previous run); this run's log is added beside them: the SQL views "
        "(msprobe query: both runs' rows side by side), msprobe "
        "export and msprobe compare will include the earlier run's rows, "
        "while the step directories show only the newest run. Use a new dump_path, or delete the "
        "old one."]
