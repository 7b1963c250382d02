"""Compare reads a backward entry written again after a later backward pass (the sum over
the passes, docs/pytorch.md) by its last values, as dump.json holds it: two identical
runs with ``backward(retain_graph=True)`` and a second backward are identical, and a run
whose second loss differs diverges with the error of the summed gradients."""
from __future__ import annotations

import json

import numpy as np
import torch
import torch.nn as nn

import msprobe.compare as C
from msprobe.pytorch import PrecisionDebugger


def _record(path, factor: float):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 1))
    x = torch.randn(3, 4)
    dbg = PrecisionDebugger(dump_path=str(path), level="mix", model=net)
    dbg.start()
    y = net(x)
    y.square().sum().backward(retain_graph=True)
    (torch.sin(y) * factor).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    return path


def test_identical_runs_with_two_backward_passes(tmp_path):
    a, b = _record(tmp_path / "a", 1.0), _record(tmp_path / "b", 1.0)
    r = C.compare(a, b, mode="statistics")
    assert r.summary["verdict"] == "identical"
    # one leaf per slot, the summed one that dump.json holds
    dump = json.loads((a / "step0" / "rank" / "dump.json").read_text())["data"]
    norm = dump["Module.2.Linear.backward.0"]["input"][0]["Norm"]
    rows = r.con.sql("SELECT t_norm FROM tensors WHERE t_call = 'Module.2.Linear.backward.0' AND io = 'input'").fetchall()
    assert [x for (x,) in rows] == [norm]


def test_second_loss_changed_diverges_on_the_sum(tmp_path):
    a, b = _record(tmp_path / "a", 2.0), _record(tmp_path / "b", 1.0)
    r = C.compare(a, b, mode="statistics")
    assert r.summary["verdict"] == "diverged"
    # the gradient w.r.t. y summed over both passes: 2y + factor*cos(y)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 1))
    y = net(torch.randn(3, 4)).detach().double()
    ga, gb = 2 * y + 2.0 * torch.cos(y), 2 * y + torch.cos(y)
    (ta, tb), = r.con.sql("SELECT t_norm, b_norm FROM tensors WHERE t_call = 'Module.2.Linear.backward.0' "
                          "AND io = 'input'").fetchall()
    assert np.isclose(ta, float(ga.norm()), rtol=1e-6) and np.isclose(tb, float(gb.norm()), rtol=1e-6)
