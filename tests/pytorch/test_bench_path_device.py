"""``tensor.bench_path`` on the device path: a call whose CRC-32s are computed on the device
is selected at the flush point, its tensors' values kept in their CRC-32 staging rows until
then. Forced through that path on the CPU (``defer_all``), a perturbed run writes the same
tensor files, bit for bit, and the same dump.json records as the host path (which decides
each call when it ends), ``diff_nums`` counts the same calls in the same order, a tensor
changed in place after its call keeps the values it had at the call, and the training
computes the same bits as without msprobe. Counted over the dispatch workload, the path
makes no host synchronisation per tensor."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn as nn

from msprobe.pytorch import PrecisionDebugger
from pt_helpers import device_ops, load_dump, tensor_records

EPS = 1e-3
STEPS = 2


class Net(nn.Module):
    """fc1 -> relu -> ``torch.add(h, eps)`` (changed in place by ``mul_`` afterwards) ->
    fc2, and a bfloat16 branch ``torch.mul(x.bfloat16(), scale)``; ``eps`` 0 and ``scale``
    1 in the baseline run."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 2)
        self.eps, self.scale = 0.0, 1.0

    def forward(self, x):
        a = torch.add(torch.relu(self.fc1(x)), self.eps)
        a.mul_(2.0)  # after the add's call: its output file holds the values before this
        b = torch.mul(x.to(torch.bfloat16), self.scale)
        return self.fc2(a).sum() + b.float().sum()


_DEFERRED = {"selected": 0}  # calls the last run selected at a flush point


def _inputs():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(3, 4, generator=g) for _ in range(STEPS)]


def _run(tmp_path, name, *, eps=0.0, scale=1.0, bench=None, diff_nums=-1, defer=False, record=True):
    """One seeded run (task tensor, summary_mode md5, level mix); returns ``(dump path,
    losses)``."""
    dump = tmp_path / name
    tensor = {"summary_mode": "md5"}
    if bench is not None:
        tensor.update(bench_path=str(bench), diff_nums=diff_nums)
    cfg = tmp_path / f"{name}.json"
    cfg.write_text(json.dumps({"task": "tensor", "dump_path": str(dump), "level": "mix", "tensor": tensor}))
    torch.manual_seed(0)
    net = Net()
    net.eps, net.scale = eps, scale
    dbg = PrecisionDebugger(config_path=str(cfg)) if record else None
    if dbg is not None:
        dbg.recorder.leaves.defer_all = defer
        _DEFERRED["selected"] = 0
        if bench is not None:
            decide = dbg.recorder.deferred.bench_decide

            def counting(call, held):
                chosen = decide(call, held)
                _DEFERRED["selected"] += chosen
                return chosen

            dbg.recorder.deferred.bench_decide = counting
    losses = []
    for x in _inputs():
        if dbg is not None:
            dbg.start(net)
        loss = net(x)
        loss.backward()
        losses.append(loss.detach().clone())
        if dbg is not None:
            dbg.stop()
            dbg.step()
    if dbg is not None:
        dbg.close()
    return dump, losses


def _step(dump, step):
    """``({record path: record}, {record path: tensor file})`` of one step."""
    data = load_dump(dump, step)[0]["data"]
    tdir = dump / f"step{step}" / "rank" / "dump_tensor_data"
    recs = dict(tensor_records(data))
    files = {k: torch.load(tdir / r["data_name"], weights_only=True) for k, r in recs.items() if "data_name" in r}
    return recs, files


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("base"), "base")[0]


def _same_as_host(host, dev):
    for step in range(STEPS):
        host_recs, host_files = _step(host, step)
        dev_recs, dev_files = _step(dev, step)
        assert host_recs.keys() == dev_recs.keys()
        assert host_files.keys() == dev_files.keys()
        for k, a in host_files.items():
            b = dev_files[k]
            assert a.dtype == b.dtype and a.shape == b.shape, k
            assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), k
        for k, a in host_recs.items():
            b = dev_recs[k]
            for field in ("md5", "data_name", "dtype", "shape", "Max", "Min"):
                x, y = a.get(field), b.get(field)
                assert x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)), (k, field, x, y)
            for field in ("Mean", "Norm"):  # reduced in another order on the device path
                assert (a.get(field) is None) == (b.get(field) is None), (k, field)
                if a.get(field) is not None:
                    assert b[field] == pytest.approx(a[field], rel=1e-6, abs=1e-12), (k, field)


ADD = ["Torch.add.0.forward.input_args.0", "Torch.add.0.forward.output.0"]
MUL = ["Torch.mul.0.forward.input_args.0", "Torch.mul.0.forward.output.0"]


@pytest.mark.parametrize("diff_nums, want", [
    (-1, [ADD + MUL, ADD + MUL]),
    (1, [ADD, []]),  # the add is recorded before the mul
    (3, [ADD + MUL, ADD]),
])
def test_device_path_selects_and_stores_as_the_host_path(tmp_path, baseline, diff_nums, want):
    host, _ = _run(tmp_path, "host", eps=EPS, scale=2.0, bench=baseline, diff_nums=diff_nums)
    dev, _ = _run(tmp_path, "dev", eps=EPS, scale=2.0, bench=baseline, diff_nums=diff_nums, defer=True)
    _same_as_host(host, dev)
    assert [sorted(_step(dev, step)[1]) for step in range(STEPS)] == want
    assert _DEFERRED["selected"] == sum(len(w) for w in want) // 2  # decided at the flush points


def test_stored_values_are_those_of_the_call(tmp_path, baseline):
    """The add's files hold its input and output at the call, computed independently (an
    unrecorded forward); the later ``mul_`` does not reach them; the bfloat16 files hold
    the bfloat16 values."""
    dev, _ = _run(tmp_path, "dev", eps=EPS, scale=2.0, bench=baseline, defer=True)
    for step, x in enumerate(_inputs()):
        _, files = _step(dev, step)
        torch.manual_seed(0)
        ref = Net()
        with torch.no_grad():
            h = torch.relu(ref.fc1(x)).numpy()
        add_in = files["Torch.add.0.forward.input_args.0"]
        add_out = files["Torch.add.0.forward.output.0"]
        np.testing.assert_array_equal(add_in.numpy(), h)
        np.testing.assert_array_equal(add_out.numpy(), (h + np.float32(EPS)).astype(np.float32))
        mul_in = files["Torch.mul.0.forward.input_args.0"]
        mul_out = files["Torch.mul.0.forward.output.0"]
        assert mul_in.dtype == mul_out.dtype == torch.bfloat16
        np.testing.assert_array_equal(mul_in.float().numpy(), x.to(torch.bfloat16).float().numpy())
        np.testing.assert_array_equal(mul_out.float().numpy(), (x.to(torch.bfloat16) * 2).float().numpy())


def test_an_unchanged_run_keeps_no_tensor_on_the_device_path(tmp_path, baseline):
    dev, _ = _run(tmp_path, "same", bench=baseline, defer=True)
    for step in range(STEPS):
        recs, files = _step(dev, step)
        assert files == {} and all(len(r["md5"]) == 8 for r in recs.values())


def test_recording_changes_no_bit_of_the_training(tmp_path, baseline):
    _, plain = _run(tmp_path, "plain", eps=EPS, scale=2.0, record=False)
    _, dev = _run(tmp_path, "dev", eps=EPS, scale=2.0, bench=baseline, defer=True)
    for a, b in zip(plain, dev):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_bench_path_syncs_per_flush(tmp_path):
    ops = device_ops()
    small = ops.count_mode("bench_path", layers=1, work=str(tmp_path / "l1"))
    large = ops.count_mode("bench_path", layers=3, work=str(tmp_path / "l3"))
    assert large["tensors"] > 2 * small["tensors"] > 0
    # statistics and CRC-32, one copy each per tensor (the CRC-32 rows hold the values
    # until the flush decides); nothing differs from the baseline, so nothing is read back
    assert large["ops_per_tensor"] <= 3, large
    for r in (small, large):
        assert r["syncs"] <= r["flushes"], r
    assert small["syncs"] == large["syncs"]


def test_a_small_memory_budget_decides_at_every_entry(tmp_path, baseline, monkeypatch):
    """With a budget of one byte the queue is resolved at each entry it holds (the
    decision of a call then waits only for its own entry): the same calls and files."""
    from msprobe.pytorch import deferred

    monkeypatch.setattr(deferred, "PAYLOAD_BUDGET", 1)
    host, _ = _run(tmp_path, "host", eps=EPS, scale=2.0, bench=baseline, diff_nums=3)
    dev, _ = _run(tmp_path, "dev", eps=EPS, scale=2.0, bench=baseline, diff_nums=3, defer=True)
    _same_as_host(host, dev)
    assert [sorted(_step(dev, step)[1]) for step in range(STEPS)] == [ADD + MUL, ADD]
    assert _DEFERRED["selected"] == 3


def test_kept_staging_rows_hold_the_values():
    """:meth:`CrcRow.values`: the C-order bytes of each staged tensor (bfloat16 as float32,
    exactly), after the matrices are reduced, while ``keep_rows``; freed rows say so."""
    from msprobe.pytorch.device_checksum import CrcBatch, crc_dtype

    batch = CrcBatch(chunk_words=16)
    batch.keep_rows = True
    tensors = [torch.arange(6, dtype=torch.float32).reshape(2, 3).t(), torch.tensor([1.5, -2.25], dtype=torch.bfloat16),
               torch.tensor([True, False, True]), torch.arange(40, dtype=torch.int64)]
    rows = [batch.stage(t, crc_dtype(t)) for t in tensors]
    assert batch.kept_bytes >= sum(r.nbytes for r in rows)
    batch.reduce_all()
    for t, row in zip(tensors, rows):
        want = t.contiguous().to(row.dtype).reshape(-1).view(torch.uint8)
        assert torch.equal(row.values(), want)
        assert torch.equal(row.values().clone().view(row.dtype).to(t.dtype).reshape(t.shape), t)
    plain = CrcBatch()
    row = plain.stage(torch.ones(3), torch.float32)
    plain.reduce_all()
    with pytest.raises(RuntimeError, match="freed"):
        row.values()


class Scale(nn.Module):
    """Scales its input in place (``s`` 1 in the baseline run)."""

    def __init__(self):
        super().__init__()
        self.s = 1.0

    def forward(self, h):
        return h.mul_(self.s)


class InPlaceNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.scale = nn.Linear(4, 4), Scale()

    def forward(self, x):
        return self.scale(torch.add(self.fc1(x), 1.0)).sum()


def _inplace_run(tmp_path, name, s, bench=None, defer=False):
    dump = tmp_path / name
    tensor = {"summary_mode": "md5"}
    if bench is not None:
        tensor.update(bench_path=str(bench), diff_nums=-1)
    cfg = tmp_path / f"{name}.json"
    cfg.write_text(json.dumps({"task": "tensor", "dump_path": str(dump), "level": "mix", "tensor": tensor}))
    torch.manual_seed(0)
    net = InPlaceNet()
    net.scale.s = s
    dbg = PrecisionDebugger(config_path=str(cfg))
    dbg.recorder.leaves.defer_all = defer
    dbg.start(net)
    net(_inputs()[0]).backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    return dump


def test_inputs_written_in_place_keep_the_values_the_call_received(tmp_path):
    """A module and the API call inside it that scale their input in place are both
    selected; their input files hold the values before the write (as on the host path),
    computed independently here."""
    base = _inplace_run(tmp_path, "base", 1.0)
    host = _inplace_run(tmp_path, "host", 3.0, bench=base)
    dev = _inplace_run(tmp_path, "dev", 3.0, bench=base, defer=True)
    host_recs, host_files = _step(host, 0)
    dev_recs, dev_files = _step(dev, 0)
    assert sorted(dev_files) == sorted(host_files) == [
        "Module.scale.Scale.forward.0.input_args.0", "Module.scale.Scale.forward.0.output.0",
        "Tensor.mul_.0.forward.input_args.0", "Tensor.mul_.0.forward.output.0"]
    torch.manual_seed(0)
    with torch.no_grad():
        h = torch.add(InPlaceNet().fc1(_inputs()[0]), 1.0)
    for k, t in dev_files.items():
        want = h * 3.0 if k.endswith("output.0") else h
        assert torch.equal(t, want), k
        assert torch.equal(t, host_files[k]), k
        assert dev_recs[k]["md5"] == host_recs[k]["md5"], k
