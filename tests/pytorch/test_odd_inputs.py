"""Odd values and odd code: recording works with correct statistics, the
training results are bit-identical with and without the recorder, and msprobe logs no error.

Statistics are checked against numpy float64 computations; training results by
``torch.equal`` of losses, outputs and gradients of a run without msprobe.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import threading

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from pt_helpers import assert_record, load_dump
from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch.recorder import in_recompute
from store.log_reader import read_log


@pytest.fixture
def errors(caplog):
    """msprobe's error log lines; the tests assert there are none."""
    caplog.set_level(logging.ERROR, logger="msprobe")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "msprobe" and r.levelno >= logging.ERROR]


def record(tmp_path, fn, level="L1", model=None):
    """Run ``fn()`` in one recorded step; return (fn's result, dump.json data)."""
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level=level)
    dbg.start(model)
    out = fn()
    dbg.stop()
    dbg.step()
    dbg.close()
    return out, load_dump(tmp_path / "d")[0]["data"]


# --- odd tensor values -------------------------------------------------------------------


def test_odd_tensor_values_statistics(tmp_path, errors):
    b1, b2 = torch.tensor([True, False, True]), torch.tensor([False, False, True])
    ints = torch.tensor([-3, 7, 2**40], dtype=torch.int64)
    z = torch.tensor([3 + 4j, -1 + 0j], dtype=torch.complex64)
    zero_dim = torch.tensor(-2.5)
    big = torch.full((4,), 60000.0, dtype=torch.float16)  # Norm 120000 > fp16 max 65504

    def fn():
        return (torch.logical_or(b1, b2), torch.add(ints, 1), torch.mul(z, 2), torch.add(torch.empty(0, 3), 1),
                torch.neg(zero_dim), torch.mul(big, 1))

    outs, data = record(tmp_path, fn)
    assert errors() == []
    e = data["Torch.logical_or.0.forward"]
    assert e["input_args"][0] == {"type": "torch.Tensor", "dtype": "torch.bool", "shape": [3], "Max": True,
                                  "Min": False, "Mean": None, "Norm": None, "requires_grad": False}
    assert e["output"][0]["Max"] is True and e["output"][0]["Min"] is False
    # integers: exact in float64 (2**40 + 1 survives, float32 would round it)
    e = data["Torch.add.0.forward"]
    assert e["output"][0]["Max"] == float(2**40 + 1) and e["output"][0]["Min"] == -2.0
    assert e["output"][0]["Mean"] == pytest.approx(np.mean([-2.0, 8.0, 2.0**40 + 1]), rel=1e-15)
    assert e["input_args"][1] == {"type": "int", "value": 1}
    # complex: magnitudes
    e = data["Torch.mul.0.forward"]
    assert e["input_args"][0]["Max"] == pytest.approx(5.0) and e["input_args"][0]["Min"] == pytest.approx(1.0)
    assert e["input_args"][0]["Norm"] == pytest.approx(math.sqrt(26.0))
    assert e["output"][0]["Mean"] == pytest.approx(6.0)
    # empty: shape kept, statistics null
    e = data["Torch.add.1.forward"]
    assert e["input_args"][0]["shape"] == [0, 3]
    assert [e["output"][0][k] for k in ("Max", "Min", "Mean", "Norm")] == [None] * 4
    # zero-dim: Norm is |x|
    e = data["Torch.neg.0.forward"]
    assert (e["input_args"][0]["shape"], e["input_args"][0]["Max"], e["input_args"][0]["Norm"]) == ([], -2.5, 2.5)
    assert e["output"][0]["Norm"] == 2.5
    # fp16 Norm that overflows fp16 is still finite
    e = data["Torch.mul.1.forward"]
    assert e["output"][0]["Norm"] == pytest.approx(120000.0, rel=1e-3)
    assert torch.linalg.vector_norm(big).isinf()  # what fp16 accumulation would say
    assert_record(e["output"][0], outs[5], rel=1e-3)


def test_nan_and_inf_are_reported(tmp_path, errors):
    x = torch.tensor([1.0, float("nan"), -float("inf"), 4.0])
    _, data = record(tmp_path, lambda: torch.mul(x, 2))
    assert errors() == []
    rec = data["Torch.mul.0.forward"]["output"][0]
    assert math.isnan(rec["Max"]) and math.isnan(rec["Min"]) and math.isnan(rec["Norm"])
    assert (rec["Max_except_inf_nan"], rec["Min_except_inf_nan"]) == (8.0, 2.0)
    raw = (tmp_path / "d" / "step0" / "rank" / "dump.json").read_text()
    assert '"Max": NaN' in raw
    tensors = read_log(tmp_path / "d").table.to_pydict()
    flagged = {(io, a): (n, i) for io, a, n, i in zip(tensors["io"], tensors["arg"], tensors["has_nan"], tensors["has_inf"])
               if io == "output"}
    assert flagged[("output", "0")] == (True, True)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_meta_and_sparse_tensors_are_recorded(tmp_path, errors):
    meta = torch.empty(2, 5, device="meta")
    coo = torch.eye(3).to_sparse()
    csr = torch.eye(3).to_sparse_csr()

    def fn():
        return torch.add(meta, 1), torch.mul(coo, 2), torch.mul(csr, 3)

    outs, data = record(tmp_path, fn)
    assert errors() == []
    for name, shape in (("Torch.add.0.forward", [2, 5]), ("Torch.mul.0.forward", [3, 3]), ("Torch.mul.1.forward", [3, 3])):
        rec = data[name]["output"][0]
        assert rec["type"] == "torch.Tensor" and rec["shape"] == shape and rec["dtype"] == "torch.float32"
    rec = data["Torch.add.0.forward"]["output"][0]
    assert [rec[k] for k in ("Max", "Min", "Mean", "Norm")] == [None] * 4
    # sparse: the statistics of the matrix (tests/pytorch/test_sparse_stats.py)
    for name, k in (("Torch.mul.0.forward", 2.0), ("Torch.mul.1.forward", 3.0)):
        rec = data[name]["output"][0]
        assert [rec[x] for x in ("Max", "Min", "Mean")] == [k, 0.0, k / 3]
        assert rec["Norm"] == pytest.approx(k * 3 ** 0.5, rel=1e-15)
    assert torch.equal(outs[1].to_dense(), torch.eye(3) * 2)
    assert torch.equal(outs[2].to_dense(), torch.eye(3) * 3)


class Unprintable:
    def __repr__(self):
        raise RuntimeError("repr exploded")

    __str__ = __repr__


NT = collections.namedtuple("NT", "a b")


@dataclasses.dataclass
class DC:
    u: torch.Tensor
    v: int


class Returns(nn.Module):
    """Returns a different container per ``mode``; takes keyword arguments."""

    def __init__(self, mode):
        super().__init__()
        self.mode = mode
        self.fc = nn.Linear(3, 3)

    def forward(self, x, *, scale=1.0, extra=None, items=None):
        h = self.fc(x) * scale
        consumed = sum(items) if items is not None else 0  # the generator is still intact
        h = h + consumed
        if self.mode == "dict":
            return {"h": h, "pair": [h * 2, None]}
        if self.mode == "namedtuple":
            return NT(h, h + 1)
        if self.mode == "dataclass":
            return DC(h, 7)
        self.last = h
        return None


def _loss(out, module):
    if isinstance(out, dict):
        return out["h"].sum() + out["pair"][0].sum()
    if isinstance(out, NT):
        return out.a.sum() + out.b.sum()
    if isinstance(out, DC):
        return out.u.sum()
    return module.last.sum()


@pytest.mark.parametrize("mode", ["dict", "namedtuple", "dataclass", "none"])
def test_module_outputs_kwargs_generators_and_unprintable_arguments(tmp_path, errors, mode):
    def run(recorded):
        torch.manual_seed(0)
        m = Returns(mode)
        x = torch.randn(2, 3)
        dbg = PrecisionDebugger(dump_path=str(tmp_path / mode), level="mix") if recorded else None
        if dbg:
            dbg.start(m)
        out = m(x, scale=2.0, extra=Unprintable(), items=(i for i in range(4)))
        loss = _loss(out, m)
        loss.backward()
        if dbg:
            dbg.stop()
            dbg.step()
            dbg.close()
        return loss.detach(), m.fc.weight.grad.clone(), m.last if mode == "none" else None

    ref, got = run(False), run(True)
    assert torch.equal(ref[0], got[0]) and torch.equal(ref[1], got[1])
    assert errors() == []
    # a model without submodules is recorded as itself (spec section 9)
    data = load_dump(tmp_path / mode)[0]["data"]
    root = "Module.fc.Linear.forward.0"
    assert root in data
    torch.manual_seed(0)
    m = Returns(mode)
    x = torch.randn(2, 3)
    h = (m.fc(x) * 2.0 + 6).detach()
    linear = data["Functional.linear.0.forward"]
    assert_record(linear["input_args"][0], x)
    add = data["Tensor.__add__.0.forward"]
    assert add["input_args"][1] == {"type": "int", "value": 6}  # sum(range(4)): generator not consumed by msprobe
    assert_record(add["output"][0], h)


def test_module_with_kwargs_and_container_outputs_records_paths(tmp_path, errors):
    class Outer(nn.Module):
        def __init__(self, mode):
            super().__init__()
            self.inner = Returns(mode)

        def forward(self, x):
            return self.inner(x, scale=2.0, extra=Unprintable())

    for mode, expected in (("dict", {"h", "pair"}), ("namedtuple", {"a", "b"}), ("dataclass", {"u", "v"})):
        torch.manual_seed(0)
        outer = Outer(mode)
        x = torch.randn(2, 3)
        _, data = record(tmp_path / mode, lambda: outer(x), level="L0", model=outer)
        e = data["Module.inner.Returns.forward.0"]
        assert e["input_kwargs"]["scale"] == {"type": "float", "value": 2.0}
        assert e["input_kwargs"]["extra"]["type"].endswith("Unprintable")
        assert e["input_kwargs"]["extra"]["value"].startswith("<") and "Unprintable object>" in e["input_kwargs"]["extra"]["value"]
        assert set(e["output"][0]) == expected
        h = (outer.inner.fc(x) * 2.0).detach()
        first = e["output"][0]["h" if mode == "dict" else "a" if mode == "namedtuple" else "u"]
        assert_record(first, h)
    torch.manual_seed(0)
    outer = Outer("none")
    _, data = record(tmp_path / "none", lambda: outer(torch.randn(2, 3)), level="L0", model=outer)
    assert data["Module.inner.Returns.forward.0"]["output"] == [None]
    assert errors() == []


# --- odd code ----------------------------------------------------------------------------


def test_inplace_on_views_and_leaf_tensors(tmp_path, errors):
    def run(recorded):
        torch.manual_seed(0)
        w = torch.randn(3, 4, requires_grad=True)
        buf = torch.zeros(3, 4)  # leaf without grad, modified in place
        dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1") if recorded else None
        if dbg:
            dbg.start()
        h = w * 2
        view = h[:, 1:3]
        view.mul_(3)          # in place on a view of a non-leaf
        h.add_(1)             # in place on the base
        buf.add_(w.detach())  # in place on a leaf
        with torch.no_grad():
            w.add_(0.5)       # in place on a leaf that requires grad (allowed under no_grad)
        loss = (h * buf).sum()
        loss.backward()
        if dbg:
            dbg.stop()
            dbg.step()
            dbg.close()
        return loss.detach(), w.grad.clone(), w.detach().clone(), buf.clone()

    ref, got = run(False), run(True)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    assert errors() == []
    data = load_dump(tmp_path / "d")[0]["data"]
    torch.manual_seed(0)
    w0 = torch.randn(3, 4)
    h = w0 * 2
    # inputs are recorded before the call runs (spec 9, fix 6)
    assert_record(data["Tensor.mul_.0.forward"]["input_args"][0], h[:, 1:3])
    h[:, 1:3] *= 3
    assert_record(data["Tensor.mul_.0.forward"]["output"][0], h[:, 1:3])
    assert_record(data["Tensor.add_.0.forward"]["input_args"][0], h)
    assert_record(data["Tensor.add_.0.forward"]["output"][0], h + 1)
    assert_record(data["Tensor.add_.1.forward"]["input_args"][0], torch.zeros(3, 4))
    assert_record(data["Tensor.add_.2.forward"]["output"][0], w0 + 0.5)
    # gradient of the in-place chain: d/dw sum((w*2 with cols*3 +1) * buf) at buf = w0
    scale = torch.full((3, 4), 2.0)
    scale[:, 1:3] = 6.0
    assert torch.equal(got[1], scale * w0)


def test_weight_sharing_module_called_twice(tmp_path, errors):
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)
            self.act = nn.Tanh()

        def forward(self, x):
            return self.fc(self.act(self.fc(x)))

    def run(recorded):
        torch.manual_seed(0)
        m = Shared()
        x = torch.randn(2, 3)
        dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix") if recorded else None
        if dbg:
            dbg.start(m)
        loss = m(x).sum()
        loss.backward()
        if dbg:
            dbg.stop()
            dbg.step()
            dbg.close()
        return m, x, loss.detach(), m.fc.weight.grad.clone()

    _, _, loss0, g0 = run(False)
    m, x, loss1, g1 = run(True)
    assert torch.equal(loss0, loss1) and torch.equal(g0, g1)
    assert errors() == []
    data = load_dump(tmp_path / "d")[0]["data"]
    y0 = m.fc(x)
    assert_record(data["Module.fc.Linear.forward.0"]["output"][0], y0.detach())
    assert_record(data["Module.fc.Linear.forward.1"]["input_args"][0], torch.tanh(y0).detach())
    # backward N pairs with forward N (spec 9, fix 5); parameter gradient = total of both uses
    assert {"Module.fc.Linear.backward.0", "Module.fc.Linear.backward.1"} <= set(data)
    assert_record(data["Module.fc.Linear.parameters_grad"]["weight"][0], g1)
    go = torch.ones(2, 3)
    assert_record(data["Module.fc.Linear.backward.1"]["input"][0], go)


@pytest.mark.parametrize("ctx", ["no_grad", "inference_mode"])
def test_no_grad_and_inference_mode(tmp_path, errors, ctx):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
    x = torch.randn(4, 3)
    expected = m[0](x).detach()
    manager = torch.no_grad if ctx == "no_grad" else torch.inference_mode

    def fn():
        with manager():
            return m(x)

    out, data = record(tmp_path, fn, level="mix", model=m)
    assert torch.equal(out, torch.relu(expected))
    assert errors() == []
    assert_record(data["Module.0.Linear.forward.0"]["output"][0], expected)
    assert data["Module.0.Linear.forward.0"]["output"][0]["requires_grad"] is False
    assert not any(name.endswith("backward") or ".backward." in name for name in data)


class CkptNet(nn.Module):
    def __init__(self, reentrant: bool):
        super().__init__()
        self.reentrant = reentrant
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        return checkpoint(self.b, torch.relu(self.a(x)), use_reentrant=self.reentrant)


@pytest.mark.parametrize("reentrant", [True, False])
def test_activation_checkpointing_flags_recompute(tmp_path, errors, reentrant):
    def run(recorded, sub):
        torch.manual_seed(0)
        m = CkptNet(reentrant)
        x = torch.randn(2, 4, requires_grad=True)
        dbg = PrecisionDebugger(dump_path=str(tmp_path / sub), level="mix") if recorded else None
        if dbg:
            dbg.start(m)
        with set_checkpoint_early_stop(False):
            loss = m(x).sum()
            loss.backward()
        if dbg:
            dbg.stop()
            dbg.step()
            dbg.close()
        return m, x, loss.detach(), [p.grad.clone() for p in m.parameters()] + [x.grad.clone()]

    _, _, loss0, g0 = run(False, "ref")
    m, x, loss1, g1 = run(True, "rec")
    assert torch.equal(loss0, loss1) and all(torch.equal(a, b) for a, b in zip(g0, g1))
    assert errors() == []
    data = load_dump(tmp_path / "rec")[0]["data"]
    recomputed = {k for k, v in data.items() if v.get("is_recompute") is True}
    assert recomputed == {"Module.b.Linear.forward.1", "Functional.linear.2.forward"}
    assert data["Module.b.Linear.forward.0"]["is_recompute"] is False
    assert data["Functional.linear.1.forward"]["is_recompute"] is False
    # the recomputed forward sees the same values as the original one
    orig, again = data["Functional.linear.1.forward"], data["Functional.linear.2.forward"]
    # (reentrant checkpoint re-runs on detached inputs that require grad: only that may differ)
    for key in ("input_args", "output"):
        for a, b in zip(orig[key], again[key]):
            assert {k: v for k, v in a.items() if k != "requires_grad"} == {k: v for k, v in b.items() if k != "requires_grad"}
    assert_record(again["output"][0], m.b(torch.relu(m.a(x))).detach())


def test_in_recompute_is_true_only_inside_checkpoint_recomputation():
    seen = []

    class Probe(nn.Module):
        def forward(self, x):
            seen.append(in_recompute())
            return x.sin()  # saves its input: backward needs the recomputation

    for reentrant in (True, False):
        seen.clear()
        x = torch.randn(3, requires_grad=True)
        with set_checkpoint_early_stop(False):
            y = checkpoint(Probe(), x, use_reentrant=reentrant)
            assert seen == [False]
            y.sum().backward()
        assert seen == [False, True], reentrant
    assert in_recompute() is False


def test_checkpoint_early_stop_leaves_no_partial_entries(tmp_path, errors):
    """With torch's default early stop, recomputation is abandoned (by an exception inside
    torch) as soon as the saved tensors are rebuilt: the interrupted module and API calls
    leave no entry, and nothing else changes."""
    torch.manual_seed(0)
    m = CkptNet(False)
    x = torch.randn(2, 4)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    dbg.start(m)
    m(x).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    assert errors() == []
    data = load_dump(tmp_path / "d")[0]["data"]
    assert not any(v.get("is_recompute") for v in data.values())
    assert "Module.b.Linear.forward.1" not in data and "Functional.linear.2.forward" not in data
    assert {"Module.b.Linear.forward.0", "Module.b.Linear.backward.0", "Functional.linear.1.backward"} <= set(data)


class Noisy(torch.utils.data.Dataset):
    """Each item runs torch operations (recorded APIs) inside the worker."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(4, generator=g)
        for _ in range(20):
            x = torch.relu(x) * 1.01
        return x


def test_dataloader_workers_forked_while_recording(tmp_path, errors):
    def run(recorded):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix") if recorded else None
        loader = torch.utils.data.DataLoader(Noisy(), batch_size=4, num_workers=2,
                                             multiprocessing_context="fork")
        losses = []
        if dbg:
            dbg.start(m)  # workers fork while recording is on
        for x in loader:
            loss = m(x).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        if dbg:
            dbg.stop()
            dbg.step()
            dbg.close()
        return losses, [p.detach().clone() for p in m.parameters()]

    ref, got = run(False), run(True)
    assert all(torch.equal(a, b) for a, b in zip(ref[0] + ref[1], got[0] + got[1]))
    assert errors() == []
    contents = read_log(tmp_path / "d")
    assert contents.skipped == ()  # the workers wrote nothing into the parent's log
    data = load_dump(tmp_path / "d")[0]["data"]
    # the parent's 4 forward passes are there; the workers' relu/mul calls are not
    assert {f"Module.0.Linear.forward.{i}" for i in range(4)} <= set(data)
    assert sum(1 for k in data if k.startswith("Torch.relu.")) == 0
    assert sum(1 for k in data if k.startswith("Functional.relu.") and k.endswith("forward")) == 4


def test_second_thread_runs_the_model(tmp_path, errors):
    def run(recorded):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 1))
        dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix") if recorded else None
        outs = {}

        def work(k):
            outs[k] = m(torch.full((2, 4), float(k))).sum()
            outs[k].backward()

        if dbg:
            dbg.start(m)
        t = threading.Thread(target=work, args=(2,))
        t.start()
        work(1)
        t.join()
        if dbg:
            dbg.stop()
            dbg.step()
            dbg.close()
        return m, outs, [p.grad.clone() for p in m.parameters()]

    _, outs0, g0 = run(False)
    m, outs1, g1 = run(True)
    assert all(torch.equal(outs0[k], outs1[k]) for k in (1, 2))
    # the gradients are a sum of both threads' contributions: compare with a tolerance-free
    # reference only where accumulation order cannot matter (each thread alone is exact)
    assert all(torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(g0, g1))
    assert errors() == []
    data = load_dump(tmp_path / "d")[0]["data"]
    forwards = sorted(k for k in data if k.startswith("Module.0.Linear.forward."))
    assert forwards == ["Module.0.Linear.forward.0", "Module.0.Linear.forward.1"]
    inputs = sorted(data[k]["input_args"][0]["Max"] for k in forwards)
    assert inputs == [1.0, 2.0]  # one entry per thread, each with its own input
    for k in forwards:
        x = torch.full((2, 4), data[k]["input_args"][0]["Max"])
        assert_record(data[k]["output"][0], m[0](x).detach())


def test_inference_tensor_changed_in_place_is_recorded_fresh(tmp_path, errors):
    """Inference tensors have no version counter: statistics are never reused for them."""
    def fn():
        with torch.inference_mode():
            x = torch.ones(4)
            torch.mul(x, 1)   # x recorded as input, Max 1
            x.add_(2)         # in place: x is now 3
            return torch.mul(x, 1)

    out, data = record(tmp_path, fn)
    assert errors() == []
    assert data["Torch.mul.0.forward"]["input_args"][0]["Max"] == 1.0
    assert data["Torch.mul.1.forward"]["input_args"][0]["Max"] == 3.0
    assert torch.equal(out, torch.full((4,), 3.0))


@pytest.mark.parametrize("summary", ["statistics", "md5"])
def test_recorded_tensors_keep_resizable_storage(tmp_path, errors, summary):
    """Recording must not pin a tensor's storage: FSDP frees parameter memory with
    ``untyped_storage().resize_(0)`` (``Tensor.numpy()`` would forbid that for good)."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"task": "statistics", "statistics": {"summary_mode": summary}}))
    tensors = [torch.randn(6), torch.randn(2, 3).to(torch.float16), torch.arange(5), torch.randn(3, 2).t(),
               torch.randn(4, dtype=torch.float64), torch.randn(3, dtype=torch.complex64)]
    dbg = PrecisionDebugger(config_path=str(config), dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    for t in tensors:
        torch.mul(t, 1)
    dbg.stop()
    dbg.step()
    dbg.close()
    assert errors() == []
    data = load_dump(tmp_path / "d")[0]["data"]
    assert_record(data["Torch.mul.0.forward"]["input_args"][0], tensors[0])
    assert_record(data["Torch.mul.3.forward"]["input_args"][0], tensors[3])
    for t in tensors:
        t.untyped_storage().resize_(0)  # raises "not resizable" if msprobe pinned it


def test_write_through_data_alias_between_recordings(tmp_path, errors):
    """A write that bypasses the version counter (``.data``, numpy views, collectives) is
    seen: statistics are never reused from an earlier recording."""
    x = torch.ones(4)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    torch.mul(x, 1)
    dbg.stop()
    x.data.mul_(5)  # not recorded; the alias has its own version counter
    dbg.start()
    torch.mul(x, 1)
    dbg.stop()
    dbg.step()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    assert data["Torch.mul.1.forward"]["input_args"][0]["Max"] == 5.0
