"""Task ``tensor``: tensor files equal the live tensors bit for bit, dump.json statistics
equal numpy float64 recomputation from the saved files, and ``msprobe export`` rebuilds
the files from the log alone (spec 1.1, 2.2, 3.3; design "Payloads")."""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from pt_helpers import ModuleOP, load_dump
from msprobe.cli import main as cli_main
from msprobe.pytorch import PrecisionDebugger


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes (NaN payloads and -0.0 included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.detach().contiguous().reshape(-1), b.detach().contiguous().reshape(-1)
    if a.numel() == 0:
        return True
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def np_float64_stats(t: torch.Tensor) -> dict:
    if t.is_complex():
        a = np.abs(t.numpy()).astype(np.float64)
    elif t.dtype == torch.bfloat16:
        a = t.to(torch.float32).numpy().astype(np.float64)
    else:
        a = t.numpy().astype(np.float64)
    return {"Max": float(a.max()), "Min": float(a.min()), "Mean": float(a.mean()),
            "Norm": float(np.sqrt(np.sum(a * a)))}


def records(value):
    """Every tensor record inside a dump.json entry value."""
    if isinstance(value, dict):
        if value.get("type") == "torch.Tensor":
            yield value
        else:
            for v in value.values():
                yield from records(v)
    elif isinstance(value, list):
        for v in value:
            yield from records(v)


def same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def check_files_against_stats(dump: dict, tensor_dir: Path) -> int:
    n = 0
    for entry in dump["data"].values():
        for rec in records(entry):
            t = torch.load(tensor_dir / rec["data_name"], weights_only=True)
            assert str(t.dtype) == rec["dtype"] and list(t.shape) == rec["shape"]
            if t.dtype == torch.bool:
                assert rec["Max"] == bool(t.any()) and rec["Min"] == bool(t.all())
            elif t.numel():
                exp = np_float64_stats(t)
                for key in ("Max", "Min"):
                    assert same(rec[key], exp[key]), (rec["data_name"], key, rec[key], exp[key])
                for key in ("Mean", "Norm"):
                    if t.dim() == 0 and key == "Norm":
                        assert rec[key] == abs(exp["Max"])  # fix 10: 0-dim Norm is |x|
                    elif math.isnan(exp[key]):
                        assert math.isnan(rec[key])
                    else:
                        assert rec[key] == pytest.approx(exp[key], rel=1e-6, abs=1e-12), (rec["data_name"], key)
            else:
                assert rec["Max"] is None and rec["Norm"] is None
            n += 1
    return n


def run_quickstart(dump_path: Path, level: str = "mix"):
    torch.manual_seed(0)
    module = ModuleOP()
    dbg = PrecisionDebugger(dump_path=str(dump_path), level=level, task="tensor")
    dbg.start(model=module)
    x = torch.randn(10, 8)
    w1 = module.linear_1.weight.detach().clone()
    out = module(x)
    loss = out.sum()
    loss.backward()
    dbg.stop()
    dbg.close()
    return module, x, w1, out, loss


def test_quickstart_tensor_files_bit_exact(tmp_path):
    dump_path = tmp_path / "dump"
    module, x, w1, out, _ = run_quickstart(dump_path)
    dump, _, _ = load_dump(dump_path)
    tdir = dump_path / "step0" / "rank" / "dump_tensor_data"
    assert dump["task"] == "tensor"
    assert dump["dump_data_dir"] == os.path.join(str(dump_path), "step0", "rank", "dump_tensor_data")
    data = dump["data"]
    x1 = module.linear_1(x).detach()
    expected = {
        "Functional.linear.0.forward.input.0.pt": x,
        "Functional.linear.0.forward.input.1.pt": w1,
        "Functional.linear.0.forward.input.2.pt": module.linear_1.bias,
        "Functional.linear.0.forward.output.0.pt": x1,
        "Module.linear_1.Linear.forward.0.input.0.pt": x,
        "Module.linear_1.Linear.forward.0.output.0.pt": x1,
        "Module.linear_1.Linear.forward.0.parameters.weight.pt": w1,
        "Module.linear_1.Linear.forward.0.parameters.bias.pt": module.linear_1.bias,
        "Module.linear_1.Linear.parameters_grad.weight.pt": module.linear_1.weight.grad,
        "Module.linear_2.Linear.parameters_grad.bias.pt": module.linear_2.bias.grad,
        "Functional.relu.0.forward.output.0.pt": out,
        "Tensor.sum.0.forward.input.0.pt": out,
        "Tensor.sum.0.backward.input.0.pt": torch.tensor(1.0),
        "Functional.relu.0.backward.input.0.pt": torch.ones(10, 2),
    }
    for name, live in expected.items():
        saved = torch.load(tdir / name, weights_only=True)
        assert bits_equal(saved, live), name
    # backward output of linear_1 w.r.t. x is not there (x needs no grad); w.r.t. weight it is
    grad_w = torch.load(tdir / "Functional.linear.0.backward.output.1.pt", weights_only=True)
    assert bits_equal(grad_w, module.linear_1.weight.grad)
    assert data["Functional.linear.0.backward"]["output"][0] is None
    # data_name on every tensor record, equal to its file; statistics equal numpy float64
    n = check_files_against_stats(dump, tdir)
    assert n == len(list(tdir.glob("*.pt")))
    # identical bytes are hard links of one file
    a, b = tdir / "Functional.relu.0.forward.output.0.pt", tdir / "Tensor.sum.0.forward.input.0.pt"
    assert a.stat().st_ino == b.stat().st_ino


def test_export_rebuilds_tensor_files_from_log(tmp_path, capsys):
    dump_path = tmp_path / "dump"
    run_quickstart(dump_path)
    step_dir = dump_path / "step0" / "rank"
    before = {p.name: p.read_bytes() for p in (step_dir / "dump_tensor_data").iterdir()}
    dump_before = (step_dir / "dump.json").read_text()
    shutil.rmtree(dump_path / "step0")
    assert cli_main(["export", str(dump_path)]) == 0
    assert (step_dir / "dump.json").read_text() == dump_before
    after = {p.name: p for p in (step_dir / "dump_tensor_data").iterdir()}
    assert set(after) == set(before)
    for name, path in after.items():
        assert bits_equal(torch.load(path, weights_only=True),
                          torch.load(step_dir / "dump_tensor_data" / name, weights_only=True))
    # into another directory, byte-identical tensors
    out = tmp_path / "copy"
    assert cli_main(["export", str(dump_path), "-o", str(out)]) == 0
    for name in before:
        a = torch.load(out / "step0" / "rank" / "dump_tensor_data" / name, weights_only=True)
        b = torch.load(step_dir / "dump_tensor_data" / name, weights_only=True)
        assert bits_equal(a, b)


DTYPE_CASES = {
    "bf16": lambda: torch.randn(3, 4).to(torch.bfloat16),
    "fp16": lambda: torch.randn(5).to(torch.float16) * 100,
    "fp64": lambda: torch.randn(2, 2, dtype=torch.float64),
    "int64": lambda: torch.arange(-5, 7).reshape(3, 4),
    "int8": lambda: torch.tensor([-128, 0, 127], dtype=torch.int8),
    "uint8": lambda: torch.tensor([0, 7, 255], dtype=torch.uint8),
    "bool": lambda: torch.tensor([[True, False], [False, False]]),
    "complex64": lambda: torch.complex(torch.randn(3), torch.randn(3)),
    "zero_dim": lambda: torch.tensor(-2.5),
    "empty": lambda: torch.empty(0, 3),
    "nan_inf": lambda: torch.tensor([1.0, float("nan"), float("inf"), -0.0]),
}


@pytest.mark.parametrize("case", sorted(DTYPE_CASES))
def test_dtypes_round_trip_bit_exact(tmp_path, case):
    torch.manual_seed(1)
    t = DTYPE_CASES[case]()
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1", task="tensor")
    dbg.start()
    out = torch.flatten(t)
    dbg.stop()
    dbg.close()
    dump, _, _ = load_dump(tmp_path)
    entry = dump["data"]["Torch.flatten.0.forward"]
    tdir = tmp_path / "step0" / "rank" / "dump_tensor_data"
    assert entry["input_args"][0]["data_name"] == "Torch.flatten.0.forward.input.0.pt"
    assert bits_equal(torch.load(tdir / "Torch.flatten.0.forward.input.0.pt", weights_only=True), t)
    assert bits_equal(torch.load(tdir / "Torch.flatten.0.forward.output.0.pt", weights_only=True), out)
    assert check_files_against_stats(dump, tdir) == 2


def test_view_and_conj_inputs(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    view = base[:, 1::2].t()  # non-contiguous view
    z = torch.complex(torch.randn(3), torch.randn(3)).conj()  # conj bit set
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1", task="tensor")
    dbg.start()
    torch.neg(view)
    torch.neg(z)
    dbg.stop()
    dbg.close()
    tdir = tmp_path / "step0" / "rank" / "dump_tensor_data"
    assert bits_equal(torch.load(tdir / "Torch.neg.0.forward.input.0.pt", weights_only=True), view.contiguous())
    assert torch.equal(torch.load(tdir / "Torch.neg.1.forward.input.0.pt", weights_only=True), z.resolve_conj())


def test_inplace_input_recorded_before_call(tmp_path):
    t = torch.tensor([1.0, -2.0, 3.0])
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1", task="tensor")
    dbg.start()
    t.mul_(10)
    dbg.stop()
    dbg.close()
    tdir = tmp_path / "step0" / "rank" / "dump_tensor_data"
    assert torch.equal(torch.load(tdir / "Tensor.mul_.0.forward.input.0.pt", weights_only=True),
                       torch.tensor([1.0, -2.0, 3.0]))
    assert torch.equal(torch.load(tdir / "Tensor.mul_.0.forward.output.0.pt", weights_only=True), t)


def test_kwargs_and_list_file_names(tmp_path):
    a, b = torch.ones(2), torch.zeros(2)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1", task="tensor")
    dbg.start()
    torch.cat([a, b])
    torch.add(a, other=b)
    dbg.stop()
    dbg.close()
    dump, _, _ = load_dump(tmp_path)
    d = dump["data"]
    assert d["Torch.cat.0.forward"]["input_args"][0][1]["data_name"] == "Torch.cat.0.forward.input.0.1.pt"
    assert d["Torch.add.0.forward"]["input_kwargs"]["other"]["data_name"] == "Torch.add.0.forward.kwargs.other.pt"
    tdir = tmp_path / "step0" / "rank" / "dump_tensor_data"
    assert torch.equal(torch.load(tdir / "Torch.cat.0.forward.input.0.1.pt", weights_only=True), b)


def test_two_steps_separate_directories(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1", task="tensor")
    for i in range(2):
        dbg.start()
        torch.neg(torch.full((2,), float(i)))
        dbg.stop()
        dbg.step()
    dbg.close()
    for i in range(2):
        t = torch.load(tmp_path / f"step{i}" / "rank" / "dump_tensor_data" / "Torch.neg.0.forward.input.0.pt",
                       weights_only=True)
        assert torch.equal(t, torch.full((2,), float(i)))


def test_statistics_task_has_no_tensor_files(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    dbg.start()
    torch.neg(torch.ones(2))
    dbg.stop()
    dbg.close()
    dump, _, _ = load_dump(tmp_path)
    assert dump["dump_data_dir"] is None
    assert "data_name" not in dump["data"]["Torch.neg.0.forward"]["input_args"][0]
    assert not (tmp_path / "step0" / "rank" / "dump_tensor_data").exists()


def test_payload_write_failure_stops_recording_not_training(tmp_path, caplog):
    import logging

    dump = tmp_path / "dump"
    (dump / ".msprobe").mkdir(parents=True)
    (dump / ".msprobe" / "payload").write_text("a file where the shard directory should be")
    dbg = PrecisionDebugger(dump_path=str(dump), level="L1", task="tensor")
    with caplog.at_level(logging.ERROR, logger="msprobe"):
        dbg.start()
        y = torch.neg(torch.ones(3))
        dbg.stop()          # the shard write fails here: one error, recording stops
        dbg.start()
        z = torch.neg(y)    # training goes on
        dbg.stop()
        dbg.close()
    assert torch.equal(z, torch.ones(3))
    assert dbg.session.failed and "recording stopped" in caplog.text


def _shard_keys(dump_path: Path) -> list[str]:
    keys = []
    for shard in sorted((dump_path / ".msprobe" / "payload").glob("*.safetensors")):
        raw = shard.read_bytes()
        header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
        keys += [k for k in header if k != "__metadata__"]
    return keys


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("xxhash_missing", [False, True])
def test_same_bytes_other_dtype_or_shape_and_export_from_shards(tmp_path, monkeypatch, xxhash_missing):
    """Tensors whose bytes are equal but dtype or shape differ get their own payloads; the
    files ``msprobe export`` rebuilds from the shards alone (step directories deleted) are
    bit-identical to the tensors, also from a shard written with SHA-256 keys (no xxhash)
    exported by a process that has xxhash (the keys are verified)."""
    import store.payload_writer as pw

    z = torch.zeros(16, dtype=torch.uint8)
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    tensors = [torch.zeros(4), torch.zeros(2, 2), torch.zeros(2, dtype=torch.float64), z, z.view(torch.bool),
               z.view(torch.int8), z.view(torch.bfloat16), z.view(torch.complex64), z.view(4, 4), z[:1].reshape(()),
               torch.empty(0), torch.empty(0, 3), torch.empty(0, dtype=torch.int64), torch.tensor(-0.0),
               torch.tensor([-0.0]), torch.tensor([1.0, -2.0]).to(torch.complex32), base[:, 1::2], base.t(),
               torch.tensor([1.0, 2.0]).expand(3, 2)]
    if xxhash_missing:
        monkeypatch.setattr(pw, "_xxh3_128", None)
    dump_path = tmp_path / "dump"
    dbg = PrecisionDebugger(dump_path=str(dump_path), level="L1", task="tensor")
    dbg.start()
    for t in tensors:
        torch.flatten(t)
    dbg.stop()
    dbg.close()
    monkeypatch.undo()
    expected = {(str(x.dtype), tuple(x.shape), x.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
                for t in tensors for x in (t, torch.flatten(t))}
    keys = _shard_keys(dump_path)
    assert len(keys) == len(set(keys)) == len(expected)
    assert {len(k) for k in keys} == ({64} if xxhash_missing else {33})
    shutil.rmtree(dump_path / "step0")
    assert cli_main(["export", str(dump_path)]) == 0
    data = json.loads((dump_path / "step0" / "rank" / "dump.json").read_text())["data"]
    tdir = dump_path / "step0" / "rank" / "dump_tensor_data"
    for n, t in enumerate(tensors):
        entry = data[f"Torch.flatten.{n}.forward"]
        for record, want in ((entry["input_args"][0], t), (entry["output"][0], torch.flatten(t))):
            assert bits_equal(torch.load(tdir / record["data_name"], weights_only=True), want), (n, record)
