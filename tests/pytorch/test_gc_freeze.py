"""The debugger's first step() freezes the objects alive then for the garbage collector
(``gc.freeze``) and close() thaws them, unless the script had frozen objects itself before;
recording is unchanged by it."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

from msprobe.pytorch import PrecisionDebugger
from pt_helpers import assert_record, load_dump


@pytest.fixture
def thawed():
    """Start from a collector with nothing frozen and leave it so."""
    gc.unfreeze()
    yield
    gc.unfreeze()


class _Cycle:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def _train_step(model: torch.nn.Module, x: torch.Tensor) -> None:
    model(x).sum().backward()


def test_first_step_freezes_and_close_thaws(tmp_path, thawed):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    cycle = _Cycle()
    ref = weakref.ref(cycle)
    dbg.start(model)
    _train_step(model, x)
    dbg.stop()
    assert gc.get_freeze_count() == 0  # not before the step ends
    dbg.step()
    assert gc.get_freeze_count() > 0
    later = _Cycle()  # made after the freeze
    later_ref = weakref.ref(later)
    dbg.start(model)
    _train_step(model, x)
    dbg.stop()
    dbg.step()
    del cycle, later
    gc.collect()
    assert ref() is not None  # frozen: the cycle search skips it
    assert later_ref() is None  # the second step() froze nothing more
    dbg.close()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert ref() is None  # thawed: collected again

    # recording itself: the weight's gradient of step 1 as autograd computes it unrecorded
    model.zero_grad()
    _train_step(model, x)
    dump, _, _ = load_dump(tmp_path / "d", step=1)
    assert_record(dump["data"]["Functional.linear.0.backward"]["output"][1], model.weight.grad)


def test_a_scripts_own_freeze_stays(tmp_path, thawed):
    model = torch.nn.Linear(4, 3)
    cycle = _Cycle()
    ref = weakref.ref(cycle)
    gc.freeze()  # the script's own, before the debugger's
    with PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1") as dbg:
        dbg.start(model)
        _train_step(model, torch.randn(2, 4))
        dbg.stop()
        dbg.step()
    assert gc.get_freeze_count() > 0
    del cycle
    gc.collect()
    assert ref() is not None  # close() left the script's freeze in force
