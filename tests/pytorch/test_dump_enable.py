"""config.json ``dump_enable``: the file is re-read at start()/stop()/step() when its
modification time or size changed, so a running job switches recording on and off and
changes level, task, steps and filters; a file that no longer validates keeps the last
good config with one logged error (msprobe.core.reload)."""
from __future__ import annotations

import json
import logging
import os

import torch
import torch.nn.functional as F

from msprobe.core import load_config
from msprobe.core.reload import CHECK_IDLE_S, CHECK_RECORDING_S, ConfigWatcher
from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch import debugger as debugger_mod


class Clock:
    """A monotonic clock the test advances by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _write(path, **doc) -> None:
    """Rewrite the config and move its mtime on (file systems with coarse timestamps)."""
    before = os.stat(path).st_mtime_ns if path.exists() else 0
    path.write_text(json.dumps(doc))
    os.utime(path, ns=(before + 10**9, before + 10**9))


def _base(tmp_path, **extra):
    return {"task": "statistics", "dump_path": str(tmp_path / "d"), "level": "L1", "dump_enable": True, **extra}


def _entries(tmp_path, step):
    path = tmp_path / "d" / f"step{step}" / "rank" / "dump.json"
    return json.loads(path.read_text())["data"] if path.exists() else None


def _steps(dbg, clock, n, advance):
    x = torch.tensor([[-1.0, 2.0], [3.0, -4.0]])
    for _ in range(n):
        dbg.start()
        F.relu(torch.add(x, 1))
        dbg.stop()
        dbg.step()
        clock.now += advance


def test_switch_off_and_on_and_change_filters_without_restart(tmp_path, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(debugger_mod, "ConfigWatcher",
                        lambda *a, **k: ConfigWatcher(*a, clock=clock, **k))
    cfg = tmp_path / "c.json"
    _write(cfg, **_base(tmp_path))
    dbg = PrecisionDebugger(config_path=str(cfg))
    _steps(dbg, clock, 1, CHECK_RECORDING_S)
    assert set(_entries(tmp_path, 0)) == {"Torch.add.0.forward", "Functional.relu.0.forward"}
    _write(cfg, **_base(tmp_path, dump_enable=False))
    _steps(dbg, clock, 2, CHECK_RECORDING_S)           # seen at step 1's start: steps 1, 2 off
    assert _entries(tmp_path, 1) is None and _entries(tmp_path, 2) is None
    _write(cfg, **_base(tmp_path, statistics={"list": ["relu"], "summary_mode": "md5"}))
    _steps(dbg, clock, 1, CHECK_IDLE_S)                # off: looked at after 3 s only
    assert _entries(tmp_path, 3) is None
    _steps(dbg, clock, 1, CHECK_IDLE_S)
    data = _entries(tmp_path, 4)
    assert set(data) == {"Functional.relu.0.forward"}  # the new list and summary_mode
    assert data["Functional.relu.0.forward"]["output"][0]["md5"] is not None
    dbg.close()


def test_level_task_and_steps_change_at_a_step_boundary(tmp_path, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(debugger_mod, "ConfigWatcher", lambda *a, **k: ConfigWatcher(*a, clock=clock, **k))
    cfg = tmp_path / "c.json"
    _write(cfg, **_base(tmp_path))
    dbg = PrecisionDebugger(config_path=str(cfg))
    _steps(dbg, clock, 1, 1.0)
    _write(cfg, **_base(tmp_path, task="tensor", step=[1, 3], tensor={"list": ["relu"]}))
    _steps(dbg, clock, 4, 1.0)  # read at step 0's end: steps 1 and 3 recorded, with tensor files
    assert _entries(tmp_path, 2) is None and _entries(tmp_path, 4) is None
    rec = _entries(tmp_path, 3)["Functional.relu.0.forward"]["output"][0]
    saved = torch.load(tmp_path / "d" / "step3" / "rank" / "dump_tensor_data" / rec["data_name"], weights_only=True)
    assert torch.equal(saved, torch.tensor([[0.0, 3.0], [4.0, 0.0]]))
    dbg.close()


def test_a_reload_after_the_last_step_installs_the_hooks_again(tmp_path, monkeypatch):
    """step() of the last step removes the hooks; a config.json that selects a later step
    puts them back at that step's start()."""
    clock = Clock()
    monkeypatch.setattr(debugger_mod, "ConfigWatcher", lambda *a, **k: ConfigWatcher(*a, clock=clock, **k))
    cfg = tmp_path / "c.json"
    _write(cfg, **_base(tmp_path, step=[0]))
    original = F.relu
    dbg = PrecisionDebugger(config_path=str(cfg))
    _steps(dbg, clock, 2, CHECK_IDLE_S + 1.0)  # step 0 recorded, step 1 past the last step
    assert F.relu is original and _entries(tmp_path, 1) is None
    _write(cfg, **_base(tmp_path, step=[3]))
    _steps(dbg, clock, 3, CHECK_IDLE_S + 1.0)  # read at step 2's start: step 3 recorded
    assert F.relu is original  # removed again after step 3
    assert _entries(tmp_path, 2) is None and _entries(tmp_path, 4) is None
    out = _entries(tmp_path, 3)["Functional.relu.0.forward"]["output"][0]
    assert (out["Max"], out["Min"]) == (4.0, 0.0)  # relu(x + 1) of _steps' x
    dbg.close()


def test_invalid_config_keeps_the_last_good_one_and_logs_once(tmp_path, monkeypatch, caplog):
    clock = Clock()
    monkeypatch.setattr(debugger_mod, "ConfigWatcher", lambda *a, **k: ConfigWatcher(*a, clock=clock, **k))
    cfg = tmp_path / "c.json"
    _write(cfg, **_base(tmp_path))
    dbg = PrecisionDebugger(config_path=str(cfg))
    _write(cfg, **_base(tmp_path, level="L7"))
    with caplog.at_level(logging.ERROR, logger="msprobe"):
        _steps(dbg, clock, 3, 1.0)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "`level`: got 'L7'" in errors[0] and "previous config stays" in errors[0]
    for step in range(3):
        assert set(_entries(tmp_path, step)) == {"Torch.add.0.forward", "Functional.relu.0.forward"}
    # a dump_path change is refused the same way (the log stays where it is)
    _write(cfg, **{**_base(tmp_path), "dump_path": str(tmp_path / "elsewhere")})
    with caplog.at_level(logging.ERROR, logger="msprobe"):
        _steps(dbg, clock, 1, 1.0)
    assert any("`dump_path`" in r.getMessage() for r in caplog.records)
    assert not (tmp_path / "elsewhere").exists()
    dbg.close()


def test_without_dump_enable_the_file_is_not_re_read(tmp_path):
    cfg = tmp_path / "c.json"
    _write(cfg, task="statistics", dump_path=str(tmp_path / "d"), level="L1")
    dbg = PrecisionDebugger(config_path=str(cfg))
    assert dbg._watcher is None
    dbg.close()


def test_watcher_throttles_and_keeps_dump_enable_when_the_key_is_removed(tmp_path):
    clock = Clock()
    cfg = tmp_path / "c.json"
    _write(cfg, **_base(tmp_path, dump_enable=False))
    first = load_config(cfg)
    watcher = ConfigWatcher(str(cfg), lambda: load_config(cfg), first, clock=clock)
    doc = _base(tmp_path, step=[5])
    del doc["dump_enable"]
    _write(cfg, **doc)
    clock.now += CHECK_RECORDING_S
    assert watcher.poll(recording=False) is None        # not yet 3 s
    assert watcher.poll(recording=True) is not None     # 0.5 s while recording
    assert watcher.config.step == (5,) and watcher.config.dump_enable is False
    clock.now += CHECK_IDLE_S
    assert watcher.poll(recording=False) is None        # unchanged file
