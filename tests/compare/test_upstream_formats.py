"""Upstream's formats as upstream really writes them (docs/compare-upstream-formats.md):
mapping files in the shapes of mindstudio-probe 1.2.2's documentation and code and of 26.x,
compare.json keys, the bare ``-am/-cm/-lm`` flags next to our positionals, and the xlsx
words, messages and file names. Hand-written dump.json pairs; pairings known by
construction."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import msprobe.compare as C
from msprobe.cli import main
from msprobe.compare.errors import CompareInputError
from msprobe.compare.upstream_mapping import load_upstream, parse_data_name


def rec(values) -> dict:
    a = np.asarray(values, dtype=np.float64)
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(a.shape), "Max": float(a.max()),
            "Min": float(a.min()), "Mean": float(a.mean()), "Norm": float(np.sqrt((a * a).sum())),
            "requires_grad": False}


def write_dump(root: Path, data: dict, framework: str, rank: str = "rank") -> Path:
    d = root / "step0" / rank
    d.mkdir(parents=True, exist_ok=True)
    (d / "dump.json").write_text(json.dumps({"task": "statistics", "level": "mix", "framework": framework,
                                             "dump_data_dir": None, "data": data}))
    (d / "stack.json").write_text("{}")
    (d / "construct.json").write_text("{}")
    return root


def entry(inputs, outputs, module=False, kwargs=None) -> dict:
    e = {"input_args": [rec(x) for x in inputs], "input_kwargs": {k: rec(v) for k, v in (kwargs or {}).items()},
         "output": [rec(y) for y in outputs]}
    if module:
        e["parameters"] = {}
    return e


Q = np.array([1.0, 2.0, 3.0, 4.0])
K = np.array([-1.0, 0.5, 0.25, 8.0])
OUT = Q * K
EXTRA = np.array([7.0, 9.0])


def paired(r) -> dict:
    return dict(r.con.sql("SELECT t_name, b_name FROM alignment WHERE t_name IS NOT NULL AND b_name IS NOT NULL"
                          ).fetchall())


def leaf_rows(r, call: str) -> dict:
    return {(io, arg): (verdict, e) for io, arg, verdict, e in r.con.sql(
        f"SELECT io, arg, verdict, e FROM tensors WHERE t_call = '{call}' OR b_call = '{call}'").fetchall()}


# --- api_mapping ----------------------------------------------------------------------------

@pytest.fixture
def kwop(tmp_path):
    """MindSpore passes k as keyword ``other`` and returns an extra output; PyTorch takes (q, k)."""
    ms = write_dump(tmp_path / "ms", {"Functional.my_op.0.forward": entry([Q], [OUT, EXTRA], kwargs={"other": K})},
                    "mindspore")
    pt = write_dump(tmp_path / "pt", {"Torch.my_op2.0.forward": entry([Q, K], [OUT])}, "pytorch")
    return ms, pt


# upstream's documentation writes one entry as a plain mapping with ms_outputs/pt_outputs;
# upstream 1.2.2's code iterates a list and reads ms_output/pt_output: both load the same
API_DOC_STYLE = """ms_api: Functional.my_op
pt_api: Torch.my_op2
ms_args:
- 0
- other
pt_args:
- 0
- 1
ms_outputs:
- 0
pt_outputs:
- 0
"""
API_CODE_STYLE = """- ms_api: Functional.my_op
  pt_api: Torch.my_op2
  ms_args: [0, other]
  pt_args: [0, 1]
  ms_output: [0]
  pt_output: [0]
"""


@pytest.mark.parametrize("text", [API_DOC_STYLE, API_CODE_STYLE], ids=["docs", "code"])
def test_api_mapping_both_upstream_spellings(kwop, tmp_path, text):
    ms, pt = kwop
    f = tmp_path / "api_mapping.yaml"
    f.write_text(text)
    m = load_upstream(f, "api_mapping")
    assert m.api == {"Functional.my_op": "Torch.my_op2"}
    fwd = m.leaf["Torch.my_op2.forward"]
    assert fwd["input_args.0"] == "input_args.0" and fwd["input_kwargs.other"] == "input_args.1"
    assert fwd["output.0"] == "output.0" and fwd["*output"] == "output.unmapped"
    assert m.leaf["Torch.my_op2.backward"]["input.0"] == "input.0"      # output gradients follow ms_outputs
    r = C.compare(ms, pt, mapping=f)
    assert paired(r) == {"Torch.my_op2.0.forward": "Torch.my_op2.0.forward"}
    rows = leaf_rows(r, "Torch.my_op2.0.forward")
    # the keyword argument k pairs with PyTorch's argument 1: equal values
    assert rows[("input_args", "1")] == ("identical", 0.0) and rows[("input_args", "0")] == ("identical", 0.0)
    assert rows[("output", "0")] == ("identical", 0.0)
    # the output the list leaves out is not compared (upstream: "abandoned"): unpaired, not a divergence
    assert rows[("output", "unmapped.1")][0] == "unpaired"
    assert r.first[0] is None
    # -am FILE before the positionals, as upstream writes its flags first
    assert main(["compare", "-am", str(f), str(ms), str(pt)]) == 0


def test_api_mapping_keys_must_agree_and_lengths_match(tmp_path):
    f = tmp_path / "a.yaml"
    f.write_text("- ms_api: A.b\n  pt_api: C.d\n  ms_parameters: [weight]\n  pt_parameters: [weight, bias]\n")
    with pytest.raises(CompareInputError, match=r"line 3: item 0: ms_parameters and pt_parameters must both be "
                                                r"given, with equal lengths"):
        load_upstream(f, "api_mapping")
    f.write_text("- ms_api: A.b\n  pt_api: C.d\n  ms_parameters: [weight]\n  pt_parameters: [w]\n")
    assert load_upstream(f, "api_mapping").leaf["C.d.forward"] == {"parameters.weight": "parameters.w"}


# --- data_mapping ---------------------------------------------------------------------------

def test_data_mapping_keyword_argument_spelled_input(kwop, tmp_path):
    """Upstream's statistics rows name a keyword argument ``input.{name}``."""
    ms, pt = kwop
    assert parse_data_name("Functional.my_op.0.forward.input.other") == (
        "Functional.my_op.0.forward", "input_kwargs", "other")
    assert parse_data_name("Functional.my_op.0.forward.input.0.1") == (
        "Functional.my_op.0.forward", "input_args", "0.1")
    assert parse_data_name("Cell.a.B.backward.0.input.x") == ("Cell.a.B.backward.0", "input", "x")
    f = tmp_path / "data_mapping.yaml"
    f.write_text("Functional.my_op.0.forward.input.0: Torch.my_op2.0.forward.input.0\n"
                 "Functional.my_op.0.forward.input.other: Torch.my_op2.0.forward.input.1\n"
                 "Functional.my_op.0.forward.output.0: Torch.my_op2.0.forward.output.0\n")
    m = load_upstream(f, "data_mapping")
    assert m.calls == {"Functional.my_op.0.forward": "Torch.my_op2.0.forward"}
    assert {k: v for k, v in m.leaf["Torch.my_op2.0.forward"].items() if not k.startswith("*")} == {
        "input_args.0": "input_args.0", "input_kwargs.other": "input_args.1", "output.0": "output.0"}
    r = C.compare(ms, pt, mapping=f)
    rows = leaf_rows(r, "Torch.my_op2.0.forward")
    assert rows[("input_args", "1")] == ("identical", 0.0) and rows[("output", "0")] == ("identical", 0.0)
    assert rows[("output", "unmapped.1")][0] == "unpaired"     # not in the file: not compared, as upstream


# --- cell_mapping ---------------------------------------------------------------------------

def test_cell_mapping_exact_then_substring(tmp_path):
    ms = write_dump(tmp_path / "ms", {
        "Cell.fc2.Dense.forward.0": entry([Q], [OUT], True),
        "Cell.block.fc2.Dense.forward.0": entry([Q], [K], True),
        "Cell.dec.qkv.MindSpeedTELayerNormColumnParallelLinear.forward.0": entry([K], [OUT], True),
        "Cell.dec.proj.RowParallelLinear.forward.0": entry([OUT], [Q], True)}, "mindspore")
    pt = write_dump(tmp_path / "pt", {
        "Module.head.Linear.forward.0": entry([Q], [OUT], True),
        "Module.block.head.Linear.forward.0": entry([Q], [K], True),
        "Module.dec.qkv.TELayerNormColumnParallelLinear.forward.0": entry([K], [OUT], True),
        "Module.dec.proj.TERowParallelLinear.forward.0": entry([OUT], [Q], True)}, "pytorch")
    f = tmp_path / "cell_mapping.yaml"
    f.write_text("fc2.Dense: head.Linear\n"                       # by cell name (1.2.2 and 26.x)
                 "MindSpeedTELayerNormColumnParallelLinear: TELayerNormColumnParallelLinear\n"   # by string (26.x)
                 "RowParallelLinear: TERowParallelLinear\n")
    m = load_upstream(f, "cell_mapping")
    assert m.module == {"Cell.fc2.Dense": "Module.head.Linear"}
    assert list(m.cell_sub) == ["fc2.Dense", "MindSpeedTELayerNormColumnParallelLinear", "RowParallelLinear"]
    r = C.compare(ms, pt, mapping=f)
    assert paired(r) == {"Module.head.Linear.forward.0": "Module.head.Linear.forward.0",
                         "Module.block.head.Linear.forward.0": "Module.block.head.Linear.forward.0",
                         "Module.dec.qkv.TELayerNormColumnParallelLinear.forward.0":
                             "Module.dec.qkv.TELayerNormColumnParallelLinear.forward.0",
                         "Module.dec.proj.TERowParallelLinear.forward.0":
                             "Module.dec.proj.TERowParallelLinear.forward.0"}
    assert r.summary["unmatched"] == {"target": [], "baseline": []} and r.first[0] is None


# --- layer_mapping --------------------------------------------------------------------------

def test_layer_mapping_cell_root_and_dotted_keys(tmp_path):
    ms = write_dump(tmp_path / "ms", {
        "Cell.network_with_loss.PipelineCell.forward.0": entry([Q], [OUT], True),
        "Cell.network_with_loss.model.Model.forward.0": entry([Q], [OUT], True),
        "Cell.network_with_loss.model.language.Embedding.forward.0": entry([Q], [K], True)}, "mindspore")
    pt = write_dump(tmp_path / "pt", {
        "Module.module.PipelineCell.forward.0": entry([Q], [OUT], True),
        "Module.module.model.Model.forward.0": entry([Q], [OUT], True),
        "Module.module.lm.Embedding.forward.0": entry([Q], [K], True)}, "pytorch")
    f = tmp_path / "layer_mapping.yaml"
    # upstream 1.2.2's documentation names the root "Cell" (later "TopLayer"); a dotted key
    # spans two levels under a PipelineCell
    f.write_text("Cell:\n  network_with_loss: module\nPipelineCell:\n  model.language: lm\n")
    m = load_upstream(f, "layer_mapping")
    assert m.children == {"TopLayer": {"network_with_loss": "module"}, "PipelineCell": {"model.language": "lm"}}
    r = C.compare(ms, pt, mapping=f)
    assert set(paired(r).values()) == {"Module.module.PipelineCell.forward.0", "Module.module.model.Model.forward.0",
                                       "Module.module.lm.Embedding.forward.0"}
    assert r.summary["unmatched"] == {"target": [], "baseline": []}
    # both roots given: upstream reads Cell over TopLayer
    f.write_text("TopLayer:\n  network_with_loss: other\nCell:\n  network_with_loss: module\n")
    assert load_upstream(f, "layer_mapping").children == {"TopLayer": {"network_with_loss": "module"}}


# --- command line ---------------------------------------------------------------------------

def test_bare_mapping_flags_do_not_swallow_positionals(kwop, tmp_path):
    ms, pt = kwop
    out = tmp_path / "o"
    # the two positionals are read as TARGET and BASELINE (a swallowed one is exit 2); the
    # built-in mappings pair nothing of these two calls, so the verdict is inconclusive (4)
    for flag in ("-am", "--api_mapping", "-cm", "-lm"):
        assert main(["compare", flag, str(ms), str(pt), "-o", str(out)]) == 4, flag
        summary = json.loads((out / "summary.json").read_text())
        assert summary["unmatched"] == {"target": ["Functional.my_op"], "baseline": ["Torch.my_op2"]}
        assert summary["verdict"] == "inconclusive"
    assert main(["compare", str(ms), str(pt), "-lm", "-am"]) == 4
    # -dm needs its file, as upstream's
    assert main(["compare", str(ms), str(pt), "-dm"]) == 2


def test_upstream_flags_accepted(kwop, tmp_path, capsys):
    ms, pt = kwop
    # accepted (not exit 2); nothing of these two calls pairs without a mapping: inconclusive
    assert main(["compare", "-tp", str(ms), "-gp", str(pt), "-m", "auto", "-c", "-hl", "-tensor_log", "-fm", "-da",
                 "-s"]) == 4
    assert main(["compare", "-tp", str(ms), "-gp", str(pt), "-m", "offline_data"]) == 2
    assert "--mode: got 'offline_data'; allowed: auto, md5, statistics, tensor" in capsys.readouterr().err


def two_ranks(root: Path, framework="pytorch", scale=(1.0, 1.0)) -> Path:
    for rank, s in zip(("rank0", "rank1"), scale):
        write_dump(root, {"Torch.mul.0.forward": entry([Q * s], [OUT * s])}, framework, rank)
    return root


def test_compare_json_keys(tmp_path, capsys):
    t = two_ranks(tmp_path / "t", scale=(1.0, 2.0))
    b = two_ranks(tmp_path / "b")
    spec = tmp_path / "compare.json"
    # upstream's kernel-compare keys rank_id/step_id select ranks and steps
    spec.write_text(json.dumps({"npu_path": str(t / "step0"), "bench_path": str(b / "step0"),
                                "is_print_compare_log": False, "rank_id": [0], "step_id": []}))
    out = tmp_path / "o"
    assert main(["compare", "-i", str(spec), "-o", str(out)]) == 0
    assert [r["rank"] for r in json.loads((out / "summary.json").read_text())["ranks"]] == [0]
    spec.write_text(json.dumps({"npu_path": str(t / "step0"), "bench_path": str(b / "step0")}))
    assert main(["compare", "-i", str(spec), "-o", str(out)]) == 1       # rank 1 diverges
    for bad, message in [({"npu_path": 3, "bench_path": "x"}, "field 'npu_path': expected a path"),
                         ({"npu_path": "a", "bench_path": "b", "stack_path": str(tmp_path / "none.json")},
                          "field 'stack_path': expected an existing stack.json"),
                         ({"npu_path": "a", "bench_path": "b", "is_print_compare_log": "yes"},
                          "field 'is_print_compare_log': expected true or false"),
                         ({"npu_path": "a", "bench_path": "b", "rank_id": "0"}, "field 'rank_id': expected a list")]:
        spec.write_text(json.dumps(bad))
        assert main(["compare", "-i", str(spec)]) == 2
        assert message in capsys.readouterr().err


# --- xlsx -----------------------------------------------------------------------------------

def test_xlsx_unmatched_rows_and_rank_pair_names(kwop, tmp_path):
    openpyxl = pytest.importorskip("openpyxl")
    ms, pt = kwop
    f = tmp_path / "api_mapping.yaml"
    f.write_text(API_CODE_STYLE)
    out = tmp_path / "o"
    C.compare(ms, pt, out=out, formats="xlsx", mapping=f)
    (book,) = out.glob("compare_result_*.xlsx")
    assert re.fullmatch(r"compare_result_\d{14}\.xlsx", book.name)
    rows = list(openpyxl.load_workbook(book).active.iter_rows(values_only=True))
    header = list(rows[0])
    # no stacks recorded: no NPU_Stack_Info column (upstream adds it only with stack information)
    assert "NPU_Stack_Info" not in header and header[-2:] == ["Result", "Err_message"]
    col = {c: i for i, c in enumerate(header)}
    by_name = {r[col["NPU Name"]]: r for r in rows[1:]}
    # the output api_mapping leaves out has no bench row: upstream 1.2.2's words for it
    lone = by_name["Torch.my_op2.0.forward.output.unmapped.1"]
    assert (lone[col["Bench Name"]], lone[col["Result"]], lone[col["Err_message"]]) == \
        ("N/A", "N/A", "No bench data matched.")
    kw = by_name["Torch.my_op2.0.forward.input.1"]    # MindSpore's keyword argument, paired with PyTorch's arg 1
    assert kw[col["Bench Name"]] == "Torch.my_op2.0.forward.input.1" and kw[col["Max diff"]] == 0
    assert kw[col["Result"]] in ("", None) and kw[col["MaxRelativeErr"]] == "0.0%"
    # several ranks: one workbook per rank pair, TARGET rank then BASELINE rank
    t = two_ranks(tmp_path / "t")
    b = two_ranks(tmp_path / "b")
    out2 = tmp_path / "o2"
    assert main(["compare", str(t), str(b), "--xlsx", "-o", str(out2), "--rank-map", "0:1,1:0"]) == 0
    names = sorted(p.name for p in out2.glob("*.xlsx"))
    assert len(names) == 2 and re.fullmatch(r"compare_result_rank0-rank1_\d{14}\.xlsx", names[0]) and \
        re.fullmatch(r"compare_result_rank1-rank0_\d{14}\.xlsx", names[1])
