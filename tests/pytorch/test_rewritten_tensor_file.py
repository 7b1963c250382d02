"""A tensor file rewritten within its step (a parameter gradient accumulated over two
start()/stop() windows: the file holds the last value) is no longer the file of its
earlier payload: a later tensor with the earlier bytes (here the next step's gradient,
equal to the first window's) must not be hard-linked to it."""
from __future__ import annotations

import json

import torch

from msprobe.pytorch import PrecisionDebugger


def _grad_file(root, step):
    d = root / f"step{step}" / "rank"
    data = json.loads((d / "dump.json").read_text())["data"]
    rec = data["Module.model.Linear.parameters_grad"]["weight"]
    rec = rec[0] if isinstance(rec, list) else rec
    return rec, torch.load(d / "dump_tensor_data" / rec["data_name"], weights_only=True)


def test_next_step_file_not_linked_to_rewritten_file(tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2, bias=False)
    x = torch.randn(4, 3)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0", task="tensor")

    def window():
        dbg.start(model=m)
        m(x).sum().backward()
        dbg.stop()

    window()
    g1 = m.weight.grad.clone()
    window()  # accumulated: 2 * g1, the step's file is rewritten
    g2 = m.weight.grad.clone()
    dbg.step()
    m.weight.grad = None
    window()  # g1's bytes again
    dbg.step()
    dbg.close()
    rec0, t0 = _grad_file(tmp_path / "d", 0)
    rec1, t1 = _grad_file(tmp_path / "d", 1)
    assert torch.equal(t0, g2) and rec0["Max"] == float(g2.max())
    assert torch.equal(t1, g1) and rec1["Max"] == float(g1.max())
