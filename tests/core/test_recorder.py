"""Tests of msprobe.core.recorder: the filters a recorder applies per call, frames and
parents, forward keys, pending backward entries and the guard (no framework needed)."""
from __future__ import annotations

import json

import pytest

from msprobe.core.config import load_config
from msprobe.core.guard import INSIDE, Guarded
from msprobe.core.recorder import Frame, PendingBackward, Plan, RecorderCore
from msprobe.core.session import Session
from store import schema
from store.records import Leaf


class _Core(RecorderCore):
    """A recorder core whose gradient graph is switched by the test."""

    RECOMPUTE = True
    graph = True

    def grad_active(self) -> bool:
        return self.graph


def _core(tmp_path, level="mix", **statistics) -> _Core:
    cfg_file = tmp_path / "config.json"
    cfg_file.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "d"), "level": level,
                                    "statistics": statistics}))
    return _Core(Session(load_config(str(cfg_file)), framework="pytorch"))


def _enter(core: _Core, prefix: str, n: int = 0) -> Frame:
    fwd, bwd = f"{prefix}.forward.{n}", f"{prefix}.backward.{n}"
    want_fwd, _ = core.wanted(fwd, bwd)
    frame = core.start_frame(Frame(), prefix, fwd, bwd, "Module", want_fwd)
    core.session.module_stack().append(frame)
    return frame


def test_unfiltered_follows_data_mode_and_the_gradient_graph(tmp_path):
    core = _core(tmp_path, data_mode=["all"])
    assert core.wanted("Tensor.add.0.forward", "Tensor.add.0.backward") == (True, True)
    core.graph = False
    assert core.wanted("Tensor.add.1.forward", "Tensor.add.1.backward") == (True, False)
    fwd_only = _core(tmp_path, data_mode=["forward"])
    assert fwd_only.wanted("Tensor.add.0.forward", "Tensor.add.0.backward") == (True, False)


def test_list_keeps_matching_names_and_everything_inside_a_matching_module_at_mix(tmp_path):
    core = _core(tmp_path, list=["Linear"])
    assert core.wanted("Tensor.add.0.forward", "Tensor.add.0.backward") == (False, False)
    frame = _enter(core, "Module.fc.Linear")
    assert (frame.keep_fwd, frame.keep_bwd, frame.want_fwd) == (True, True, True)
    # inside the matching module: kept although the name does not match (spec 5.5)
    assert core.wanted("Tensor.add.1.forward", "Tensor.add.1.backward") == (True, True)
    core.session.module_stack().pop()
    assert core.wanted("Tensor.add.2.forward", "Tensor.add.2.backward") == (False, False)


def test_list_inside_rule_is_only_at_mix(tmp_path):
    core = _core(tmp_path, level="L0", list=["Linear"])
    frame = _enter(core, "Module.fc.Linear")
    assert (frame.keep_fwd, frame.keep_bwd) == (False, False)
    assert core.wanted("Tensor.add.0.forward", "Tensor.add.0.backward") == (False, False)


def test_scope_is_inclusive_and_a_backward_follows_its_forward(tmp_path):
    core = _core(tmp_path, scope=["Tensor.add.1.forward", "Tensor.add.3.forward"])
    got = []
    for n in range(5):
        fwd = f"Tensor.add.{n}.forward"
        got.append(core.wanted(fwd, f"Tensor.add.{n}.backward"))
        core.scope.exit(fwd)
    assert got == [(False, False), (True, True), (True, True), (True, True), (False, False)]
    core.step_reset()
    assert core.wanted("Tensor.add.1.forward", "Tensor.add.1.backward") == (True, True)


def test_parent_is_the_innermost_frame_and_placeholders_are_skipped(tmp_path):
    core = _core(tmp_path)
    assert core.parent() is None
    outer = _enter(core, "Module.outer.Seq")
    core.session.module_stack().append(None)  # an unrecorded module
    assert core.parent() == "Module.outer.Seq.forward.0"
    inner = _enter(core, "Module.outer.fc.Linear")
    assert inner.parent == "Module.outer.Seq.forward.0" and outer.parent is None
    assert core.parent() == "Module.outer.fc.Linear.forward.0"
    assert core.modules_seen == {"Module.outer.Seq", "Module.outer.fc.Linear"}
    core.step_reset()
    assert core.modules_seen == set()


@pytest.mark.parametrize(("data_mode", "api", "module"), [
    (["all"], ("input_args", "input_kwargs", "is_recompute", "output"),
     ("input_args", "input_kwargs", "output", "parameters", "is_recompute")),
    (["forward", "input"], ("input_args", "input_kwargs", "is_recompute"),
     ("input_args", "input_kwargs", "parameters", "is_recompute")),
    (["output"], ("is_recompute", "output"), ("output", "is_recompute")),
])
def test_forward_keys_follow_data_mode(tmp_path, data_mode, api, module):
    core = _core(tmp_path, data_mode=data_mode)
    assert (core.api_keys, core.module_keys) == (api, module)
    plan = core.start_plan(Plan(), "Tensor.add.0.forward", "Tensor", True)
    plan.leaves.append(Leaf(io="input_args", path=(0,), leaf_kind=schema.LEAF_NONE))
    call = core.forward_call(plan, schema.API_FORWARD, is_recompute=True)
    assert (call.name, call.api_type, call.keys, call.is_recompute, len(call.leaves)) == (
        "Tensor.add.0.forward", "Tensor", api, True, 1)


def test_pending_backward_fills_missing_gradients_with_none_leaves(tmp_path):
    core = _core(tmp_path, data_mode=["all"])
    frame = _enter(core, "Module.fc.Linear")
    plan = core.start_plan(Plan(), "Tensor.mul.0.forward", "Tensor", True)
    pending = core.new_pending(plan, "Tensor.mul.0.backward", schema.API_BACKWARD)
    assert plan.pending is pending and pending.parent == "Module.fc.Linear.backward.0"
    assert frame.pending is None
    pending.in_slots += [(0,)]
    pending.out_slots += [(0,), (1,)]
    got = Leaf(io="output", path=(1,), leaf_kind=schema.LEAF_VALUE, value_json="1")
    pending.grads_out[(1,)] = got
    call = pending.to_call()
    assert call.keys == ("input", "output") and call.kind == schema.API_BACKWARD
    assert [(x.io, x.path, x.leaf_kind) for x in call.leaves] == [
        ("input", (0,), schema.LEAF_NONE), ("output", (0,), schema.LEAF_NONE), ("output", (1,), schema.LEAF_VALUE)]


def test_accepts_grad_drops_entries_of_a_closed_step(tmp_path):
    core = _core(tmp_path)
    pending = PendingBackward(step=0, name="x.backward", kind=schema.API_BACKWARD, api_type="Tensor",
                              parent=None, stack_id=None, keys=("input",))
    core.pending[id(pending)] = pending
    assert not core.accepts_grad(pending)  # the session never opened step 0
    assert pending.done and core.pending == {}
    assert not core.accepts_grad(pending)


def test_parameters_grad_entry_follows_data_mode_and_list(tmp_path):
    core = _core(tmp_path, list=["fc"])
    assert core.parameters_grad_entry("Module.fc.Linear") == "Module.fc.Linear.parameters_grad"
    assert core.parameters_grad_entry("Module.conv.Conv2d") is None
    assert core.parameters_grad_entry("Module.conv.Conv2d", True) == "Module.conv.Conv2d.parameters_grad"
    assert _core(tmp_path, data_mode=["forward"]).parameters_grad_entry("Module.fc.Linear") is None


def test_forward_call_is_recompute_is_none_without_the_flag(tmp_path):
    core = _core(tmp_path)
    plan = core.start_plan(Plan(), "Cell.fc.Dense.forward.0", "Cell", True)
    assert core.forward_call(plan, schema.MODULE_FORWARD).is_recompute is None


def test_guarded_error_handler_runs_while_busy():
    seen = []
    with Guarded(lambda exc: seen.append(INSIDE.busy)):
        raise RuntimeError("x")
    assert seen == [True] and INSIDE.busy is False


def test_guarded_sets_busy_restores_it_and_reports_exceptions():
    errors = []
    assert INSIDE.busy is False
    with Guarded(errors.append):
        assert INSIDE.busy is True
        with Guarded(errors.append):
            raise ValueError("inner")
        assert INSIDE.busy is True  # the outer guard still holds
    assert INSIDE.busy is False
    assert [str(e) for e in errors] == ["inner"]
    with pytest.raises(KeyboardInterrupt):
        with Guarded(errors.append):
            raise KeyboardInterrupt
    assert INSIDE.busy is False and len(errors) == 1
