"""The built-in MindSpore → PyTorch table (msprobe/compare/ms_pt_table.yaml): every name in
it is one our recorders can give, and candidates resolve against the BASELINE's names."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from msprobe.compare.builtin_table import builtin_mapping, table_entries
from msprobe.compare.errors import CompareInputError
from msprobe.compare.mapping import Mapping, resolve_api

ROOT = Path(__file__).resolve().parents[2]
MS_FAMILIES = {"ops": "Functional", "tensor": "Tensor", "mint.ops": "Mint", "mint.nn.functional": "MintFunctional",
               "communication.comm_func": "Distributed"}
PT_FAMILIES = {"functional": "Functional", "tensor": "Tensor", "torch": "Torch", "distributed": "Distributed"}


def _names(path: Path, families: dict) -> set[str]:
    doc = yaml.safe_load(path.read_text())
    return {f"{families[k]}.{n}" for k, names in doc.items() if k in families for n in (names or [])}


def test_table_names_are_recorded_names():
    ms = _names(ROOT / "msprobe" / "mindspore" / "support_wrap_ops.yaml", MS_FAMILIES)
    pt = _names(ROOT / "msprobe" / "pytorch" / "support_wrap_ops.yaml", PT_FAMILIES)
    m = builtin_mapping()
    assert sorted(k for k in m.candidates if k not in ms) == []
    assert sorted((k, c) for k, cs in m.candidates.items() for c in cs if c not in pt) == []
    assert sorted((k, c) for k, cs in m.primitive.items() for c in cs if c not in pt) == []
    assert set(m.families) <= set(MS_FAMILIES.values())
    assert {f for fs in m.families.values() for f in fs} <= set(PT_FAMILIES.values())
    assert m.module == {"Cell": "Module"} and m.layer["Dense"] == "Linear"
    assert table_entries(m)["api"] == len(m.candidates) > 20


def test_candidates_resolve_against_the_baseline():
    m = builtin_mapping()
    # the first candidate the BASELINE recorded wins; then the same name; then the families
    assert resolve_api(m, ["Primitive.act.Tanh"], ["Functional.tanh", "Tensor.tanh"]) == \
        {"Primitive.act.Tanh": "Functional.tanh"}
    assert resolve_api(m, ["Functional.softmax"], ["Functional.softmax", "Torch.softmax"]) == {}
    assert resolve_api(m, ["Functional.add"], ["Tensor.add", "Torch.add"]) == {"Functional.add": "Torch.add"}
    assert resolve_api(m, ["Functional.concat"], ["Torch.concat", "Torch.cat"]) == {"Functional.concat": "Torch.cat"}
    assert resolve_api(m, ["Functional.concat"], []) == {}          # nothing recorded: unchanged
    # the user's api entries win over the table
    user = Mapping(api={"Functional.concat": "Torch.stack"}).merged_over(m)
    assert resolve_api(user, ["Functional.concat"], ["Torch.cat"]) == {"Functional.concat": "Torch.stack"}


def test_bad_table_is_named(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text("api:\n  Functional.concat: Torch.cat\n")
    with pytest.raises(CompareInputError, match=r"api.Functional.concat: expected a list of names"):
        builtin_mapping(str(f))
    f.write_text("apis: {}\n")
    with pytest.raises(CompareInputError, match="allowed sections module, layer, families, api, primitive"):
        builtin_mapping(str(f))
