"""Module backward entries of real models hold what docs/pytorch.md ("Backward entries:
what each slot holds") says, checked against probed runs of the same script
(tests/zoo/zoo_harness.py):

- an output the module also uses itself (BERT's ``last_hidden_state``, read by its pooler;
  T5's ``position_bias``, added to the scores): ``input`` is the gradient as the caller
  receives it, not the output's total gradient;
- HF ``ModelOutput`` and tuple outputs get their backward entry, keyed like the forward
  record;
- one tensor in three argument slots (``self_attn(x, x, x)`` of
  ``nn.TransformerEncoderLayer``): the first slot holds the combined gradient, the others
  say ``alias_of``; one output tensor in two places (GPT-2's ``last_hidden_state`` and
  ``hidden_states[-1]``) likewise;
- parameters the root model owns (``cls_token``, ``pos_embed``) get their gradients.
"""
from __future__ import annotations

import pytest
import torch

from msprobe.pytorch import PrecisionDebugger
from zoo_harness import RTOL, assert_record, check, grad_match, load_dump, np_stats, reference_runs, stats_match
from zoo_models import CASES


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """``recorded(name) -> (dump.json data of step 0, probed run)`` of a zoo model at L0."""
    done = {}

    def get(name):
        if name not in done:
            case = CASES[name]
            reference, probed = reference_runs(case)
            dump = tmp_path_factory.mktemp(name)
            rep = check(case, "L0", dump, reference, probed)
            assert rep.identical and not rep.errors
            done[name] = load_dump(dump)[0]["data"], probed
        return done[name]
    return get


def _grads(probed, prefix, n=0, step=0):
    """(total gradients, boundary gradients) of the outputs of call ``n`` of ``prefix``."""
    return probed.probe.grads[step][(prefix, n)], probed.boundary.grads[step].get((prefix, n), {})


def test_bert_output_read_by_its_own_pooler_gets_the_callers_gradient(recorded):
    data, probed = recorded("bert")
    total, caller = _grads(probed, "Module.bert.BertModel")
    entry = data["Module.bert.BertModel.backward.0"]["input"][0]
    assert list(entry) == ["last_hidden_state", "pooler_output"]  # the ModelOutput's keys
    # the classifier reads only pooler_output: the caller's gradient of last_hidden_state is 0
    assert (0, "last_hidden_state") not in caller
    assert np_stats(total[(0, "last_hidden_state")])["Norm"] > 0  # the pooler's own use
    rec = entry["last_hidden_state"]
    assert (rec["Max"], rec["Min"], rec["Mean"], rec["Norm"]) == (0.0, 0.0, 0.0, 0.0)
    assert stats_match(entry["pooler_output"], caller[(0, "pooler_output")])


def test_t5_position_bias_used_in_its_attention_gets_the_callers_gradient(recorded):
    data, probed = recorded("t5")
    prefix = "Module.encoder.block.0.layer.0.SelfAttention.T5Attention"
    total, caller = _grads(probed, prefix)
    g_total, g_caller = total[(1,)], caller[(1,)]  # output 1: position_bias
    assert not torch.allclose(g_total, g_caller)  # the module's own use is a real part
    rec = data[f"{prefix}.backward.0"]["input"][1]
    assert grad_match(rec, g_caller, g_total)
    assert not grad_match(rec, g_total, g_total)


@pytest.mark.parametrize("name,prefix,slots", [
    ("gpt2", "Module.transformer.GPT2Model", ["last_hidden_state"]),
    ("vit", "Module.vit.ViTModel", ["last_hidden_state"]),
    ("t5", "Module.encoder.block.0.T5Block", None),
])
def test_model_output_and_tuple_outputs_have_backward_entries(recorded, name, prefix, slots):
    data, probed = recorded(name)
    total, caller = _grads(probed, prefix)
    entry = data[f"{prefix}.backward.0"]
    forward = data[f"{prefix}.forward.0"]["output"]
    if slots is None:  # a tuple: one slot per element, as in the forward record
        assert isinstance(entry["input"], list) and len(entry["input"]) == len(forward) > 1
        paths = [(i,) for i in range(len(forward)) if (i,) in total]
    else:  # a ModelOutput: a dict under input[0], keyed like the forward record
        assert list(entry["input"][0]) == list(forward[0])
        paths = [(0, k) for k in slots]
    assert paths
    for path in paths:
        rec = entry["input"]
        for k in path:
            rec = rec[k]
        g = caller.get(path, torch.zeros_like(total[path]))
        assert grad_match(rec, g, total[path]), path


def test_self_attention_slots_after_the_first_are_aliases(recorded):
    data, probed = recorded("root_params")
    for layer in (0, 1):
        prefix = f"Module.encoder.layers.{layer}.self_attn.MultiheadAttention"
        forward = data[f"{prefix}.forward.0"]
        assert len(forward["input_args"]) == 3
        out = data[f"{prefix}.backward.0"]["output"]
        # norm1's output is read only by self_attn (in all three slots): its whole gradient
        # is the attention's combined one
        g = probed.probe.grads[0][(f"Module.encoder.layers.{layer}.norm1.LayerNorm", 0)][(0,)]
        assert grad_match(out[0], g, g)
        assert "alias_of" not in out[0]
        for slot in (1, 2):
            assert out[slot]["alias_of"] == "output.0"
            assert {k: out[slot][k] for k in ("Max", "Min", "Mean", "Norm")} == \
                {k: out[0][k] for k in ("Max", "Min", "Mean", "Norm")}


def test_root_model_parameters_get_their_gradients(recorded):
    data, probed = recorded("root_params")
    reference, _ = reference_runs(CASES["root_params"])
    entry = data["Module.model.RootParamViT.parameters_grad"]
    assert sorted(entry) == ["cls_token", "pos_embed"]
    for key in entry:
        g = reference.grads[0][key]
        assert stats_match(entry[key][0], g)
        assert entry[key][0]["Norm"] == pytest.approx(float(g.double().norm()), rel=RTOL)


def _gpt2_hidden_states_run(dump=None):
    """One GPT-2 step returning all hidden states, with a loss that also reads the last
    one; recorded at L0 into ``dump`` when given. Returns (last hidden state with its
    gradient retained, dump.json data or None)."""
    torch.manual_seed(0)
    model = CASES["gpt2"].build()
    ids = CASES["gpt2"].batch(0)["input_ids"]
    dbg = None
    if dump is not None:
        dbg = PrecisionDebugger(dump_path=str(dump), level="L0")
        dbg.start(model)
    out = model(input_ids=ids, labels=ids, output_hidden_states=True)
    last = out.hidden_states[-1]
    if dump is None:
        last.retain_grad()
    (out.loss + last.sum() * 0.01).backward()
    if dbg is None:
        return last, None
    dbg.stop()
    dbg.step()
    dbg.close()
    return last, load_dump(dump)[0]["data"]


def test_one_output_tensor_in_two_places_is_an_alias(tmp_path):
    # GPT2Model returns its final hidden state as last_hidden_state and as hidden_states[-1]
    last, _ = _gpt2_hidden_states_run()
    _, data = _gpt2_hidden_states_run(tmp_path / "d")
    entry = data["Module.transformer.GPT2Model.backward.0"]["input"][0]
    assert_record(entry["last_hidden_state"], last.grad)  # nothing inside GPT2Model reads it
    first, alias = entry["last_hidden_state"], entry["hidden_states"][-1]
    assert alias["alias_of"] == "input.0.last_hidden_state"
    assert {k: alias[k] for k in ("Max", "Min", "Mean", "Norm")} == {k: first[k] for k in ("Max", "Min", "Mean", "Norm")}
    for rec in entry["hidden_states"][:-1]:  # read only inside the model: the caller's part is 0
        assert "alias_of" not in rec and (rec["Max"], rec["Min"], rec["Norm"]) == (0.0, 0.0, 0.0)
