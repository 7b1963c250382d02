"""Recording on a CUDA device (skipped where there is none, as on CI).

* No host synchronisation while a step records: ``torch.cuda.set_sync_debug_mode("error")``
  makes every synchronising CUDA call raise (``.item()``, blocking device→host copies,
  stream synchronisation); the recorder would catch such an error, log it and stop
  recording, so each test also asserts the session is still recording afterwards.
* Statistics of CUDA tensors (computed on the device and gathered at the flush point,
  :mod:`msprobe.pytorch.deferred`) equal the synchronous CPU path's over the same values:
  Max/Min and the NaN/Inf fields exactly, Mean and Norm to float32 accumulation accuracy;
  CRC-32 (summary_mode md5) and task tensor files are the bytes of the values.

Run on a GPU machine: ``python -m pytest -q tests/pytorch/test_cuda.py``.
"""
from __future__ import annotations

import json
import math
import zlib

import numpy as np
import pytest
import torch
import torch.nn as nn

from pt_helpers import load_dump
from msprobe.pytorch import PrecisionDebugger
from test_sync_free import record_step

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def debugger(tmp_path, name, **cfg):
    """A PrecisionDebugger writing to ``tmp_path/name`` with config fields ``cfg``."""
    config = {"task": "statistics", "dump_path": str(tmp_path / name), "level": "L1"}
    config.update(cfg)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config))
    return PrecisionDebugger(config_path=str(path))


def encoder(layers=2, device="cuda"):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
    model = nn.Sequential(nn.Embedding(50, 32), nn.TransformerEncoder(layer, layers, enable_nested_tensor=False),
                          nn.Linear(32, 50)).to(device)
    tokens = torch.randint(0, 50, (4, 16), generator=torch.Generator().manual_seed(1)).to(device)
    return model, tokens


def train_step(model, tokens, opt, autocast):
    opt.zero_grad()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        logits = model(tokens)
    loss = nn.functional.cross_entropy(logits.float().reshape(-1, 50), tokens.reshape(-1))
    loss.backward()
    opt.step()


@pytest.mark.parametrize("level,autocast", [("L0", False), ("L1", False), ("mix", False), ("mix", True)])
def test_recorded_step_does_not_synchronise(tmp_path, level, autocast):
    model, tokens = encoder()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_step(model, tokens, opt, autocast)  # warm-up outside the check (lazy initialisations)
    torch.cuda.set_sync_debug_mode("error")
    try:
        train_step(model, tokens, opt, autocast)  # the workload itself does not synchronise
    finally:
        torch.cuda.set_sync_debug_mode("default")
    dbg = debugger(tmp_path, "d", level=level)
    dbg.start(model)
    torch.cuda.set_sync_debug_mode("error")
    try:
        train_step(model, tokens, opt, autocast)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert dbg.session.recording and not dbg.session.disabled and not dbg.session.failed
    dbg.stop()
    dbg.step()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    assert len(data) > 20
    floats = [leaf for e in data.values() for part in ("input", "output", "input_args")
              for leaf in e.get(part) or [] if isinstance(leaf, dict) and leaf.get("dtype", "").startswith("torch.float")]
    assert floats and all(isinstance(leaf["Max"], float) and isinstance(leaf["Norm"], float) for leaf in floats)


def test_sync_count_does_not_grow_on_cuda(tmp_path):
    syncs2, transfers2, entries2 = record_step(tmp_path, 2, device="cuda")
    syncs8, transfers8, entries8 = record_step(tmp_path, 8, device="cuda")
    assert entries8 > 3 * entries2
    assert syncs8 == syncs2
    assert transfers8 == transfers2 and transfers2 <= 3


def _values():
    g = torch.Generator().manual_seed(3)
    big16 = torch.full((1000,), 60000.0, dtype=torch.float16)  # squares overflow fp16; Norm fits fp32
    nan_inf = torch.randn(257, generator=g)
    nan_inf[[3, 100]] = float("nan")
    nan_inf[7] = float("inf")
    only_inf = torch.randn(64, generator=g)
    only_inf[[0, 63]] = torch.tensor([float("-inf"), float("inf")])
    return {
        "f32": torch.randn(3, 1000, generator=g),
        "f32_t": torch.randn(40, 30, generator=g).t(),
        "f16": torch.randn(5000, generator=g).half(),
        "bf16": torch.randn(5000, generator=g).bfloat16(),
        "f64": torch.randn(777, generator=g, dtype=torch.float64),
        "big16": big16,
        "big32": torch.tensor([3e19, -4e19, 1e-30], dtype=torch.float32),  # float32 squares overflow
        "tiny32": torch.tensor([3e-25, -4e-25], dtype=torch.float32),  # float32 squares underflow
        "f64_huge": torch.tensor([2e200, 1e200, -3e-200], dtype=torch.float64),  # rescaled sums
        "i64": torch.randint(-1000, 1000, (300,), generator=g),
        "i32": torch.randint(-5, 5, (17, 3), generator=g, dtype=torch.int32),
        "u8": torch.randint(0, 255, (99,), generator=g, dtype=torch.uint8),
        "bool": torch.rand(50, generator=g) > 0.5,
        "c64": torch.randn(20, generator=g, dtype=torch.complex64),
        "scalar": torch.tensor(-2.5),
        "nan_inf": nan_inf,
        "only_inf": only_inf,
        "all_nan": torch.full((9,), float("nan")),
    }


def _same(a, b):
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _record(tmp_path, name, values, device, **cfg):
    dbg = debugger(tmp_path, name, **cfg)
    dbg.start()
    for v in values.values():
        torch.flatten(v.to(device))
    dbg.stop()
    dbg.close()
    data = load_dump(tmp_path / name)[0]["data"]
    return [data[f"Torch.flatten.{i}.forward"]["input_args"][0] for i in range(len(values))]


@pytest.mark.parametrize("cfg", [{}, {"async_dump": True}], ids=["sync", "async_dump"])
def test_cuda_statistics_equal_cpu_path(tmp_path, cfg):
    values = _values()
    cpu = _record(tmp_path, "cpu", values, "cpu")
    cuda = _record(tmp_path, "cuda", values, "cuda", **cfg)
    for name, a, b in zip(values, cpu, cuda):
        assert set(a) == set(b), name
        for key in a:
            if key in ("Mean", "Norm") and isinstance(a[key], float) and math.isfinite(a[key]):
                assert b[key] == pytest.approx(a[key], rel=2e-6, abs=1e-30), (name, key, a[key], b[key])
            elif name == "c64" and key in ("Max", "Min"):  # |z| by each device's own kernel: 1 ulp apart
                assert b[key] == pytest.approx(a[key], rel=2.4e-7), (name, key, a[key], b[key])
            else:
                assert _same(b[key], a[key]), (name, key, a[key], b[key])
    f32 = values["f32"].double().numpy()
    assert cuda[0]["Max"] == float(f32.max()) and cuda[0]["Min"] == float(f32.min())
    assert cuda[0]["Norm"] == pytest.approx(float(np.sqrt((f32 * f32).sum())), rel=1e-6)
    assert cuda[list(values).index("big16")]["Norm"] == pytest.approx(60000.0 * math.sqrt(1000), rel=1e-6)
    for name, norm in (("big32", 5e19), ("tiny32", 5e-25), ("f64_huge", math.hypot(2e200, 1e200))):
        assert cuda[list(values).index(name)]["Norm"] == pytest.approx(norm, rel=1e-6), name


def test_cuda_md5_mode_statistics_keep_their_range(tmp_path):
    """md5 computes statistics on the device without deferring them (tensor_stats' general
    path): float32 squares must not overflow or underflow there either."""
    values = {k: v for k, v in _values().items() if k in ("big32", "tiny32", "f64_huge", "f32")}
    cpu = _record(tmp_path, "cpu5", values, "cpu", statistics={"summary_mode": "md5"})
    cuda = _record(tmp_path, "cuda5", values, "cuda", statistics={"summary_mode": "md5"})
    for name, a, b in zip(values, cpu, cuda):
        for key in ("Max", "Min", "md5"):
            assert a[key] == b[key], (name, key)
        for key in ("Mean", "Norm"):
            assert b[key] == pytest.approx(a[key], rel=2e-6), (name, key, a[key], b[key])


def test_cuda_md5_is_crc32_of_bytes(tmp_path):
    values = {k: v for k, v in _values().items() if k not in ("f32_t",)}
    recs = _record(tmp_path, "md5", values, "cuda", statistics={"summary_mode": "md5"})
    for (name, v), rec in zip(values.items(), recs):
        host = v.float() if v.dtype == torch.bfloat16 else v  # spec: bf16 is hashed as float32
        expected = "%08x" % (zlib.crc32(host.contiguous().numpy().tobytes()) & 0xFFFFFFFF)
        assert rec["md5"] == expected, name


def test_cuda_tensor_task_files_hold_the_values(tmp_path):
    values = {k: _values()[k] for k in ("f32", "bf16", "i64", "nan_inf")}
    recs = _record(tmp_path, "t", values, "cuda", task="tensor")
    root = tmp_path / "t" / "step0" / "rank" / "dump_tensor_data"
    for (name, v), rec in zip(values.items(), recs):
        saved = torch.load(root / rec["data_name"], weights_only=True)
        assert saved.device.type == "cpu" and saved.dtype == v.dtype
        assert torch.equal(saved.view(torch.uint8) if v.is_floating_point() else saved,
                           v.view(torch.uint8) if v.is_floating_point() else v), name


def test_cuda_bench_path_decides_at_the_flush_point(tmp_path):
    """tensor.bench_path on CUDA (CRC-32s on the device, calls decided at the flush point):
    no synchronisation while the step records, and the calls that introduced the
    difference keep the values they had at the call (the add's output before the later
    ``mul_``), equal to an unrecorded run's on the same device."""
    from test_bench_path_device import ADD, EPS, MUL, Net

    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1)).cuda()

    def run(name, eps, scale, bench=None):
        tensor = {"summary_mode": "md5"}
        if bench is not None:
            tensor.update(bench_path=str(bench), diff_nums=-1)
        torch.manual_seed(0)
        net = Net().cuda()
        net.eps, net.scale = eps, scale
        dbg = debugger(tmp_path, name, task="tensor", tensor=tensor)
        net(x)  # warm-up (lazy initialisations), not recorded
        dbg.start(net)
        torch.cuda.set_sync_debug_mode("error")
        try:
            net(x).backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert dbg.session.recording and not dbg.session.disabled and not dbg.session.failed
        dbg.stop()
        dbg.step()
        dbg.close()
        return tmp_path / name

    base = run("base", 0.0, 1.0)
    pert = run("pert", EPS, 2.0, bench=base)
    data = load_dump(pert)[0]["data"]
    root = pert / "step0" / "rank" / "dump_tensor_data"
    names = sorted(f"{k}.{io}.{i}" for k, e in data.items() for io in ("input_args", "output")
                   for i, r in enumerate(e.get(io) or []) if isinstance(r, dict) and "data_name" in r)
    assert names == sorted(ADD + MUL)
    torch.manual_seed(0)
    ref = Net().cuda()
    with torch.no_grad():
        h = torch.relu(ref.fc1(x))
        want = {"Torch.add.0.forward.input_args.0": h, "Torch.add.0.forward.output.0": h + EPS,
                "Torch.mul.0.forward.input_args.0": x.to(torch.bfloat16),
                "Torch.mul.0.forward.output.0": x.to(torch.bfloat16) * 2.0}
    for name, value in want.items():
        entry, io, i = name.rsplit(".", 2)
        saved = torch.load(root / data[entry][io][int(i)]["data_name"], weights_only=True)
        assert saved.dtype == value.dtype and torch.equal(saved, value.cpu()), name
