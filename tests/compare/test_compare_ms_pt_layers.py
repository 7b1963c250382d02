"""PyTorch vs MindSpore with the built-in table only, on one small model built in both
frameworks with identical weights (tests/compare/ms_pt_twin.py: embedding, LayerNorm,
Dense/Linear projections, attention matmuls, softmax, GELU): at L1 and mix nothing diverges
(LayerNorm's gamma/beta gradients pair with weight/bias, not shifted by one), and with a
deliberate bug inside one Cell that Cell is the first origin, even though every call inside
it is unpaired. The same for a small convolutional model (tests/compare/ms_pt_conv_twin.py:
MindSpore's ``Conv2D`` result, before its separate ``BiasAdd``, pairs with nothing rather than
with ``F.conv2d``'s biased result by shape). Plus the module rule in the reference judgement
and the table's new sections."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")
torch = pytest.importorskip("torch")

import msprobe.compare as C  # noqa: E402
from msprobe.compare.builtin_table import builtin_mapping  # noqa: E402
from msprobe.compare.errors import CompareInputError  # noqa: E402
from msprobe.compare.verdicts import call_verdicts  # noqa: E402

import ms_pt_conv_twin as conv_twin  # noqa: E402
import ms_pt_twin as twin  # noqa: E402


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    d = tmp_path_factory.mktemp("twin")
    out = {}
    for level in ("L1", "mix"):
        for key, record in (("pt", twin.record_torch), ("ms", twin.record_ms)):
            record(d / f"{key}_{level}", level)
            out[(key, level)] = d / f"{key}_{level}"
    twin.record_ms(d / "msbug_mix", "mix", bug=True)
    out[("msbug", "mix")] = d / "msbug_mix"
    return out


def _torch_layer_norm_grads() -> dict:
    """The same model in float64 PyTorch functions, unrecorded: ``{param: norm of its
    gradient}`` for the LayerNorm (an independent value for the pairs below; the float32
    runs agree with it to ~2e-5, the bias and weight norms differ by far more)."""
    import torch.nn.functional as F
    w = twin.weights()
    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in w.items()}
    ids, c = twin.inputs()
    x = F.embedding(torch.from_numpy(ids).long(), t["embed"])
    h = F.layer_norm(x, (twin.HIDDEN,), t["ln.weight"], t["ln.bias"])

    def lin(z, name):
        return F.linear(z, t[f"{name}.weight"], t.get(f"{name}.bias"))

    q, k, v = lin(h, "attn.q"), lin(h, "attn.k"), lin(h, "attn.v")
    p = torch.softmax(q @ k.transpose(-1, -2) / np.sqrt(twin.HIDDEN), dim=-1)
    y = lin(F.gelu(lin(p @ v, "attn.out")), "head")
    (y * torch.from_numpy(c).double()).sum().backward()
    return {k: float(t[k].grad.norm()) for k in ("ln.weight", "ln.bias")}


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_same_model_reports_no_divergence(dumps, level):
    r = C.compare(dumps[("ms", level)], dumps[("pt", level)], tol="loose")
    counts = r.summary["ranks"][0]["counts"]
    assert counts["origin"] == 0 and counts["propagated"] == 0, counts
    assert counts["pass"] > 15
    # the LayerNorm primitive pairs with F.layer_norm, gamma/beta gradients with weight/bias
    rows = r.con.sql("SELECT io, arg, t_norm, b_norm, verdict FROM tensors "
                     "WHERE t_call = 'Functional.layer_norm.0.backward' AND io = 'output' ORDER BY arg").fetchall()
    by_arg = {arg: (tn, bn, v) for _io, arg, tn, bn, v in rows}
    want = _torch_layer_norm_grads()
    assert by_arg["2"][0] == pytest.approx(want["ln.weight"], rel=1e-4)   # MindSpore gamma gradient
    assert by_arg["2"][1] == pytest.approx(want["ln.weight"], rel=1e-4)   # PyTorch weight gradient
    assert by_arg["3"][0] == pytest.approx(want["ln.bias"], rel=1e-4)
    assert by_arg["3"][2] in ("close", "identical")
    assert r.con.sql("SELECT count(*) FROM alignment WHERE t_name = 'Functional.layer_norm.0.forward' "
                     "AND b_name IS NOT NULL").fetchall()[0][0] == 1


def test_mix_pairs_layer_parameters_and_sets_cell_input_gradients_aside(dumps):
    r = C.compare(dumps[("ms", "mix")], dumps[("pt", "mix")], tol="loose")
    want = _torch_layer_norm_grads()
    (tn, bn, v), = r.con.sql("SELECT t_norm, b_norm, verdict FROM tensors WHERE "
                             "t_call = 'Module.ln.LayerNorm.parameters_grad' AND io = 'weight'").fetchall()
    assert tn == pytest.approx(want["ln.weight"], rel=1e-4) and bn == pytest.approx(want["ln.weight"], rel=1e-4)
    # q, k and v read one tensor: MindSpore's Cell backward output is its whole gradient, not compared
    rows = r.con.sql("SELECT io, verdict FROM tensors WHERE t_call = 'Module.attn.q.Linear.backward.0' "
                     "AND io LIKE 'output%'").fetchall()
    assert sorted(rows) == [("output", "unpaired"), ("output_whole_gradient", "unpaired")]
    assert any("output_whole_gradient" in n for n in r.summary["notes"])
    # the other direction: the table renames the MindSpore BASELINE
    back = C.compare(dumps[("pt", "mix")], dumps[("ms", "mix")], tol="loose")
    counts = back.summary["ranks"][0]["counts"]
    assert counts["origin"] == 0 and counts["propagated"] == 0, counts


def test_bug_inside_a_cell_is_the_first_origin(dumps):
    r = C.compare(dumps[("msbug", "mix")], dumps[("pt", "mix")], tol="loose")
    first = r.first[0]
    assert first["name"] == "Cell.attn.out.Dense.forward.0"
    assert first["baseline_name"] == "Module.attn.out.Linear.forward.0"
    # its own input error ~1e-5, its output error 0.25 (the bug's 1.25 x): origin by its own errors
    (in_e, out_e), = r.con.sql("SELECT in_e, out_e FROM calls WHERE t_name = 'Module.attn.out.Linear.forward.0'"
                               ).fetchall()
    assert in_e < 1e-4 and out_e == pytest.approx(0.25, rel=1e-3)
    # every call inside the buggy Cell is unpaired (Dense's primitives, the bug's multiply)
    kids = r.con.sql("SELECT DISTINCT verdict FROM calls WHERE module = 'Module.attn.out.Linear.forward.0'").fetchall()
    assert kids == [("unpaired",)]


def _row(name, kind, in_e, out_bad_e, module=None, paired=True):
    return {"rank": 0, "step": 0, "t_name": name, "b_name": name if paired else None, "kind": kind,
            "in_e": in_e, "out_e": out_bad_e, "out_bad_e": out_bad_e, "arg_differs": False,
            "any_bad": out_bad_e is not None, "worst_leaf": f"{name}|output|0", "worst_verdict": "diverged",
            "module": module}


def test_module_judged_by_its_own_errors():
    parent = "Module.blk.Block.forward.0"
    rows = call_verdicts([
        _row("Tensor.mul.0.forward", "api_forward", None, None, module=parent, paired=False),
        _row(parent, "module_forward", 0.0, 0.24),
    ])
    assert [r["verdict"] for r in rows] == ["unpaired", "origin"]
    # with a paired child that passes, still the module's own errors decide
    rows = call_verdicts([
        _row("Tensor.add.0.forward", "api_forward", 0.0, None, module=parent),
        _row(parent, "module_forward", 0.0, 0.24),
    ])
    assert rows[1]["verdict"] == "origin"
    # an output error explained by the input's stays propagated
    rows = call_verdicts([_row(parent, "module_forward", 0.1, 0.24)])
    assert rows[0]["verdict"] == "propagated"


def test_table_primitive_leaf_and_parameter_sections(tmp_path):
    m = builtin_mapping()
    assert m.primitive_leaf["LayerNorm"]["backward"] == {"input.1": "input.unmapped.1", "input.2": "input.unmapped.2",
                                                         "output.1": "output.2", "output.2": "output.3"}
    assert set(m.primitive_leaf) <= set(m.primitive)        # every mapped Primitive has a counterpart
    assert m.parameter["LayerNorm"] == {"gamma": "weight", "beta": "bias"}
    f = tmp_path / "t.yaml"
    f.write_text("primitive_leaf:\n  LayerNorm:\n    sideways: {output.1: output.2}\n")
    with pytest.raises(CompareInputError, match=r"primitive_leaf.LayerNorm: expected \{forward\|backward"):
        builtin_mapping(str(f))
    f.write_text("parameter:\n  LayerNorm: [gamma]\n")
    with pytest.raises(CompareInputError, match=r"parameter.LayerNorm: expected parameter: parameter"):
        builtin_mapping(str(f))


# --- convolutional twin --------------------------------------------------------------------

@pytest.fixture(scope="module")
def conv_dumps(tmp_path_factory):
    d = tmp_path_factory.mktemp("conv_twin")
    out = {}
    for level in ("L1", "mix"):
        for key, record in (("pt", conv_twin.record_torch), ("ms", conv_twin.record_ms)):
            record(d / f"{key}_{level}", level)
            out[(key, level)] = d / f"{key}_{level}"
    conv_twin.record_ms(d / "msbug_mix", "mix", bug=True)
    out[("msbug", "mix")] = d / "msbug_mix"
    return out


def _torch_conv_grads() -> dict:
    """The convolutional twin in float64 PyTorch functions, unrecorded: ``{param: norm of
    its gradient}`` and ``{"conv1.out": norm of conv1's biased result}``."""
    import torch.nn.functional as F
    w = conv_twin.weights()
    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in w.items()}
    x, c = conv_twin.inputs()
    h1 = F.conv2d(torch.from_numpy(x).double(), t["conv1.weight"], t["conv1.bias"], padding=1)
    h2 = F.conv2d(F.relu(h1), t["conv2.weight"], t["conv2.bias"], padding=1)
    y = F.linear(h2.flatten(1), t["head.weight"], t["head.bias"])
    (y * torch.from_numpy(c).double()).sum().backward()
    out = {k: float(v.grad.norm()) for k, v in t.items()}
    out["conv1.out"] = float(h1.detach().norm())
    return out


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_conv_model_reports_no_divergence(conv_dumps, level):
    want = _torch_conv_grads()
    r = C.compare(conv_dumps[("ms", level)], conv_dumps[("pt", level)], tol="loose")
    counts = r.summary["ranks"][0]["counts"]
    assert counts["origin"] == 0 and counts["propagated"] == 0, counts
    # Conv2D's result before the bias pairs with nothing; F.conv2d's biased result stays unpaired
    rows = r.con.sql("SELECT arg, b_arg, in_b, verdict FROM tensors WHERE t_call = 'Functional.conv2d.0.forward' "
                     "AND io = 'output'").fetchall()
    assert ("unmapped.0", None, False, "unpaired") in rows
    (b_norm,), = r.con.sql("SELECT b_norm FROM tensors WHERE b_call = 'Functional.conv2d.0.forward' "
                           "AND io = 'output' AND b_arg = '0'").fetchall()
    assert b_norm == pytest.approx(want["conv1.out"], rel=1e-5)
    # the gradient w.r.t. the weight (slot 1) pairs with PyTorch's, both equal to float64 autograd's
    (tn, bn, v), = r.con.sql("SELECT t_norm, b_norm, verdict FROM tensors WHERE "
                             "t_call = 'Functional.conv2d.0.backward' AND io = 'output' AND arg = '1'").fetchall()
    assert tn == pytest.approx(want["conv1.weight"], rel=1e-5) and bn == pytest.approx(want["conv1.weight"], rel=1e-5)
    assert v in ("close", "identical")
    if level == "mix":
        got = dict(r.con.sql("SELECT io, t_norm FROM tensors WHERE t_call = 'Module.conv2.Conv2d.parameters_grad' "
                             "AND b_norm IS NOT NULL").fetchall())
        assert got["weight"] == pytest.approx(want["conv2.weight"], rel=1e-5)
        assert got["bias"] == pytest.approx(want["conv2.bias"], rel=1e-5)
    # the other direction: the table renames the MindSpore BASELINE
    back = C.compare(conv_dumps[("pt", level)], conv_dumps[("ms", level)], tol="loose")
    counts = back.summary["ranks"][0]["counts"]
    assert counts["origin"] == 0 and counts["propagated"] == 0, counts


def test_bug_inside_a_conv_cell_is_the_first_origin(conv_dumps):
    r = C.compare(conv_dumps[("msbug", "mix")], conv_dumps[("pt", "mix")], tol="loose")
    first = r.first[0]
    assert first["name"] == "Cell.conv2.Conv2d.forward.0"
    assert first["baseline_name"] == "Module.conv2.Conv2d.forward.0"
