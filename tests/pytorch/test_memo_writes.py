"""The statistics memo across API calls: entries survive calls that only read their
arguments and are forgotten by calls that may write them (msprobe.pytorch.mutation).
Recorded values are checked against numpy float64 over the tensor as it was recorded."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pt_helpers import load_dump
from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch.mutation import READS, WRITES_ANY, WRITES_ARGS, WriteRule
from msprobe.pytorch.stats_memo import StatsMemo


def _assert_stats(rec: dict, t: torch.Tensor) -> None:
    a = t.detach().to(torch.float64).numpy()
    assert (rec["Max"], rec["Min"]) == (a.max(), a.min())
    assert rec["Mean"] == pytest.approx(a.mean(), rel=1e-6, abs=1e-7)
    assert rec["Norm"] == pytest.approx(math.sqrt(float((a * a).sum())), rel=1e-6)


@pytest.mark.parametrize("name, args, kwargs, expected", [
    ("linear", (), {}, READS),
    ("add_", (), {}, WRITES_ARGS),
    ("_foreach_mul_", (), {}, WRITES_ARGS),
    ("__iadd__", (), {}, WRITES_ARGS),
    ("__setitem__", (), {}, WRITES_ARGS),
    ("__add__", (), {}, READS),
    ("exp", (), {"out": torch.empty(1)}, WRITES_ARGS),
    ("exp", (), {"out": None}, READS),
])
def test_write_rules_by_name_and_out(name, args, kwargs, expected):
    assert WriteRule("Torch", name, None).check(args, kwargs) == expected


def test_write_rules_inplace_parameter_and_aten():
    relu = WriteRule("Functional", "relu", F.relu)  # relu(input, inplace=False)
    x = torch.randn(3)
    assert relu.check((x,), {}) == READS
    assert relu.check((x, True), {}) == WRITES_ARGS
    assert relu.check((x, False), {}) == READS
    assert relu.check((x,), {"inplace": True}) == WRITES_ARGS
    drop = WriteRule("Functional", "dropout", F.dropout)  # dropout(input, p, training, inplace)
    assert drop.check((x, 0.1, True), {}) == READS
    assert drop.check((x, 0.1, True, 1), {}) == WRITES_ARGS
    assert WriteRule("Aten", "mul.Tensor", None).check((x,), {}) == WRITES_ANY


def test_release_forgets_shared_storage_only_and_parameters_stay():
    memo = StatsMemo(enabled=True, limit=2)
    x, y = torch.randn(8), torch.randn(8)
    p = torch.nn.Parameter(torch.randn(4))
    memo.put(p, "sp")
    memo.put(x, "sx")
    memo.put(y, "sy")
    memo.release((x.data[2:], 3.0), {"alpha": 2})  # a view of x's storage through .data
    assert (memo.get(x), memo.get(y), memo.get(p)) == (None, "sy", "sp")
    for i in range(5):  # non-parameter entries are limited; parameters are not
        memo.put(torch.randn(3), i)
    assert memo.get(p) == "sp" and memo.get(y) is None
    memo.release(([y, p], {"k": (p,)}), {})
    assert memo.get(p) is None
    memo.put(p, "sp")
    memo.release((object(),), {})  # not a plain value: everything is forgotten
    assert len(memo) == 0


@pytest.mark.parametrize("data_mode", ["all", "input"])
def test_residual_input_reused_across_calls_and_alias_writes_seen(tmp_path, data_mode):
    """h is recorded as sigmoid's input and again as __add__'s input two calls later (a
    residual branch): reused. A write through h.data by an in-place call in between (by name, positional
    inplace=True, out=) is seen, also when the writing call's output is not recorded
    (data_mode input: nothing replaces the stale entry)."""
    import json
    torch.manual_seed(7)
    x = torch.randn(64, 96)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "statistics", "level": "L1", "dump_path": str(tmp_path / "d"),
                               "statistics": {"data_mode": [data_mode]}}))
    dbg = PrecisionDebugger(config_path=str(cfg))
    dbg.start()
    memo = dbg.recorder.leaves.memo
    h = torch.exp(x)
    torch.sigmoid(h)
    a = torch.tanh(h)
    hits = memo.hits
    r = h + a                                   # h: same memory, same version: reused
    assert memo.hits > hits
    h_seen = [h.clone()]
    g = torch.sin(h)
    h.data.mul_(-3)                             # Tensor.mul_ on an alias with its own counter
    r2 = h * 2                                  # must see the new values
    h_seen.append(h.clone())
    g2 = torch.cos(h)
    F.relu(h.data, True)                        # positional inplace=True
    r3 = h - 1
    h_seen.append(h.clone())
    g3 = torch.tan(h)
    torch.exp(g3.data, out=g3.data)             # out= through an alias
    r4 = g3 + 0.5
    dbg.stop()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    _assert_stats(data["Tensor.__add__.0.forward"]["input_args"][0], h_seen[0])
    _assert_stats(data["Tensor.__mul__.0.forward"]["input_args"][0], h_seen[1])
    _assert_stats(data["Tensor.__sub__.0.forward"]["input_args"][0], h_seen[2])
    _assert_stats(data["Tensor.__add__.1.forward"]["input_args"][0], g3)
    assert np.isfinite([r.sum().item(), r2.sum().item(), r3.sum().item(), r4.sum().item(), g.sum().item(),
                        g2.sum().item()]).all()


@pytest.mark.usefixtures("memo_all_sizes")
@pytest.mark.parametrize("level", ["L1", "mix"])
def test_optimizer_step_reuses_parameter_statistics(tmp_path, level):
    """A weight recorded as F.linear's input is recorded again by the optimizer's in-place
    update (Tensor.add_): the statistics are reused while the weight is unchanged, and the
    update of one parameter does not make the others' statistics stale. At mix the
    gradients recorded as parameters_grad are reused by the update too."""
    torch.manual_seed(8)
    layers = [torch.nn.Linear(32, 32) if i % 2 == 0 else torch.nn.Tanh() for i in range(20)]
    net = torch.nn.Sequential(*layers)  # more records in backward than the memo holds tensors
    opt = torch.optim.SGD(net.parameters(), lr=0.1, foreach=False)
    x = torch.randn(16, 32)
    before = [p.detach().clone() for p in net.parameters()]
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level=level, model=net)
    dbg.start()
    memo = dbg.recorder.leaves.memo
    net(x).square().mean().backward()
    grads = [p.grad.clone() for p in net.parameters()]
    hits = memo.hits
    opt.step()
    reused = memo.hits - hits
    assert reused >= len(before) * (2 if level == "mix" else 1)
    dbg.stop()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    updates = [data[f"Tensor.add_.{i}.forward"] for i in range(len(before))]
    for rec, p0, g in zip(updates, before, grads):
        _assert_stats(rec["input_args"][0], p0)
        _assert_stats(rec["input_args"][1], g)


def test_memo_bounds_the_bytes_it_keeps_alive(monkeypatch):
    """Non-parameter tensors are held up to MAX_BYTES of storage (a larger one is not
    remembered at all); parameters do not count."""
    import msprobe.pytorch.stats_memo as memo_mod

    monkeypatch.setattr(memo_mod, "MAX_BYTES", 1000)
    memo = StatsMemo(enabled=True, limit=16)
    huge = torch.randn(300)                    # 1200 bytes > 1000
    memo.put(huge, "huge")
    assert memo.get(huge) is None and len(memo) == 0
    a, b, c = torch.randn(100), torch.randn(100), torch.randn(100)  # 400 bytes each
    p = torch.nn.Parameter(torch.randn(1000))
    memo.put(p, "p")
    memo.put(a, "a")
    memo.put(b, "b")
    memo.put(c, "c")                           # 1200 bytes: a (the oldest) goes
    assert (memo.get(a), memo.get(b), memo.get(c), memo.get(p)) == (None, "b", "c", "p")
    view = torch.randn(250)[:10]               # a view keeps its whole 1000-byte storage alive
    memo.put(view, "v")
    assert (memo.get(b), memo.get(c), memo.get(view)) == (None, None, "v")


def test_layout_free_keys_match_dense_views_of_the_same_memory():
    memo = StatsMemo(enabled=True)
    memo.layout_free = True
    x = torch.randn(5, 4)
    memo.put(x, "sx")
    assert memo.get(x.view(20)) == "sx" and memo.get(x.t()) == "sx" and memo.get(x.permute(1, 0)) == "sx"
    assert memo.get(x[:, :2]) is None           # a gap: other elements
    assert memo.get(x[1:]) is None              # another block
    assert memo.get(x.view(torch.int32)) is None
    assert memo.get(torch.randn(4).expand(5, 4)) is None
    strict = StatsMemo(enabled=True)            # summary_mode md5: layouts must match exactly
    strict.put(x, "sx")
    assert strict.get(x.t()) is None and strict.get(x.view(20)) is None


@pytest.mark.parametrize("summary_mode", ["statistics", "md5"])
def test_transposed_and_reshaped_views_recorded_with_their_own_values(tmp_path, summary_mode):
    """y.t() and y.reshape(-1) of a recorded y: statistics reused (equal to numpy float64 of
    the views' values); with md5 each view's CRC-32 is that of its own C-order bytes."""
    import json
    import zlib
    torch.manual_seed(9)
    x = torch.randn(96, 80)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "statistics", "level": "L1", "dump_path": str(tmp_path / "d"),
                               "statistics": {"summary_mode": summary_mode}}))
    dbg = PrecisionDebugger(config_path=str(cfg))
    dbg.start()
    memo = dbg.recorder.leaves.memo
    y = torch.exp(x)
    hits = memo.hits
    z = y.t()
    w = torch.tanh(z)
    flat = y.reshape(-1)
    if summary_mode == "statistics":
        assert memo.hits - hits >= 4  # t() input/output, tanh input, reshape input/output
    dbg.stop()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    for rec, t in ((data["Tensor.t.0.forward"]["output"][0], z),
                   (data["Torch.tanh.0.forward"]["input_args"][0], z),
                   (data["Tensor.reshape.0.forward"]["output"][0], flat)):
        _assert_stats(rec, t)
        if summary_mode == "md5":
            crc = zlib.crc32(t.contiguous().numpy().tobytes()) & 0xFFFFFFFF
            assert rec["md5"] == format(crc, "08x")
    assert w.shape == (80, 96)
