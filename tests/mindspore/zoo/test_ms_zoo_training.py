"""Real MindSpore models train exactly as without the recorder, at L1, L0 and mix.

Each zoo model (ms_zoo_models.py: mindcv's ResNet-18, a GPT-2-style and a Llama-style
decoder with RMSNorm, rotary embedding, grouped-query attention and tied embeddings)
trains 2 seeded steps recorded at a level and unrecorded: losses, parameter gradients and
updated parameters must be equal bit for bit, and the dump must hold a ``parameters_grad``
entry for every trained parameter of a hooked Cell (L0/mix) whose Norm is the float64 norm
of the unrecorded run's gradient, and API entries at L1/mix.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/mindspore: ms_helpers
from ms_helpers import load_dump  # noqa: E402
from ms_zoo_models import CASES, differences, train  # noqa: E402
from msprobe.mindspore import PrecisionDebugger  # noqa: E402

LEVELS = ("L1", "L0", "mix")
_REFERENCE: dict = {}


def _reference(name):
    if name not in _REFERENCE:
        _REFERENCE[name] = train(name)
    return _REFERENCE[name]


def _params():
    out = []
    for name in CASES:
        marks = ()
        if name == "resnet18":
            marks = (pytest.mark.skipif(not _has_mindcv(), reason="mindcv==0.3.0 not installed"),)
        out.extend(pytest.param(name, level, id=f"{name}-{level}", marks=marks) for level in LEVELS)
    return out


def _has_mindcv() -> bool:
    try:
        import mindcv  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("name,level", _params())
def test_training_bit_identical_and_gradients_recorded(name, level, tmp_path, capfd):
    ref = _reference(name)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level=level)
    run = train(name, dbg=dbg)
    dbg.close()
    assert "internal error" not in capfd.readouterr().err
    assert differences(ref, run) == []

    data = load_dump(tmp_path / "d", step=0)[0]["data"]
    if level in ("L1", "mix"):
        assert any(k.endswith(".forward") for k in data)
        assert any(k.endswith(".backward") for k in data)
    if level in ("L0", "mix"):
        grads = dict(zip(ref.names, ref.grads[0]))
        recorded = {}
        for key, entry in data.items():
            if key.endswith(".parameters_grad"):
                path = key[len("Cell."):-len(".parameters_grad")].rsplit(".", 1)[0]
                for pname, recs in entry.items():  # one record per gradient computation
                    assert len(recs) == 1, (key, pname)
                    recorded[f"{path}.{pname}"] = recs[0]
        assert set(recorded) == set(grads)
        for pname, rec in recorded.items():
            want = np.sqrt((grads[pname].astype(np.float64) ** 2).sum())
            assert rec["Norm"] == pytest.approx(want, rel=1e-9), pname
