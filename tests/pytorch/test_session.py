"""start/stop/step semantics, the step filter, export and query over a real recording."""
from __future__ import annotations

import json
import logging
import os
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


@pytest.mark.parametrize("first_recording", [False, True])
def test_second_debugger_records_only_outermost_calls(tmp_path, first_recording):
    """A debugger left open (stopped, or recording too) beneath a second one: inside
    ``F.batch_norm`` neither records ``torch.batch_norm`` (only the outermost API call is
    recorded); both record ``F.batch_norm`` with the statistics of its input."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
    x = torch.randn(2, 1, 4, 4)
    a = PrecisionDebugger(dump_path=str(tmp_path / "a"), level="L1")
    a.start()
    if not first_recording:
        a.stop()
    b = PrecisionDebugger(dump_path=str(tmp_path / "b"), level="mix")
    b.start(m)
    conv_out = m[0](x)
    m[1](conv_out).sum().backward()
    b.stop()
    b.close()
    a.stop()
    a.close()
    names_b = set(load_dump(tmp_path / "b")[0]["data"])
    assert "Functional.batch_norm.0.forward" in names_b and "Module.1.BatchNorm2d.forward.0" in names_b
    assert not any(n.startswith("Torch.batch_norm") for n in names_b)
    dumps = [load_dump(tmp_path / "b")[0]["data"]]
    if first_recording:
        names_a = set(load_dump(tmp_path / "a")[0]["data"])
        assert "Functional.batch_norm.0.forward" in names_a
        assert not any(n.startswith("Torch.batch_norm") for n in names_a)
        dumps.append(load_dump(tmp_path / "a")[0]["data"])
    want = conv_out.detach().double()
    for data in dumps:
        got = data["Functional.batch_norm.0.forward"]["input_args"][0]
        assert got["Max"] == pytest.approx(want.max().item(), rel=1e-6)
        assert got["Min"] == pytest.approx(want.min().item(), rel=1e-6)
        assert got["Norm"] == pytest.approx(want.norm().item(), rel=1e-6)


def _earlier_run_warning(dump: Path, count: int) -> str:
    logs, beside = ("1 earlier log", "it") if count == 1 else (f"{count} earlier logs", "them")
    return (f"msprobe: dump_path {str(dump)!r} already holds {logs} of rank 0 (written by another "
            f"process, e.g. a previous run); this run's log is added beside {beside}: the SQL views "
            "(msprobe query: both runs' rows side by side), msprobe "
            "export and msprobe compare will include the earlier run's rows, "
            "while the step directories show only the newest run. Use a new dump_path, or delete the "
            "old one.")


def _as_written_by(dump: Path, rank: int, pid: int) -> None:
    """Rename this process's logs under ``dump`` as if process ``pid`` of ``rank`` wrote them."""
    for path in (dump / ".msprobe" / "log").glob(f"rank0.{os.getpid()}.*.arrows"):
        time_ns = path.name.split(".")[2]
        path.rename(path.with_name(f"rank{rank}.{pid}.{time_ns}.arrows"))


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "msprobe" and r.levelno >= logging.WARNING]


def test_rerun_into_the_same_dump_path_warns_once(tmp_path, caplog):
    """A second run (another process) recording rank 0 into a dump path that holds an
    earlier rank-0 log: one warning naming the path, the count and what mixes."""
    caplog.set_level(logging.WARNING, logger="msprobe")
    dump = tmp_path / "d"
    train(tmp_path, steps=1)
    assert _warnings(caplog) == []                           # a fresh dump path
    _as_written_by(dump, 0, os.getpid() + 1)
    train(tmp_path, steps=2)
    assert _warnings(caplog) == [_earlier_run_warning(dump, 1)]   # once, not per step
    caplog.clear()
    _as_written_by(dump, 0, os.getpid() + 2)
    train(tmp_path, steps=1)
    assert _warnings(caplog) == [_earlier_run_warning(dump, 2)]


def test_no_earlier_run_warning_for_other_ranks_or_this_process(tmp_path, caplog):
    """Other ranks' logs (a distributed run shares the dump path) and this process's own
    earlier log (a debugger closed and created again) are no earlier run."""
    caplog.set_level(logging.WARNING, logger="msprobe")
    dump = tmp_path / "d"
    train(tmp_path, steps=1)
    _as_written_by(dump, 1, os.getpid() + 1)                 # rank 1 of another process
    train(tmp_path, steps=1)
    train(tmp_path, steps=1)                                 # rank 0 of this process
    assert len(list((dump / ".msprobe" / "log").glob("rank0.*.arrows"))) == 2
    assert _warnings(caplog) == []


def test_earlier_run_check_never_stops_recording(tmp_path, caplog, monkeypatch):
    import msprobe.core.session as session_mod

    def broken(*_a, **_k):
        raise OSError("unreadable")

    caplog.set_level(logging.WARNING, logger="msprobe")
    monkeypatch.setattr(session_mod, "other_process_logs", broken)
    train(tmp_path, steps=2)
    assert _warnings(caplog) == []
    assert "Module.linear_1.Linear.forward.0" in load_dump(tmp_path / "d", step=1)[0]["data"]


@pytest.mark.parametrize("stop_first", [False, True])
def test_backward_after_close_is_not_an_error(tmp_path, caplog, stop_first):
    """A graph built while recording, its backward run after ``close()``: nothing is written
    after close, no error is logged, and the gradients equal an unrecorded run's."""
    def run(record):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
        x = torch.randn(5, 4)
        dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix") if record else None
        if dbg:
            dbg.start(m)
        loss = m(x).sum()
        if dbg:
            if stop_first:
                dbg.stop()
            dbg.close()
        loss.backward()
        return [p.grad.clone() for p in m.parameters()]

    want = run(False)
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        got = run(True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
