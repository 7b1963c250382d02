"""Task tensor with ``bench_path`` and ``diff_nums`` (summary_mode md5): a seeded run is
recorded as the baseline, then the same run with one operation perturbed keeps the full
tensors of exactly the call that introduced the difference (its inputs match the
baseline's CRC-32s, its outputs do not), at most ``diff_nums`` calls; bad values are a
ConfigError before training starts."""
from __future__ import annotations

import json
import logging
import os
import shutil
import zlib

import numpy as np
import pytest
import torch
import torch.nn as nn

from msprobe.core.errors import ConfigError
from msprobe.pytorch import PrecisionDebugger

EPS = 1e-3


class Perturb(nn.Module):
    """Adds ``eps`` (0 in the baseline run) with ``torch.add``."""

    def __init__(self):
        super().__init__()
        self.eps = 0.0

    def forward(self, x):
        return torch.add(x, self.eps)


class Net(nn.Module):
    """fc1 -> relu -> perturb -> fc2, and a second branch scaled by ``scale`` (1 in the
    baseline run) with ``torch.mul``, independent of the first."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.perturb = Perturb()
        self.fc2 = nn.Linear(4, 2)
        self.scale = 1.0

    def forward(self, x):
        a = self.fc2(self.perturb(torch.relu(self.fc1(x))))
        b = torch.mul(x, self.scale)
        return a.sum() + b.sum()


def _inputs(steps):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(3, 4, generator=g) for _ in range(steps)]


def _run(tmp_path, name, *, eps=0.0, scale=1.0, bench=None, diff_nums=None, level="L1", steps=1):
    """One seeded run recorded as task tensor, summary_mode md5; returns its dump path."""
    dump = tmp_path / name
    tensor = {"summary_mode": "md5"}
    if bench is not None:
        tensor["bench_path"] = str(bench)
    if diff_nums is not None:
        tensor["diff_nums"] = diff_nums
    cfg = tmp_path / f"{name}.json"
    cfg.write_text(json.dumps({"task": "tensor", "dump_path": str(dump), "level": level, "tensor": tensor}))
    torch.manual_seed(0)
    net = Net()
    net.perturb.eps, net.scale = eps, scale
    dbg = PrecisionDebugger(config_path=str(cfg))
    for x in _inputs(steps):
        dbg.start(net)
        net(x).backward()
        dbg.stop()
        dbg.step()
    dbg.close()
    return dump


def _files(dump, step=0):
    d = dump / f"step{step}" / "rank" / "dump_tensor_data"
    return sorted(os.listdir(d)) if d.is_dir() else []


def _dump(dump, step=0):
    return json.loads((dump / f"step{step}" / "rank" / "dump.json").read_text())["data"]


def _tensor_records(entry):
    for key, value in entry.items():
        for rec in value if isinstance(value, list) else value.values() if isinstance(value, dict) else []:
            if isinstance(rec, dict) and rec.get("type") == "torch.Tensor":
                yield key, rec


def _reference(x):
    """The perturbed op's input and output, computed in an unrecorded run (same seed)."""
    torch.manual_seed(0)
    net = Net()
    with torch.no_grad():
        h = torch.relu(net.fc1(x))
    return h.numpy(), (h.numpy() + np.float32(EPS)).astype(np.float32)


@pytest.fixture()
def baseline(tmp_path):
    return _run(tmp_path, "base", steps=2)


def test_only_the_perturbed_op_keeps_its_tensors(tmp_path, baseline):
    run = _run(tmp_path, "pert", eps=EPS, bench=baseline, diff_nums=-1, steps=2)
    for step, x in enumerate(_inputs(2)):
        assert _files(run, step) == ["Torch.add.0.forward.input.0.pt", "Torch.add.0.forward.output.0.pt"]
        data_dir = run / f"step{step}" / "rank" / "dump_tensor_data"
        inp = torch.load(data_dir / "Torch.add.0.forward.input.0.pt", weights_only=True)
        out = torch.load(data_dir / "Torch.add.0.forward.output.0.pt", weights_only=True)
        want_in, want_out = _reference(x)
        np.testing.assert_array_equal(inp.numpy(), want_in)
        np.testing.assert_allclose(out.numpy(), want_out, rtol=0, atol=1e-7)
        # every record keeps its CRC-32 (that of its bytes); only the selected one names a file
        for name, entry in _dump(run, step).items():
            for _, rec in _tensor_records(entry):
                assert len(rec["md5"]) == 8
                assert ("data_name" in rec) == (name == "Torch.add.0.forward"), (name, rec)
        rec = _dump(run, step)["Torch.add.0.forward"]["output"][0]
        assert rec["md5"] == f"{zlib.crc32(out.numpy().tobytes()):08x}"


def test_an_unchanged_run_keeps_no_tensor(tmp_path, baseline):
    run = _run(tmp_path, "same", bench=baseline, diff_nums=-1, steps=2)
    assert _files(run, 0) == [] and _files(run, 1) == []
    assert "Torch.add.0.forward" in _dump(run)


def test_diff_nums_limits_the_calls_over_the_run(tmp_path, baseline):
    both = ["Torch.add.0.forward.input.0.pt", "Torch.add.0.forward.output.0.pt",
            "Torch.mul.0.forward.input.0.pt", "Torch.mul.0.forward.output.0.pt"]
    run = _run(tmp_path, "all", eps=EPS, scale=2.0, bench=baseline, diff_nums=-1, steps=2)
    assert _files(run, 0) == both and _files(run, 1) == both
    one = _run(tmp_path, "one", eps=EPS, scale=2.0, bench=baseline, diff_nums=1, steps=2)
    assert _files(one, 0) == both[:2] and _files(one, 1) == []
    default = _run(tmp_path, "default", eps=EPS, scale=2.0, bench=baseline, steps=2)  # upstream's default: 1
    assert _files(default, 0) == both[:2] and _files(default, 1) == []
    three = _run(tmp_path, "three", eps=EPS, scale=2.0, bench=baseline, diff_nums=3, steps=2)
    assert _files(three, 0) == both and _files(three, 1) == both[:2]
    # the mul's saved input is the step's x itself
    x = torch.load(run / "step1" / "rank" / "dump_tensor_data" / "Torch.mul.0.forward.input.0.pt", weights_only=True)
    assert torch.equal(x, _inputs(2)[1])


def test_mix_level_selects_the_op_and_the_modules_around_it(tmp_path):
    base = _run(tmp_path, "base", level="mix")
    run = _run(tmp_path, "pert", eps=EPS, bench=base, diff_nums=-1, level="mix")
    names = {f.split(".input.")[0].split(".output.")[0].split(".parameters.")[0] for f in _files(run)}
    assert names == {"Torch.add.0.forward", "Module.perturb.Perturb.forward.0"}
    # the op finishes before its module: with diff_nums 1 the op alone
    one = _run(tmp_path, "one", eps=EPS, bench=base, diff_nums=1, level="mix")
    assert _files(one) == ["Torch.add.0.forward.input.0.pt", "Torch.add.0.forward.output.0.pt"]


def test_baseline_in_an_upstream_layout(tmp_path, baseline):
    """Only ``step{N}/proc{pid}/dump.json`` (upstream 26.x's layout without
    torch.distributed): the md5 fields are read from dump.json."""
    up = tmp_path / "upstream"
    for step in (0, 1):
        (up / f"step{step}" / "proc4242").mkdir(parents=True)
        shutil.copy(baseline / f"step{step}" / "rank" / "dump.json", up / f"step{step}" / "proc4242" / "dump.json")
    run = _run(tmp_path, "pert", eps=EPS, bench=up, diff_nums=-1, steps=2)
    assert _files(run, 0) == _files(run, 1) == ["Torch.add.0.forward.input.0.pt", "Torch.add.0.forward.output.0.pt"]


def test_a_step_the_baseline_lacks_keeps_nothing(tmp_path, caplog):
    base = _run(tmp_path, "base", steps=1)
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        run = _run(tmp_path, "pert", eps=EPS, bench=base, diff_nums=-1, steps=2)
    assert len(_files(run, 0)) == 2 and _files(run, 1) == []
    assert "no forward entry of rank 0 step 1" in caplog.text


def _config(tmp_path, tensor, **top):
    cfg = tmp_path / "bad.json"
    cfg.write_text(json.dumps({"task": "tensor", "dump_path": str(tmp_path / "out"), "level": "L1",
                               "tensor": tensor, **top}))
    return str(cfg)


@pytest.mark.parametrize("make, field, words", [
    (lambda p, b: {"summary_mode": "md5", "bench_path": str(p / "nowhere")}, "tensor.bench_path", "does not exist"),
    (lambda p, b: {"summary_mode": "md5", "bench_path": str(p / "base.json")}, "tensor.bench_path", "not a directory"),
    (lambda p, b: {"summary_mode": "md5", "bench_path": str((p / "empty").mkdir() or p / "empty")},
     "tensor.bench_path", "neither .msprobe/log/ nor a dump.json"),
    (lambda p, b: {"summary_mode": "md5", "bench_path": 3}, "tensor.bench_path", ""),
    (lambda p, b: {"bench_path": str(b)}, "tensor.summary_mode", "md5"),
    (lambda p, b: {"summary_mode": "md5", "bench_path": str(b), "diff_nums": 0}, "tensor.diff_nums", ""),
    (lambda p, b: {"summary_mode": "md5", "bench_path": str(b), "diff_nums": -2}, "tensor.diff_nums", ""),
    (lambda p, b: {"summary_mode": "md5", "bench_path": str(b), "diff_nums": "1"}, "tensor.diff_nums", ""),
    (lambda p, b: {"summary_mode": "md5", "bench_path": str(b), "diff_nums": True}, "tensor.diff_nums", ""),
    (lambda p, b: {"summary_mode": "md5", "bench_path": str(b), "data_mode": ["input"]}, "tensor.data_mode", ""),
])
def test_bad_bench_options_are_config_errors(tmp_path, baseline, make, field, words):
    with pytest.raises(ConfigError) as info:
        PrecisionDebugger(config_path=_config(tmp_path, make(tmp_path, baseline)))
    assert info.value.field == field
    assert words in str(info.value)


def test_bench_path_with_async_dump_or_as_dump_path_is_a_config_error(tmp_path, baseline):
    with pytest.raises(ConfigError) as info:
        PrecisionDebugger(config_path=_config(tmp_path, {"summary_mode": "md5", "bench_path": str(baseline),
                                                          "list": ["add"]}, async_dump=True))
    assert info.value.field == "async_dump"
    cfg = tmp_path / "same.json"
    cfg.write_text(json.dumps({"task": "tensor", "dump_path": str(baseline), "level": "L1",
                               "tensor": {"summary_mode": "md5", "bench_path": str(baseline)}}))
    with pytest.raises(ConfigError) as info:
        PrecisionDebugger(config_path=str(cfg))
    assert info.value.field == "tensor.bench_path" and "other than dump_path" in str(info.value)


def test_a_baseline_without_crc32_is_a_config_error(tmp_path):
    """A statistics dump without md5, and one in summary_mode xor: the baseline has no
    CRC-32 to compare; the error comes when the debugger is built."""
    for mode, words in (("statistics", "no md5 value"), ("xor", "not a CRC-32")):
        dump = tmp_path / f"b_{mode}"
        dbg = PrecisionDebugger(dump_path=str(dump), task="statistics", level="L1") if mode == "statistics" else None
        if dbg is None:
            cfg = tmp_path / "x.json"
            cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(dump), "level": "L1",
                                       "statistics": {"summary_mode": "xor"}}))
            dbg = PrecisionDebugger(config_path=str(cfg))
        dbg.start()
        torch.relu(torch.randn(3))
        dbg.stop()
        dbg.step()
        dbg.close()
        with pytest.raises(ConfigError) as info:
            PrecisionDebugger(config_path=_config(tmp_path, {"summary_mode": "md5", "bench_path": str(dump)}))
        assert info.value.field == "tensor.bench_path" and words in str(info.value)


#: md5 (CRC-32) and shape of each forward tensor that mindstudio-probe 26.2.0 wrote in
#: step0/proc{pid}/dump.json for ``_upstream_script`` with eps 0 (task tensor, md5, L1)
UPSTREAM_26_2_0 = {
    "Functional.linear.0.forward": ([("c2fa8752", [3, 4]), ("9d6b4e22", [4, 4]), ("35743e7a", [4])],
                                    [("d6c539e0", [3, 4])]),
    "Torch.relu.0.forward": ([("d6c539e0", [3, 4])], [("8da52e76", [3, 4])]),
    "Torch.add.0.forward": ([("8da52e76", [3, 4]), {"type": "float", "value": 0.0}], [("8da52e76", [3, 4])]),
    "Functional.linear.1.forward": ([("8da52e76", [3, 4]), ("d4e3dab9", [2, 4]), ("4004052c", [2])],
                                    [("ebc6a4c2", [3, 2])]),
    "Tensor.sum.0.forward": ([("ebc6a4c2", [3, 2])], [("881fb560", [])]),
}


class _UpstreamNet(nn.Module):
    def __init__(self, eps):
        super().__init__()
        self.fc1, self.fc2, self.eps = nn.Linear(4, 4), nn.Linear(4, 2), eps

    def forward(self, x):
        return self.fc2(torch.add(torch.relu(self.fc1(x)), self.eps))


def test_baseline_written_by_upstream_26_2_0(tmp_path):
    """The CRC-32s 26.2.0 recorded for the same seeded script are ours: the perturbed run
    keeps exactly the add's tensors (26.2.0 itself, given this baseline, keeps the same two
    files)."""
    def record(crc_shape):
        if isinstance(crc_shape, dict):
            return crc_shape
        crc, shape = crc_shape
        return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": shape, "requires_grad": True, "md5": crc}
    data = {name: {"input_args": [record(r) for r in ins], "input_kwargs": {}, "output": [record(r) for r in outs]}
            for name, (ins, outs) in UPSTREAM_26_2_0.items()}
    proc = tmp_path / "upstream" / "step0" / "proc15287"
    proc.mkdir(parents=True)
    (proc / "dump.json").write_text(json.dumps({"task": "tensor", "level": "L1", "framework": "pytorch",
                                                "dump_data_dir": None, "data": data}))
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": "tensor", "dump_path": str(tmp_path / "ours"), "level": "L1",
                               "tensor": {"summary_mode": "md5", "bench_path": str(tmp_path / "upstream"),
                                          "diff_nums": -1}}))
    torch.manual_seed(0)
    net = _UpstreamNet(EPS)
    dbg = PrecisionDebugger(config_path=str(cfg))
    torch.manual_seed(1)
    x = torch.randn(3, 4)
    dbg.start(net)
    net(x).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    assert _files(tmp_path / "ours") == ["Torch.add.0.forward.input.0.pt", "Torch.add.0.forward.output.0.pt"]


class _InPlace(nn.Module):
    """fc1, then ``h.add_(eps)`` (in place), then an in-place ReLU module, then fc2."""

    def __init__(self, eps, shift):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 2)
        self.eps, self.shift = eps, shift

    def forward(self, x):
        h = self.fc1(x)
        with torch.no_grad():
            h.add_(self.eps)
        return self.fc2(self.act(h - self.shift))


def _in_place_run(tmp_path, name, eps, level, bench=None):
    tensor = {"summary_mode": "md5"}
    if bench is not None:
        tensor.update(bench_path=str(bench), diff_nums=-1)
    cfg = tmp_path / f"{name}.json"
    cfg.write_text(json.dumps({"task": "tensor", "dump_path": str(tmp_path / name), "level": level,
                               "tensor": tensor}))
    torch.manual_seed(0)
    net = _InPlace(eps, 0.1)
    x = torch.randn(3, 4)
    dbg = PrecisionDebugger(config_path=str(cfg))
    dbg.start(net)
    net(x).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    with torch.no_grad():
        h = net.fc1(x)
    return tmp_path / name, h


def test_a_call_that_writes_its_input_keeps_the_input_it_received(tmp_path):
    """``Tensor.add_`` changes its input: the saved input is the value before the call,
    the output the value after it (both computed again without recording)."""
    base, _ = _in_place_run(tmp_path, "base", 0.0, "L1")
    run, h = _in_place_run(tmp_path, "pert", EPS, "L1", bench=base)
    assert _files(run) == ["Tensor.add_.0.forward.input.0.pt", "Tensor.add_.0.forward.output.0.pt"]
    data = run / "step0" / "rank" / "dump_tensor_data"
    before = torch.load(data / "Tensor.add_.0.forward.input.0.pt", weights_only=True)
    after = torch.load(data / "Tensor.add_.0.forward.output.0.pt", weights_only=True)
    assert torch.equal(before, h)
    assert torch.equal(after, h + EPS)


class _AddInPlace(nn.Module):
    def __init__(self, eps):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        with torch.no_grad():
            return x.add_(self.eps)


def test_a_module_that_writes_its_input_keeps_the_input_it_received(tmp_path):
    """A module adding ``eps`` to its input in place, at level L0: its saved input is the
    value before its forward, its output the value after (computed again without
    recording)."""
    def run(name, eps, bench=None):
        tensor = {"summary_mode": "md5"}
        if bench is not None:
            tensor.update(bench_path=str(bench), diff_nums=-1)
        cfg = tmp_path / f"{name}.json"
        cfg.write_text(json.dumps({"task": "tensor", "dump_path": str(tmp_path / name), "level": "L0",
                                   "tensor": tensor}))
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 4), _AddInPlace(eps), nn.Linear(4, 2))
        x = torch.randn(3, 4)
        dbg = PrecisionDebugger(config_path=str(cfg))
        dbg.start(net)
        net(x)
        dbg.stop()
        dbg.step()
        dbg.close()
        with torch.no_grad():
            return tmp_path / name, net[0](x)
    base, _ = run("base", 0.0)
    pert, h = run("pert", EPS, bench=base)
    assert _files(pert) == ["Module.1._AddInPlace.forward.0.input.0.pt", "Module.1._AddInPlace.forward.0.output.0.pt"]
    data = pert / "step0" / "rank" / "dump_tensor_data"
    assert torch.equal(torch.load(data / "Module.1._AddInPlace.forward.0.input.0.pt", weights_only=True), h)
    assert torch.equal(torch.load(data / "Module.1._AddInPlace.forward.0.output.0.pt", weights_only=True),
                       h + EPS)
