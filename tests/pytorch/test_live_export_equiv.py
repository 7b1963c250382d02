"""Live (incremental) export vs export_log over the same log: byte-identical files."""
import json
import os

import pytest
import torch

from pt_helpers import ModuleOP
from msprobe.pytorch import PrecisionDebugger
from store.export import export_log


def _files(root):
    out = {}
    for d, _, fs in os.walk(root):
        for f in fs:
            if f.endswith(".json"):
                p = os.path.join(d, f)
                out[os.path.relpath(p, root)] = open(p, "rb").read()
    return out


@pytest.mark.parametrize("async_dump,summary", [(False, "statistics"), (True, "statistics"), (False, "md5")])
def test_live_equals_offline(tmp_path, async_dump, summary):
    dump = tmp_path / "d"
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(dump), "level": "mix",
                               "async_dump": async_dump, "statistics": {"summary_mode": summary}}))
    torch.manual_seed(0)
    m = ModuleOP()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    dbg = PrecisionDebugger(config_path=str(cfg))
    for i in range(2):
        dbg.start(model=m)
        for micro in range(2):                       # grad accumulation: parameters_grad merged
            out = m(torch.randn(4, 8))
            if micro == 0:
                out.sum().backward()
        dbg.stop()
        out.sum().backward()                          # backward after stop()
        opt.step(); opt.zero_grad()
        dbg.step()
    dbg.close()
    live = _files(dump)
    export_log(dump, tmp_path / "re")
    offline = _files(tmp_path / "re")
    assert sorted(live) == sorted(offline)
    for k in live:
        assert live[k] == offline[k], k
