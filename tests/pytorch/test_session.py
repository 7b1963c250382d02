"""start/stop/step semantics, the step filter, export and query over a real recording."""
from __future__ import annotations

import filecmp
import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from pt_helpers import ModuleOP, load_dump
from msprobe.cli import main as cli_main
from msprobe.core.errors import ConfigError
from msprobe.pytorch import PrecisionDebugger
from store.query import query


def train(tmp_path, steps=3, level="mix", step_filter=None, record=True):
    torch.manual_seed(0)
    m = ModuleOP()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level=level, step=step_filter) if record else None
    losses = []
    for i in range(steps):
        x = torch.randn(10, 8)
        if dbg:
            dbg.start(m)
        loss = m(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if dbg:
            dbg.stop()
            dbg.step()
        losses.append(loss.item())
    if dbg:
        dbg.close()
    return losses, m


def test_steps_and_counters_reset(tmp_path):
    train(tmp_path, steps=3)
    for s in range(3):
        data = load_dump(tmp_path / "d", step=s)[0]["data"]
        assert "Functional.linear.0.forward" in data and "Functional.linear.2.forward" not in data


def test_step_filter(tmp_path):
    train(tmp_path, steps=4, step_filter=[1, "3-5"])
    dirs = sorted(p.name for p in (tmp_path / "d").glob("step*"))
    assert dirs == ["step1", "step3"]


def test_stop_before_backward_then_step(tmp_path):
    torch.manual_seed(0)
    m = ModuleOP()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    dbg.start(m)
    loss = m(torch.randn(10, 8)).sum()
    dbg.stop()
    after_stop = load_dump(tmp_path / "d")[0]["data"]
    assert not any(k.endswith("backward") or ".backward." in k for k in after_stop)
    loss.backward()
    torch.relu(torch.ones(2))  # forward after stop(): not recorded
    dbg.step()
    data = load_dump(tmp_path / "d")[0]["data"]
    assert "Functional.linear.0.backward" in data
    assert "Module.linear_1.Linear.backward.0" in data
    assert data["Module.linear_1.Linear.parameters_grad"]["weight"][0] is not None
    assert not any(k.startswith("Torch.relu") for k in data)
    dbg.close()


def test_recording_changes_nothing(tmp_path):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 32)
            self.attn = nn.MultiheadAttention(32, 4, dropout=0.1, batch_first=True)
            self.norm = nn.LayerNorm(32)
            self.drop = nn.Dropout(0.2)
            self.head = nn.Linear(32, 50)

        def forward(self, t):
            h = self.emb(t)
            a, _ = self.attn(h, h, h, need_weights=False)
            h = self.norm(h + self.drop(a))
            return self.head(h)

    def run(level):
        torch.manual_seed(123)
        net = Net()
        opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
        dbg = PrecisionDebugger(dump_path=str(tmp_path / f"d_{level}"), level=level) if level else None
        losses = []
        for _ in range(3):
            t = torch.randint(0, 50, (4, 16))
            if dbg:
                dbg.start(net)
            logits = net(t)
            loss = nn.functional.cross_entropy(logits.reshape(-1, 50), t.reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            if dbg:
                dbg.stop()
                dbg.step()
            losses.append(loss.detach().clone())
        if dbg:
            dbg.close()
        return losses, [p.detach().clone() for p in net.parameters()]

    ref_losses, ref_params = run(None)
    for level in ("L0", "L1", "mix"):
        losses, params = run(level)
        assert all(torch.equal(a, b) for a, b in zip(losses, ref_losses)), level
        assert all(torch.equal(a, b) for a, b in zip(params, ref_params)), level
    data = load_dump(tmp_path / "d_mix", step=2)[0]["data"]
    assert "Module.attn.MultiheadAttention.forward.0" in data
    assert any(k.startswith("Functional.multi_head_attention_forward.0") for k in data)


def test_export_reproduces_live_layout(tmp_path):
    train(tmp_path, steps=2)
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "d" / ".msprobe", copy / ".msprobe")
    assert cli_main(["export", str(copy)]) == 0
    for s in range(2):
        live, rebuilt = tmp_path / "d" / f"step{s}" / "rank", copy / f"step{s}" / "rank"
        for f in ("dump.json", "stack.json", "construct.json"):
            assert (live / f).read_bytes() == (rebuilt / f).read_bytes(), f


def test_query_counts_agree(tmp_path):
    train(tmp_path, steps=2)
    rows = query(tmp_path / "d", "SELECT step, count(*) AS n FROM calls GROUP BY step ORDER BY step").to_pylist()
    expected = [{"step": s, "n": len(load_dump(tmp_path / "d", step=s)[0]["data"])} for s in range(2)]
    assert rows == expected
    t = query(tmp_path / "d", "SELECT norm FROM tensors WHERE step = 0 AND name = 'Functional.relu.0.forward' AND io = 'output'")
    rec = load_dump(tmp_path / "d")[0]["data"]["Functional.relu.0.forward"]["output"][0]
    assert t.column("norm").to_pylist() == [rec["Norm"]]


@pytest.mark.parametrize("doc,field", [
    ({"level": "L9"}, "level"),
    ({"step": [-1]}, "step"),
    ({"rank": 0}, "rank"),
])
def test_bad_config_errors(tmp_path, doc, field):
    cfg = {"task": "statistics", "dump_path": str(tmp_path / "d"), **doc}
    p = tmp_path / "c.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=field) as info:
        PrecisionDebugger(config_path=str(p))
    assert info.value.field.endswith(field)


def test_dump_path_parent_cannot_be_created(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="dump_path"):
        PrecisionDebugger(dump_path=str(blocker / "sub" / "dump"))


def test_two_debuggers_share_nothing(tmp_path):
    a = PrecisionDebugger(dump_path=str(tmp_path / "a"), level="L1")
    b = PrecisionDebugger(dump_path=str(tmp_path / "b"), level="L1")
    a.start()
    torch.relu(torch.ones(3))
    a.stop()
    b.start()
    torch.tanh(torch.ones(3))
    b.stop()
    a.close()
    b.close()
    assert set(load_dump(tmp_path / "a")[0]["data"]) == {"Torch.relu.0.forward"}
    assert set(load_dump(tmp_path / "b")[0]["data"]) == {"Torch.tanh.0.forward"}
