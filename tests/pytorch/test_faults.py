"""Faults during training: disk full (ENOSPC, through the writer's
``_open`` seam), permission lost (EACCES, same seam), an export directory that cannot be
created, and the dump path removed while running. In each case the training finishes with
bit-identical results, msprobe logs exactly one clear error and stops recording, and what
was written before stays readable (``read_log`` and ``msprobe export`` reproduce it).
"""
from __future__ import annotations

import errno
import functools
import json
import logging
import shutil
import time

import pytest
import torch
import torch.nn as nn

import store.log_writer as log_writer_module
from store.export import export_log
from store.log_reader import read_log
from store.log_writer import LogWriter, _open_private
from msprobe.pytorch import PrecisionDebugger
from pt_helpers import train_steps

STEPS = 4


def load_dump(root, step):
    d = root / f"step{step}" / "rank"
    return tuple(json.loads((d / f).read_text()) for f in ("dump.json", "stack.json", "construct.json"))


class FailingFile:
    """A real log file whose writes fail with ``error`` once ``fail`` is set."""

    def __init__(self, path: str, error: OSError) -> None:
        self.raw = _open_private(path)
        self.error = error
        self.fail = False

    def write(self, data):
        if self.fail:
            raise self.error
        return self.raw.write(data)

    def flush(self):
        self.raw.flush()

    def fileno(self):
        return self.raw.fileno()

    def close(self):
        self.raw.close()

    @property
    def closed(self):
        return self.raw.closed


def train(dump_path=None, on_step=None):
    """Train STEPS steps (recorded when ``dump_path`` is given); ``on_step(step)`` runs
    before each step's start(). Returns (losses, parameters)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    dbg = PrecisionDebugger(dump_path=str(dump_path), level="mix") if dump_path else None
    losses = train_steps(model, opt, dbg, STEPS, lambda: torch.randn(4, 6), on_step)
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.fixture(scope="module")
def reference():
    return train()


@pytest.fixture
def errors(caplog):
    caplog.set_level(logging.WARNING, logger="msprobe")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "msprobe" and r.levelno >= logging.ERROR]


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a[0] + a[1], b[0] + b[1]))


def assert_steps_readable(dump, steps, tmp_path):
    """Steps ``steps`` were fully written live, and the log still rebuilds them exactly."""
    contents = read_log(dump)
    assert contents.skipped == ()
    out = tmp_path / "offline"
    export_log(dump, out)
    for step in steps:
        live = load_dump(dump, step)
        assert load_dump(out, step) == live
        assert "Module.3.Linear.backward.0" in live[0]["data"]


@pytest.mark.parametrize("error, words", [
    (OSError(errno.ENOSPC, "No space left on device"), "No space left on device"),
    (PermissionError(errno.EACCES, "Permission denied"), "Permission denied"),
])
def test_write_fault_mid_training(tmp_path, monkeypatch, reference, errors, error, words):
    files = []

    def opener(path):
        files.append(FailingFile(path, error))
        return files[-1]

    monkeypatch.setenv("MSPROBE_WRITER", "inprocess")  # the fault is injected into this process's log writer
    monkeypatch.setattr(log_writer_module, "LogWriter", functools.partial(LogWriter, _open=opener))
    dump = tmp_path / "d"

    def on_step(step):
        if step == 2:
            files[0].fail = True

    assert same(train(dump, on_step), reference)
    logged = errors()
    assert len(logged) == 1, logged
    assert "recording stopped" in logged[0] and words in logged[0] and str(dump) in logged[0]
    assert_steps_readable(dump, (0, 1), tmp_path)
    # nothing of the failed step reached the log; no step after it was started
    steps = set(read_log(dump).table.column("step").to_pylist())
    assert steps <= {-1, 0, 1}
    assert not (dump / "step3").exists()


def test_write_fault_in_the_flush_timer(tmp_path, monkeypatch, reference, errors):
    """The log writer's flush timer hits a full disk in the middle of step 2, while the
    training computes and nothing is appended: the next call into the writer raises the
    fault, msprobe logs one error and stops recording, and the training is unchanged."""
    files, writers = [], []

    def opener(path):
        files.append(FailingFile(path, OSError(errno.ENOSPC, "No space left on device")))
        return files[-1]

    def make_writer(*args, **kwargs):
        writers.append(LogWriter(*args, flush_interval_s=0.05, _open=opener, **kwargs))
        return writers[-1]

    monkeypatch.setenv("MSPROBE_WRITER", "inprocess")  # the fault is injected into this process's log writer
    monkeypatch.setattr(log_writer_module, "LogWriter", make_writer)
    dump = tmp_path / "d"
    hit = []

    def stall_once(module, args, output):  # a global forward hook: runs after rows are queued
        if not hit:
            hit.append(True)
            files[0].fail = True
            deadline = time.monotonic() + 20
            while not writers[0].failed and time.monotonic() < deadline:
                time.sleep(0.01)

    def on_step(step):
        if step == 2:
            handles.append(torch.nn.modules.module.register_module_forward_hook(stall_once))

    handles = []
    try:
        assert same(train(dump, on_step), reference)
    finally:
        for handle in handles:
            handle.remove()
    assert hit and writers[0].failed
    logged = errors()
    assert len(logged) == 1, logged
    assert "recording stopped" in logged[0] and "No space left on device" in logged[0]
    assert_steps_readable(dump, (0, 1), tmp_path)
    assert not (dump / "step3").exists()


def test_export_directory_cannot_be_created(tmp_path, reference, errors):
    dump = tmp_path / "d"

    def on_step(step):
        if step == 1:
            (dump / "step1").write_text("a file where msprobe needs a directory")

    assert same(train(dump, on_step), reference)
    logged = errors()
    assert len(logged) == 1 and "recording stopped" in logged[0], logged
    assert_steps_readable(dump, (0,), tmp_path)
    assert (dump / "step1").read_text() == "a file where msprobe needs a directory"


def test_dump_path_removed_while_running(tmp_path, reference, errors):
    dump = tmp_path / "d"

    def on_step(step):
        if step == 2:
            shutil.rmtree(dump)

    assert same(train(dump, on_step), reference)
    logged = errors()
    assert len(logged) == 1, logged
    assert "deleted while being written" in logged[0]
    # msprobe did not recreate the dump path with a log-less dump
    assert not (dump / "step2" / "rank" / "dump.json").exists()
    assert not (dump / "step3").exists()


def test_value_that_cannot_be_described_is_recorded_as_such(tmp_path, monkeypatch, reference, errors):
    """A non-tensor argument whose description fails is recorded as ``<unrecordable>``;
    training and the rest of the recording go on."""
    from msprobe.pytorch import leaves as leaves_module

    def broken(obj):
        raise RuntimeError("cannot describe this value")

    monkeypatch.setattr(leaves_module, "value_record", broken)
    assert same(train(tmp_path / "d"), reference)
    assert errors() == []
    data = load_dump(tmp_path / "d", STEPS - 1)[0]["data"]
    args = data["Functional.layer_norm.0.forward"]["input_args"]
    assert args[1] == [{"type": "int", "value": "<unrecordable>"}]  # normalized_shape (8,)
    assert args[4] == {"type": "float", "value": "<unrecordable>"}  # eps
    assert data["Functional.layer_norm.0.forward"]["output"][0]["shape"] == [4, 8]


def test_internal_error_at_step_end_never_reaches_training(tmp_path, monkeypatch, errors):
    """An internal error while step() settles the pending backward entries (of a forward
    whose backward never ran) is logged once and stops recording; step() returns and the
    step counter advances."""
    from msprobe.pytorch.backward import BackwardTaps

    def broken(self, pending):
        raise RuntimeError("settle failed")

    monkeypatch.setattr(BackwardTaps, "settle", broken)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
    x = torch.randn(4, 6)
    expected = model(x).detach()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    try:
        dbg.start(model)
        out = model(x)  # recorded, with backward taps; no backward follows
        dbg.stop()
        dbg.step()  # settles the pending entries: the fault
        assert torch.equal(out.detach(), expected)
        assert dbg.session.step == 1 and dbg.session.disabled
        assert [m for m in errors() if "settle failed" in m] and len(errors()) == 1
        dbg.start(model)  # recording stays off; training goes on
        assert torch.equal(model(x).detach(), expected)
        dbg.stop()
        dbg.step()
        assert len(errors()) == 1
    finally:
        dbg.close()
