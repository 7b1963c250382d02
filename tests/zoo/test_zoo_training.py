"""Real models train exactly as without the recorder, and the dump holds every module
call, gradient and parameter gradient of the run.

Each zoo model (tests/zoo/zoo_models.py) trains :data:`zoo_harness.STEPS` seeded steps
recorded at a level, and is compared with an unrecorded and a probed run of the same
script (tests/zoo/zoo_harness.py): no internal error; losses, gradients and parameters
bit-identical (``torch.equal``); at L0/mix a forward entry for every submodule call that
returned (``is_recompute`` where it ran inside backward), a backward entry for every call
whose outputs received a gradient, with that gradient's statistics in ``input``, and a
``parameters_grad`` record for every parameter gradient (Norm against float64
``grad.norm()``); the first input's statistics are the batch's (with task tensor its
``.pt`` file holds the batch).

Levels: every model at L1 and mix; L0 (module hooks without API hooks), task tensor at L1
and task tensor at mix for subsets (:data:`L0_MODELS`, :data:`TENSOR_MODELS`,
:data:`MIX_TENSOR_MODELS`), to keep the suite at a few minutes on 2 cores;
``python tests/zoo/zoo_harness.py [MODEL ...]`` prints every model at every level.
"""
from __future__ import annotations

import pytest

from zoo_harness import LEVELS, STEPS, check, reference_runs
from zoo_models import CASES

#: models also run at L0: one per architecture family (decoder with checkpointing,
#: convolutional with in-place ops, root parameters, compiled)
L0_MODELS = ("llama_ckpt", "bert", "resnet18", "root_params", "mlp_compiled")
#: models also run with task tensor at L1 (in-place activations and residual adds, masks)
TENSOR_MODELS = ("gpt2", "bert", "mobilenetv3", "resnet18")
#: models also run with task tensor at mix: in-place activations on tensors recorded as
#: module inputs, then backward
MIX_TENSOR_MODELS = ("mobilenetv3",)

#: models under torch.compile: recorded around the compiled region only (docs/pytorch.md,
#: "torch.compile"), checked by :func:`test_compiled_model_recorded_around_its_region`
COMPILED_MODELS = ("mlp_compiled",)


def _params():
    out = []
    for name in CASES:
        if name in COMPILED_MODELS:
            continue
        levels = ["L1", "mix"]
        if name in L0_MODELS:
            levels.insert(0, "L0")
        if name in TENSOR_MODELS:
            levels.append("L1-tensor")
        if name in MIX_TENSOR_MODELS:
            levels.append("mix-tensor")
        for level in levels:
            out.append(pytest.param(name, level, id=f"{name}-{level}"))
    return out


PARAMS = _params()


def _recorded_unchanged(name, level, tmp_path, capfd):
    """Record zoo model ``name`` at ``level``; assert no internal error and training
    bit-identical to the unrecorded run; returns the harness's report."""
    case = CASES[name]
    reference, probed = reference_runs(case)
    rep = check(case, level, tmp_path / "dump", reference, probed)
    assert "internal error" not in capfd.readouterr().err
    assert not rep.errors, rep.errors
    assert rep.identical, rep.diffs[:10]
    return rep


@pytest.mark.parametrize("name,level", PARAMS)
def test_training_unchanged_and_fully_recorded(name, level, tmp_path, capfd):
    rep = _recorded_unchanged(name, level, tmp_path, capfd)
    assert rep.first_input_ok
    if LEVELS[level][0] == "L1":
        assert rep.api_entries > 0
        assert not rep.fwd_extra, rep.fwd_extra[:10]  # no module entries at L1
    else:
        assert rep.fwd_expected > 0 and not rep.fwd_missing, rep.fwd_missing[:10]
        assert not rep.fwd_extra, rep.fwd_extra[:10]
        assert not rep.recompute_bad, rep.recompute_bad[:10]
        assert rep.bwd_expected > 0 and not rep.bwd_missing, rep.bwd_missing[:10]
        assert not rep.bwd_input_bad, rep.bwd_input_bad[:10]
        assert rep.pgrad_expected > 0 and rep.pgrad_ok, rep.pgrad_bad[:10]
    if LEVELS[level][1] == "tensor":
        assert rep.tensor_file_ok


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
@pytest.mark.parametrize("name", COMPILED_MODELS)
def test_compiled_model_recorded_around_its_region(name, level, tmp_path, capfd):
    """A model compiled and warmed up before ``start()``: training bit-identical; at L0/mix
    the compiled model's own forward and backward entries (``Module._orig_mod.{Class}``) and
    every parameter gradient; its submodules, run inside the compiled graph, have no entries."""
    rep = _recorded_unchanged(name, level, tmp_path, capfd)
    if LEVELS[level][0] == "L1":
        assert rep.api_entries > 0  # the loss and the optimizer run eagerly
        assert not rep.fwd_extra, rep.fwd_extra[:10]
        return
    assert rep.first_input_ok
    assert rep.fwd_found == STEPS  # the compiled model's root entry, once per step
    assert rep.fwd_missing and all(n.startswith("Module._orig_mod.") for n in rep.fwd_missing)
    assert rep.pgrad_expected > 0 and rep.pgrad_ok, rep.pgrad_bad[:10]
