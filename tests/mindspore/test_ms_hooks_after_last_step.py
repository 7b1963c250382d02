"""After the last step of ``step``, step() removes every hook (API wrappers, Primitive and
Cell hooks): the rest of the run calls MindSpore's own functions, and what was recorded
stays as it was."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")

from ms_helpers import load_dump, make_input, make_net, np_stats, train_loop
from msprobe.mindspore import PrecisionDebugger

from mindspore import Tensor, mint, ops  # noqa: E402


def test_last_step_removes_every_hook(tmp_path):
    originals = (ops.mul, mint.nn.functional.relu)
    net, x = make_net(), make_input()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix", step=[0])
    dbg.start(net)
    assert (ops.mul, mint.nn.functional.relu) != originals  # wrapped while recording
    dbg.stop()
    dbg.step()  # the last step: the hooks come off
    assert (ops.mul, mint.nn.functional.relu) == originals
    assert dbg._api_hooks is None and dbg._model_handles is None and dbg._prim_handles is None
    losses = train_loop(net, x, dbg, steps=2)  # steps 1 and 2: not recorded, no hooks
    dbg.close()
    assert sorted(p.name for p in (tmp_path / "d").iterdir() if p.name.startswith("step")) == ["step0"]
    # the same steps without msprobe give the same losses
    plain = train_loop(make_net(), x, None, steps=2)
    assert [float(v) for v in losses] == [float(v) for v in plain]


def test_last_step_keeps_its_data(tmp_path):
    net, x = make_net(), make_input()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1", step=[1])
    train_loop(net, x, dbg, steps=3)
    dbg.close()
    assert sorted(p.name for p in (tmp_path / "d").iterdir() if p.name.startswith("step")) == ["step1"]
    data = load_dump(tmp_path / "d", step=1)[0]["data"]
    # the last relu output of step 1: the net after one SGD step, computed without msprobe
    ref_net = make_net()
    train_loop(ref_net, x, None, steps=1)
    h = Tensor(np.maximum(ref_net.d1(x).asnumpy(), 0) * np.float32(2.0))
    expected = np.maximum(ref_net.d2(h).asnumpy(), 0)
    relu = [name for name in data if name.endswith(".forward") and "relu" in name.lower()][-1]
    got = data[relu]["output"][0]
    for key, value in np_stats(expected).items():
        assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
