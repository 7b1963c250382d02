"""config.json ``extra_info: false``: each step directory holds dump.json only, live and
after ``msprobe export``; dump.json is the same as with stack.json and construct.json."""
from __future__ import annotations

import json

import pytest
import torch

from msprobe.core import ConfigError, load_config
from msprobe.pytorch import PrecisionDebugger
from pt_helpers import ModuleOP
from store import export_log


def _run(tmp_path, name: str, **keys) -> str:
    dump = tmp_path / name
    cfg = tmp_path / f"{name}.json"
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(dump), "level": "mix", **keys}))
    torch.manual_seed(0)
    net = ModuleOP()
    dbg = PrecisionDebugger(config_path=str(cfg))
    for _ in range(2):
        dbg.start(net)
        net(torch.randn(3, 8)).sum().backward()
        dbg.stop()
        dbg.step()
    dbg.close()
    return dump


def test_extra_info_false_writes_dump_json_only(tmp_path):
    off = _run(tmp_path, "off", extra_info=False)
    on = _run(tmp_path, "on")
    for step in (0, 1):
        assert sorted(p.name for p in (off / f"step{step}" / "rank").iterdir()) == ["dump.json"]
        assert sorted(p.name for p in (on / f"step{step}" / "rank").iterdir()) == [
            "construct.json", "dump.json", "stack.json"]
        # the same entries and values, stack.json and construct.json aside
        data_off = json.loads((off / f"step{step}" / "rank" / "dump.json").read_text())
        data_on = json.loads((on / f"step{step}" / "rank" / "dump.json").read_text())
        assert len(data_off["data"]) == 14, list(data_off["data"])
        assert data_off == data_on


def test_offline_export_keeps_extra_info_false(tmp_path):
    off = _run(tmp_path, "off", extra_info=False)
    out = tmp_path / "exported"
    export_log(off, out)
    assert sorted(p.name for p in (out / "step0" / "rank").iterdir()) == ["dump.json"]
    assert (out / "step0" / "rank" / "dump.json").read_text() == (off / "step0" / "rank" / "dump.json").read_text()


def test_extra_info_must_be_a_bool(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"dump_path": str(tmp_path / "d"), "extra_info": "false"}))
    with pytest.raises(ConfigError, match=r"`extra_info`: got 'false'; allowed: true, false"):
        load_config(cfg)
    cfg.write_text(json.dumps({"dump_path": str(tmp_path / "d")}))
    assert load_config(cfg).extra_info is True
