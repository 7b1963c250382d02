"""Functions taken before recording begins are recorded under their documented names:
Hugging Face's ``ACT2FN["gelu"]`` (``GELUActivation.act = nn.functional.gelu``) and
``ACT2FN["gelu_pytorch_tanh"]`` (a ``functools.partial`` of it) inside a tiny random-init
BERT, and a module-global ``from torch.nn.functional import gelu``. The training stays
bit-identical, every reference is restored by ``close()``, and a second debugger works
on top of the first."""
from __future__ import annotations

import functools
import sys
import types

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.nn.functional import gelu  # held by reference before any debugger exists

from msprobe.pytorch import PrecisionDebugger
from pt_helpers import load_dump

transformers = pytest.importorskip("transformers")
_KEPT = (torch.nn.functional.gelu,)  # in a tuple: not rebound while recording


def _norm(t: torch.Tensor) -> float:
    return float(np.linalg.norm(t.detach().double().numpy().ravel()))


class GlobalGelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        return gelu(self.fc(x))


def _bert(hidden_act: str):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=24, max_position_embeddings=16, hidden_act=hidden_act)
    return transformers.BertModel(cfg)


def _train_bert(hidden_act: str, dump_path=None, level="L1"):
    model = _bert(hidden_act)
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = PrecisionDebugger(dump_path=str(dump_path), level=level, model=model) if dump_path else None
    losses, acts = [], []
    handle = model.encoder.layer[0].intermediate.register_forward_hook(
        lambda m, a, out: acts.append(out.detach().clone()))
    for _ in range(2):
        if dbg:
            dbg.start()
        loss = model(input_ids=ids).last_hidden_state.square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if dbg:
            dbg.stop()
            dbg.step()
    handle.remove()
    if dbg:
        dbg.close()
    return model, losses, [p.detach().clone() for p in model.parameters()], acts


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_pytorch_tanh"])
def test_act2fn_gelu_recorded(tmp_path, hidden_act):
    _, ref_losses, ref_params, ref_acts = _train_bert(hidden_act)
    model, losses, params, acts = _train_bert(hidden_act, tmp_path)
    assert losses == ref_losses
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))
    for step in range(2):
        data = load_dump(tmp_path, step)[0]["data"]
        gelus = [k for k in data if k.startswith("Functional.gelu.") and k.endswith(".forward")]
        assert gelus == ["Functional.gelu.0.forward", "Functional.gelu.1.forward"]  # one per layer
        rec = data["Functional.gelu.0.forward"]["output"][0]
        assert rec["Norm"] == pytest.approx(_norm(acts[step]), rel=1e-12)
        assert rec["Max"] == float(acts[step].max())
        assert "Functional.gelu.0.backward" in data
        if hidden_act == "gelu_pytorch_tanh":
            assert data["Functional.gelu.0.forward"]["input_kwargs"]["approximate"]["value"] == "tanh"
    # close() put the originals back
    act = model.encoder.layer[0].intermediate.intermediate_act_fn
    if hidden_act == "gelu":
        assert act.act is _KEPT[0]
    else:
        assert isinstance(act.act, functools.partial) and act.act.func is _KEPT[0]


def _train_global(dump_path=None):
    torch.manual_seed(0)
    net = GlobalGelu()
    x = torch.randn(3, 6)
    dbg = PrecisionDebugger(dump_path=str(dump_path), level="L1") if dump_path else None
    if dbg:
        dbg.start()
    out = net(x)
    out.sum().backward()
    if dbg:
        dbg.stop()
        dbg.step()
        dbg.close()
    return out.detach(), net.fc.weight.grad.clone()


def test_module_global_gelu_recorded(tmp_path):
    ref_out, ref_grad = _train_global()
    out, grad = _train_global(tmp_path)
    assert torch.equal(out, ref_out) and torch.equal(grad, ref_grad)
    data = load_dump(tmp_path)[0]["data"]
    rec = data["Functional.gelu.0.forward"]["output"][0]
    assert rec["Norm"] == pytest.approx(_norm(out), rel=1e-12)
    assert sys.modules[__name__].gelu is _KEPT[0]


def test_two_debuggers_and_restore(tmp_path):
    module = sys.modules[__name__]
    first = PrecisionDebugger(dump_path=str(tmp_path / "a"), level="L1")
    first.start()
    assert module.gelu is not _KEPT[0] and module.gelu is torch.nn.functional.gelu
    second = PrecisionDebugger(dump_path=str(tmp_path / "b"), level="L1")
    second.start()
    y = gelu(torch.ones(3))
    for dbg in (first, second):
        dbg.stop()
        dbg.step()
    first.close()
    z = gelu(torch.ones(3))  # the second debugger's wrapper over the first's, which passes through
    second.close()
    assert module.gelu is _KEPT[0] and torch.nn.functional.gelu is _KEPT[0]
    assert torch.equal(y, _KEPT[0](torch.ones(3))) and torch.equal(z, y)
    for sub in ("a", "b"):
        data = load_dump(tmp_path / sub)[0]["data"]
        assert data["Functional.gelu.0.forward"]["output"][0]["Max"] == float(y.max())


def test_model_holding_a_rebound_function_pickles(tmp_path):
    """``torch.save(model)`` while recording stores ``torch.nn.functional.gelu`` by name
    (the wrapper is found there), so the file loads with the original after ``close()``."""
    model = _bert("gelu")
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1", model=model)
    dbg.start()
    assert model.encoder.layer[0].intermediate.intermediate_act_fn.act is torch.nn.functional.gelu
    torch.save(model, tmp_path / "model.pt")
    dbg.stop()
    dbg.step()
    dbg.close()
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert loaded.encoder.layer[0].intermediate.intermediate_act_fn.act is _KEPT[0]


class StaticGelu(nn.Module):
    """``gelu`` held as a class attribute, plainly and wrapped in ``staticmethod``."""
    plain = torch.nn.functional.gelu
    static = staticmethod(torch.nn.functional.gelu)

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        h = self.fc(x)
        return self.static(h) * self.plain(h)


def test_class_attribute_and_staticmethod_gelu_recorded(tmp_path):
    def train(dump_path=None):
        torch.manual_seed(0)
        model = StaticGelu()
        dbg = PrecisionDebugger(dump_path=str(dump_path), level="L1", model=model) if dump_path else None
        if dbg:
            dbg.start()
        x = torch.randn(3, 6, generator=torch.Generator().manual_seed(2))
        h = model.fc(x).detach()
        out = model(x)
        out.sum().backward()
        if dbg:
            dbg.stop()
            dbg.step()
            dbg.close()
        return out.detach(), model.fc.weight.grad.clone(), h

    ref_out, ref_grad, h = train()
    out, grad, _ = train(tmp_path)
    assert torch.equal(out, ref_out) and torch.equal(grad, ref_grad)
    data = load_dump(tmp_path)[0]["data"]
    expected = _norm(_KEPT[0](h))
    for n in (0, 1):
        assert data[f"Functional.gelu.{n}.forward"]["output"][0]["Norm"] == pytest.approx(expected, rel=1e-6)
    assert StaticGelu.__dict__["plain"] is _KEPT[0]
    assert isinstance(StaticGelu.__dict__["static"], staticmethod)
    assert StaticGelu.__dict__["static"].__func__ is _KEPT[0]


def test_references_taken_between_steps_recorded(tmp_path):
    """A later ``start()`` rebinds what appeared since the one before: a module imported
    since, a module replaced under the same name in ``sys.modules`` (after a step that
    imported nothing), and a partial set as a model attribute; ``close()`` restores all three."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6))
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(3))
    name = "msprobe_test_late_import"
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1", model=model)
    dbg.start()
    model(x)
    dbg.stop()
    dbg.step()
    late = types.ModuleType(name)
    late.gelu = _KEPT[0]
    sys.modules[name] = late
    model.act = functools.partial(_KEPT[0], approximate="tanh")
    try:
        dbg.start()
        h = model(x)
        a, b = late.gelu(h), model.act(h)
        dbg.stop()
        dbg.step()
        again = types.ModuleType(name)
        again.gelu = _KEPT[0]
        for module in (late, again):  # step 3: the same name, another module object
            sys.modules[name] = module
            dbg.start()
            c = module.gelu(h * 2)
            dbg.stop()
            dbg.step()
        dbg.close()
    finally:
        del sys.modules[name]
    step1 = load_dump(tmp_path, 1)[0]["data"]
    assert step1["Functional.gelu.0.forward"]["output"][0]["Norm"] == pytest.approx(_norm(a), rel=1e-12)
    assert step1["Functional.gelu.1.forward"]["output"][0]["Norm"] == pytest.approx(_norm(b), rel=1e-12)
    assert step1["Functional.gelu.1.forward"]["input_kwargs"]["approximate"]["value"] == "tanh"
    for step in (2, 3):
        data = load_dump(tmp_path, step)[0]["data"]
        assert data["Functional.gelu.0.forward"]["output"][0]["Norm"] == pytest.approx(_norm(c), rel=1e-12)
    assert late.gelu is _KEPT[0] and again.gelu is _KEPT[0] and model.act.func is _KEPT[0]


def test_a_module_loaded_again_under_its_name_rebound_each_step(tmp_path):
    """A module loaded again under the same name (removed from ``sys.modules``, then a new
    module object for it, as a notebook or a file loader re-running its imports does),
    with another module imported after it: each new object is scanned, even where the
    new object takes the freed one's address (``id``)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6))
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(3))
    name, after = "msprobe_test_reloaded", "msprobe_test_reloaded_after"
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1", model=model)
    norms = []
    try:
        for _ in range(4):
            for key in (name, after):  # load both again; the old objects are freed
                sys.modules.pop(key, None)
                module = types.ModuleType(key)
                module.gelu = _KEPT[0]
                sys.modules[key] = module
            del module
            dbg.start()
            y = sys.modules[name].gelu(model(x))
            dbg.stop()
            dbg.step()
            norms.append(_norm(y))
        dbg.close()
    finally:
        sys.modules.pop(name, None)
        sys.modules.pop(after, None)
    for step, norm in enumerate(norms):
        data = load_dump(tmp_path, step)[0]["data"]
        assert data["Functional.gelu.0.forward"]["output"][0]["Norm"] == pytest.approx(norm, rel=1e-12)
