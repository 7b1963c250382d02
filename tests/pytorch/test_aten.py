"""The Aten family: ``torch.ops.aten`` operators called from Python (spec 2.1, 7.1, 8 item 26,
9 fixes 26-29). Names are written out by hand; statistics recomputed with numpy float64."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import torch

from pt_helpers import load_dump
from msprobe.pytorch import PrecisionDebugger

ROOT = Path(__file__).resolve().parents[2]


def _debugger(tmp_path, ops_yaml: str, task: str = "statistics") -> PrecisionDebugger:
    own = tmp_path / "ops.yaml"
    own.write_text(ops_yaml)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": task, "dump_path": str(tmp_path / "dump"), "level": "L1",
                               "api_list": str(own)}))
    return PrecisionDebugger(config_path=str(cfg))


def _np_stats(a: np.ndarray) -> dict:
    a = a.astype(np.float64)
    return {"Max": float(a.max()), "Min": float(a.min()), "Mean": float(a.mean()),
            "Norm": float(np.sqrt((a * a).sum()))}


def test_aten_names_stats_internal_dispatch_and_close(tmp_path):
    packet = torch.ops.aten.add
    dbg = _debugger(tmp_path, "aten:\n  - add\n  - mm\n")
    a_np = np.array([1.0, -2.0, 3.5], dtype=np.float32)
    b_np = np.array([0.5, 4.0, -1.0], dtype=np.float32)
    x_np = np.arange(6, dtype=np.float32).reshape(2, 3)
    y_np = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    a, b, x, y = map(torch.from_numpy, (a_np, b_np, x_np, y_np))
    dbg.start()
    assert isinstance(torch.ops.aten.add, torch._ops.OpOverloadPacket)      # proxy passes isinstance
    assert isinstance(torch.ops.aten.add.Tensor, torch._ops.OpOverload)
    assert {torch.ops.aten.add.Tensor: 1}[packet.Tensor] == 1                 # hashes/compares as the real op
    s = torch.ops.aten.add.Tensor(a, b)
    m = torch.ops.aten.mm(x, y)
    torch.add(a, b)          # reaches aten::add.Tensor inside C++: not recorded
    torch.mm(x, y)
    x @ y
    dbg.stop()
    dbg.close()
    assert torch.ops.aten.add is packet and type(torch.ops.aten.add) is torch._ops.OpOverloadPacket
    data = load_dump(tmp_path / "dump")[0]["data"]
    assert set(data) == {"Aten.add.Tensor.0.forward", "Aten.mm.0.forward"}
    add = data["Aten.add.Tensor.0.forward"]
    assert [add["input_args"][0][k] for k in ("type", "dtype", "shape")] == ["torch.Tensor", "torch.float32", [3]]
    for rec, arr in ((add["input_args"][0], a_np), (add["input_args"][1], b_np), (add["output"][0], a_np + b_np)):
        for k, v in _np_stats(arr).items():     # float32 tensor: statistics agree to float32 precision
            assert abs(rec[k] - v) <= 1e-6 * max(1.0, abs(v)), (k, rec[k], v)
    mm = data["Aten.mm.0.forward"]
    expected = x_np.astype(np.float64) @ y_np.astype(np.float64)
    got = mm["output"][0]
    assert mm["output"][0]["shape"] == [2, 4]
    for k, v in _np_stats(expected).items():
        assert abs(got[k] - v) <= 1e-5 * max(1.0, abs(v))
    assert torch.equal(m, x @ y) and torch.equal(s, a + b)
    # after close() the proxies that escaped pass calls straight through (nothing recorded, no error)
    assert torch.equal(torch.ops.aten.add.Tensor(a, b), a + b)


def test_lazy_dynamo_import_under_aten_hooks(tmp_path):
    """Upstream crashed here with KeyError: AtenOPTemplate(): optimizer.step() and
    torch.utils.checkpoint import torch._dynamo lazily while aten ops are wrapped."""
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(ROOT)!r})
        import torch
        from torch.utils.checkpoint import checkpoint
        from msprobe.pytorch import PrecisionDebugger
        assert "torch._dynamo" not in sys.modules, "test needs torch._dynamo not yet imported"
        import yaml
        from msprobe.pytorch.api_hooks import DEFAULT_API_LIST
        doc = yaml.safe_load(open(DEFAULT_API_LIST))
        assert doc["aten"] == []       # opt-in: the packaged list ships the family empty
        doc["aten"] = [n for n in doc["torch"] if isinstance(getattr(torch.ops.aten, n, None), torch._ops.OpOverloadPacket)]
        assert len(doc["aten"]) > 500
        ops = {str(tmp_path / "ops.yaml")!r}
        yaml.safe_dump(doc, open(ops, "w"))
        cfg = {str(tmp_path / "config.json")!r}
        json.dump({{"task": "statistics", "dump_path": {str(tmp_path / "dump")!r}, "level": "L1",
                   "api_list": ops}}, open(cfg, "w"))
        dbg = PrecisionDebugger(config_path=cfg)   # packaged list with every aten example uncommented
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        dbg.start()
        x = torch.randn(3, 4, requires_grad=True)
        model(x).sum().backward()
        opt.step()
        out = checkpoint(model, x, use_reentrant=False)
        out.sum().backward()
        torch.ops.aten.mul.Tensor(out, 2.0)
        dbg.stop()
        dbg.close()
        print("DYNAMO", "torch._dynamo" in sys.modules)
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "DYNAMO True" in proc.stdout     # the lazy import did happen while hooks were installed
    data = load_dump(tmp_path / "dump")[0]["data"]
    assert "Aten.mul.Tensor.0.forward" in data
