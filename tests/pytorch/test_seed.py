"""seed_all: every effect of the seeds' table, rm_dropout on every dropout variant, no
effect from importing msprobe, and identical dumps from two seeded runs with dropout."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import types

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from pt_helpers import load_dump
from msprobe.core.errors import ConfigError
from msprobe.pytorch import PrecisionDebugger, seed_all
from msprobe.pytorch.seed import restore_dropout

_ENV = ("PYTHONHASHSEED", "HCCL_DETERMINISTIC", "CUBLAS_WORKSPACE_CONFIG")


@pytest.fixture
def global_state():
    """Restore everything seed_all touches."""
    env = {k: os.environ.get(k) for k in _ENV}
    cudnn = (torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    det = torch.are_deterministic_algorithms_enabled()
    rng = torch.get_rng_state()
    yield
    restore_dropout()
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = cudnn
    torch.use_deterministic_algorithms(det)
    torch.set_rng_state(rng)
    if hasattr(torch, "npu") and isinstance(torch.npu, types.SimpleNamespace):
        del torch.npu


def test_every_effect(global_state):
    seed_all(seed=1000, mode=False, rm_dropout=False)
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    assert os.environ["PYTHONHASHSEED"] == "1000"
    assert os.environ["HCCL_DETERMINISTIC"] == "False"
    assert torch.backends.cudnn.enabled is False
    assert torch.backends.cudnn.benchmark is False
    assert torch.backends.cudnn.deterministic is True
    assert torch.are_deterministic_algorithms_enabled() is False
    random.seed(1000)
    np.random.seed(1000)
    torch.manual_seed(1000)
    assert a == (random.random(), np.random.rand(), torch.rand(1).item())
    assert F.dropout.__name__ == "dropout" and not hasattr(F.dropout, "__msprobe_rm_dropout__")


def test_mode_true_turns_on_deterministic_algorithms(global_state):
    seed_all(mode=True, rm_dropout=False)
    assert torch.are_deterministic_algorithms_enabled() is True
    assert os.environ["HCCL_DETERMINISTIC"] == "True"
    assert os.environ["PYTHONHASHSEED"] == "1234"


@pytest.mark.parametrize("kwargs,field", [
    ({"seed": -1}, "seed"), ({"seed": 2**32}, "seed"), ({"seed": 1.5}, "seed"), ({"seed": True}, "seed"),
    ({"mode": 1}, "mode"), ({"rm_dropout": "yes"}, "rm_dropout"),
])
def test_bad_arguments(global_state, kwargs, field):
    before = os.environ.get("PYTHONHASHSEED")
    with pytest.raises(ConfigError, match=f"`{field}`"):
        seed_all(**kwargs)
    assert os.environ.get("PYTHONHASHSEED") == before  # nothing changed


def test_rm_dropout_functions_and_modules_created_after(global_state):
    x = torch.randn(2, 3, 4, 4, 4) + 5
    x4 = x[:, :, 0]
    before = nn.Dropout(0.5)
    seed_all()
    assert torch.equal(F.dropout(x, 0.5), x)
    assert torch.equal(F.dropout(x, p=0.9, training=True), x)
    assert torch.equal(F.dropout2d(x4, 0.5), x4)
    assert torch.equal(F.dropout3d(x, 0.5), x)
    for cls in (nn.Dropout, nn.Dropout2d, nn.Dropout3d):
        m = cls(0.7)
        assert m.p == 0.0
        inp = x if cls is not nn.Dropout2d else x4
        assert torch.equal(m.train()(inp), inp)
    assert before.p == 0.5  # an instance created before keeps its attribute
    restore_dropout()
    assert nn.Dropout(0.5).p == 0.5
    assert not torch.equal(F.dropout(x, 0.5), x)


def test_npu_seeded_when_present(global_state):
    calls = []
    torch.npu = types.SimpleNamespace(manual_seed=lambda s: calls.append(("seed", s)),
                                      manual_seed_all=lambda s: calls.append(("all", s)))
    seed_all(seed=5, rm_dropout=False)
    assert calls == [("seed", 5), ("all", 5)]


def test_import_changes_nothing():
    code = (
        "import os, torch, torch.nn as nn, torch.nn.functional as F\n"
        "snap = lambda: (F.dropout, F.dropout2d, F.dropout3d, nn.Dropout.__init__, torch.Tensor.__add__,"
        " torch.add, torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark,"
        " torch.backends.cudnn.deterministic, torch.are_deterministic_algorithms_enabled(),"
        " os.environ.get('PYTHONHASHSEED'), os.environ.get('HCCL_DETERMINISTIC'), torch.initial_seed())\n"
        "torch.manual_seed(3)\n"
        "a = snap()\n"
        "import msprobe, msprobe.pytorch\n"
        "from msprobe.pytorch import PrecisionDebugger, seed_all, module_dump\n"
        "assert snap() == a, (snap(), a)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


class DropNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return F.dropout(self.drop(self.fc(x)), 0.3)


def seeded_run(dump_path, rm_dropout=True):
    seed_all(seed=42, rm_dropout=rm_dropout)
    dbg = PrecisionDebugger(dump_path=str(dump_path), level="mix")
    net = DropNet()
    dbg.start(model=net)
    out = net(torch.randn(4, 6))
    out.sum().backward()
    dbg.stop()
    dbg.close()
    return load_dump(dump_path)[0]


def test_two_seeded_runs_give_identical_dumps(global_state, tmp_path):
    a = seeded_run(tmp_path / "a")
    b = seeded_run(tmp_path / "b")
    assert a == b
    assert "Functional.dropout.0.forward" in a["data"] and "Module.drop.Dropout.forward.0" in a["data"]
    fwd = a["data"]["Module.drop.Dropout.forward.0"]
    assert fwd["input_args"][0]["Max"] == fwd["output"][0]["Max"]  # p = 0: identity
    assert fwd["input_args"][0]["Norm"] == fwd["output"][0]["Norm"]
