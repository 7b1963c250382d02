"""Upstream's four mapping files (``-dm``, ``-am``, ``-cm``, ``-lm``, and ``--mapping`` with
any of them), converted into our mapping model, on hand-written MindSpore-vs-PyTorch
dump.json pairs whose pairings are known by construction; bad files name line and key."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import msprobe.compare as C
from msprobe.cli import main
from msprobe.compare.errors import CompareInputError
from msprobe.compare.mapping import load_mapping
from msprobe.compare.upstream_mapping import detect, load_upstream, parse_data_name


def rec(values) -> dict:
    a = np.asarray(values, dtype=np.float64)
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(a.shape), "Max": float(a.max()),
            "Min": float(a.min()), "Mean": float(a.mean()), "Norm": float(np.sqrt((a * a).sum())),
            "requires_grad": False}


def write_dump(root: Path, data: dict, framework: str) -> Path:
    d = root / "step0" / "rank"
    d.mkdir(parents=True, exist_ok=True)
    (d / "dump.json").write_text(json.dumps({"task": "statistics", "level": "mix", "framework": framework,
                                             "dump_data_dir": None, "data": data}))
    (d / "stack.json").write_text("{}")
    (d / "construct.json").write_text("{}")
    return root


def entry(inputs, outputs, module=False) -> dict:
    e = {"input_args": [rec(x) for x in inputs], "input_kwargs": {}, "output": [rec(y) for y in outputs]}
    if module:
        e["parameters"] = {}
    return e


Q = np.array([1.0, 2.0, 3.0, 4.0])
K = np.array([-1.0, 0.5, 0.25, 8.0])
S = np.array([0.1, 0.2])
OUT = Q * K


def paired(r) -> dict:
    return dict(r.con.sql("SELECT t_name, b_name FROM alignment WHERE t_name IS NOT NULL AND b_name IS NOT NULL"
                          ).fetchall())


# --- cell_mapping ---------------------------------------------------------------------------

@pytest.fixture
def cells(tmp_path):
    ms = write_dump(tmp_path / "ms", {"Cell.conv1.Conv2d.forward.0": entry([Q], [OUT], True),
                                      "Cell.fc2.Dense.forward.0": entry([OUT], [K], True)}, "mindspore")
    pt = write_dump(tmp_path / "pt", {"Module.conv3.Conv2d.forward.0": entry([Q], [OUT], True),
                                      "Module.fc2.Linear.forward.0": entry([OUT], [K], True)}, "pytorch")
    f = tmp_path / "cell_mapping.yaml"
    f.write_text("# MindSpore cell: PyTorch module\nconv1.Conv2d: conv3.Conv2d\n")
    return ms, pt, f


def test_cell_mapping_pairs_renamed_cells(cells, tmp_path):
    ms, pt, f = cells
    r = C.compare(ms, pt)
    assert paired(r) == {"Module.fc2.Linear.forward.0": "Module.fc2.Linear.forward.0"}   # built-in Dense -> Linear
    assert r.summary["unmatched"] == {"target": ["Cell.conv1.Conv2d"], "baseline": ["Module.conv3.Conv2d"]}
    m = load_upstream(f, "cell_mapping")
    assert m.module == {"Cell.conv1.Conv2d": "Module.conv3.Conv2d"}
    for argv in (["-cm", str(f)], ["--cell_mapping", str(f)], ["--mapping", str(f)]):
        out = tmp_path / argv[0].strip("-")
        assert main(["compare", str(ms), str(pt), "-o", str(out)] + argv) == 0
        summary = json.loads((out / "summary.json").read_text())
        assert summary["unmatched"] == {"target": [], "baseline": []}
        assert summary["ranks"][0]["counts"] == {"pass": 2, "propagated": 0, "origin": 0, "unpaired": 0}
    # -cm without a file (upstream: the built-in cell table): ours applies anyway; conv1 stays unmatched
    assert main(["compare", str(ms), str(pt), "-cm"]) == 0


# --- api_mapping ----------------------------------------------------------------------------

@pytest.fixture
def attention(tmp_path):
    # MindSpore's op takes (q, k, scale); PyTorch's takes (k, q): args 0, 1 map to 1, 0; scale is not compared
    ms = write_dump(tmp_path / "ms", {"Functional.flash_attention_score.0.forward": entry([Q, K, S], [OUT])},
                    "mindspore")
    pt = write_dump(tmp_path / "pt", {"NPU.npu_fusion_attention.0.forward": entry([K, Q], [OUT])}, "pytorch")
    return ms, pt


API_MAPPING = """- ms_api: Functional.flash_attention_score
  pt_api: NPU.npu_fusion_attention
  ms_args: [0, 1]
  pt_args: [1, 0]
  ms_outputs: [0]
  pt_outputs: [0]
"""


def test_api_mapping_renames_and_reorders_arguments(attention, tmp_path):
    ms, pt = attention
    f = tmp_path / "api_mapping.yaml"
    f.write_text(API_MAPPING)
    import yaml
    assert detect(yaml.safe_load(API_MAPPING), ("api",)) == "api_mapping"
    assert detect(yaml.safe_load(DATA_MAPPING), ("api",)) == "data_mapping"
    assert detect(yaml.safe_load(LAYER_MAPPING), ("api",)) == "layer_mapping"
    assert detect({"fc2.Dense": "fc2.Linear"}, ("api",)) == "cell_mapping"
    assert detect({"api": {}}, ("api",)) is None
    m = load_upstream(f, "api_mapping")
    assert m.api == {"Functional.flash_attention_score": "NPU.npu_fusion_attention"}
    assert m.leaf["NPU.npu_fusion_attention.forward"]["input_args.0"] == "input_args.1"
    r = C.compare(ms, pt, mapping=f)
    assert paired(r) == {"NPU.npu_fusion_attention.0.forward": "NPU.npu_fusion_attention.0.forward"}
    rows = {(io, arg): (v, e) for io, arg, v, e in r.con.sql(
        "SELECT io, arg, verdict, e FROM tensors WHERE t_call = 'NPU.npu_fusion_attention.0.forward'").fetchall()}
    # q (MindSpore arg 0) pairs with PyTorch arg 1 and k with arg 0: equal values, e = 0
    assert rows[("input_args", "1")][1] == 0.0 and rows[("input_args", "0")][1] == 0.0
    assert rows[("output", "0")][1] == 0.0
    assert r.exit_code == 0 and r.first[0] is None
    assert r.summary["unmatched"] == {"target": [], "baseline": []}
    assert main(["compare", str(ms), str(pt), "-am", str(f)]) == 0
    # without the file the calls do not pair
    r0 = C.compare(ms, pt)
    assert r0.summary["unmatched"] == {"target": ["Functional.flash_attention_score"],
                                       "baseline": ["NPU.npu_fusion_attention"]}


# --- data_mapping ---------------------------------------------------------------------------

DATA_MAPPING = """Functional.flash_attention_score.0.forward.input.0: NPU.npu_fusion_attention.0.forward.input.1
Functional.flash_attention_score.0.forward.input.1: NPU.npu_fusion_attention.0.forward.input.0
Functional.flash_attention_score.0.forward.output.0: NPU.npu_fusion_attention.0.forward.output.0
"""


def test_data_mapping_renames_one_call_and_its_leaves(attention, tmp_path):
    ms, pt = attention
    f = tmp_path / "data_mapping.yaml"
    f.write_text(DATA_MAPPING)
    m = load_upstream(f, "data_mapping")
    assert m.calls == {"Functional.flash_attention_score.0.forward": "NPU.npu_fusion_attention.0.forward"}
    assert m.leaf == {"NPU.npu_fusion_attention.0.forward": {
        "input_args.0": "input_args.1", "input_args.1": "input_args.0", "output.0": "output.0",
        # leaves the file does not list are not compared (upstream compares only the listed pairs)
        "*input_args": "input_args.unmapped", "*input_kwargs": "input_kwargs.unmapped",
        "*output": "output.unmapped", "*parameters": "parameters.unmapped"}}
    assert main(["compare", str(ms), str(pt), "-dm", str(f), "-o", str(tmp_path / "o")]) == 0
    r = C.compare(ms, pt, mapping=f)     # detected from the file's shape
    assert paired(r) == {"NPU.npu_fusion_attention.0.forward": "NPU.npu_fusion_attention.0.forward"}
    es = r.con.sql("SELECT io, arg, e, verdict FROM tensors ORDER BY io, arg").fetchall()
    # q and k pair crosswise (equal values); the scale, not in the file, has no counterpart
    assert es == [("input_args", "0", 0.0, "identical"), ("input_args", "1", 0.0, "identical"),
                  ("input_args", "unmapped.2", None, "unpaired"), ("output", "0", 0.0, "identical")]


def test_parse_data_name():
    assert parse_data_name("Functional.conv2d.0.forward.input.1") == ("Functional.conv2d.0.forward", "input_args", "1")
    assert parse_data_name("Torch.add.0.forward.kwargs.other") == ("Torch.add.0.forward", "input_kwargs", "other")
    assert parse_data_name("Cell.fc.Dense.backward.0.input.0") == ("Cell.fc.Dense.backward.0", "input", "0")
    assert parse_data_name("Torch.cat.0.forward.input.0.1") == ("Torch.cat.0.forward", "input_args", "0.1")
    assert parse_data_name("Module.fc.Linear.parameters_grad.weight") == ("Module.fc.Linear.parameters_grad",
                                                                          "weight", "")
    assert parse_data_name("Functional.conv2d") is None


# --- layer_mapping --------------------------------------------------------------------------

LAYER_MAPPING = """TopLayer:                 # names under the root network
  network_with_loss: module
Net:
  attn: self_attention
ParallelAttention:
  qkv_proj: query_key_value
"""


def test_layer_mapping_renames_attributes_per_class(tmp_path):
    ms = write_dump(tmp_path / "ms", {
        "Cell.network_with_loss.attn.qkv_proj.Dense.forward.0": entry([Q], [OUT], True),
        "Cell.network_with_loss.attn.ParallelAttention.forward.0": entry([Q], [OUT], True),
        "Cell.network_with_loss.Net.forward.0": entry([Q], [OUT], True)}, "mindspore")
    pt = write_dump(tmp_path / "pt", {
        "Module.module.self_attention.query_key_value.Linear.forward.0": entry([Q], [OUT], True),
        "Module.module.self_attention.ParallelAttention.forward.0": entry([Q], [OUT], True),
        "Module.module.Net.forward.0": entry([Q], [OUT], True)}, "pytorch")
    f = tmp_path / "layer_mapping.yaml"
    f.write_text(LAYER_MAPPING)
    assert load_upstream(f, "layer_mapping").children["ParallelAttention"] == {"qkv_proj": "query_key_value"}
    r = C.compare(ms, pt, mapping=f)
    assert set(paired(r).values()) == {"Module.module.self_attention.query_key_value.Linear.forward.0",
                                       "Module.module.self_attention.ParallelAttention.forward.0",
                                       "Module.module.Net.forward.0"}
    assert r.summary["unmatched"] == {"target": [], "baseline": []}
    assert main(["compare", str(ms), str(pt), "-lm", str(f)]) == 0
    r0 = C.compare(ms, pt)
    assert len(r0.summary["unmatched"]["target"]) == 3


def test_several_files_merge(attention, cells, tmp_path):
    ms, pt = attention
    a = tmp_path / "a.yaml"
    a.write_text(API_MAPPING)
    c = tmp_path / "c.yaml"
    c.write_text("conv1.Conv2d: conv3.Conv2d\n")
    m = load_mapping([a, c])
    assert m.api and m.module == {"Cell.conv1.Conv2d": "Module.conv3.Conv2d"}
    assert main(["compare", str(ms), str(pt), "-am", str(a), "-cm", str(c)]) == 0


# --- bad files ------------------------------------------------------------------------------

@pytest.mark.parametrize("flag, text, message", [
    ("-am", "- ms_api: Functional.conv2d\n  pt_api: Torch.conv2d\n  ms_arg: [0]\n",
     "line 3: item 0: unknown key 'ms_arg'; allowed: ms_api, pt_api"),
    ("-am", "- ms_api: Functional.conv2d\n- pt_api: Torch.conv2d\n", "line 1: item 0: key 'pt_api'"),
    ("-am", "- ms_api: A.b\n  pt_api: C.d\n  ms_args: [0, 1]\n  pt_args: [0]\n",
     "line 3: item 0: ms_args and pt_args must both be given, with equal lengths"),
    ("-am", "- ms_api: A.b\n  pt_api: C.d\n  ms_args: [0, 0]\n  pt_args: [0, 1]\n",
     "line 3: key 'ms_args': expected a list of distinct argument indexes"),
    ("-am", "- ms_api: A.b\n  pt_api: C.d\n  ms_args: [-1]\n  pt_args: [0]\n", "line 3: key 'ms_args'"),
    ("-am", "ms_api: A.b\nms_args: [0]\n", "line 1: item 0: key 'pt_api'"),
    ("-am", "ms_api: A.b\npt_api: C.d\nms_outputs: [0]\npt_outputs: [0]\nms_output: [1]\npt_output: [0]\n",
     "line 5: ms_outputs and ms_output (the same list) differ"),
    ("-am", "fc2.Dense: fc2.Linear\n", "expected a list of entries"),
    ("-cm", "fc2.Dense: [fc2.Linear]\n", "line 1: key 'fc2.Dense': expected a name: name pair"),
    ("-cm", "conv1..Conv2d: conv3.Conv2d\n", "line 1: 'conv1..Conv2d': expected a cell/module name 'path.Class'"),
    ("-dm", "Functional.a.0.forward.input.0: Torch.a.0.forward.input.0\nFunctional.b.0.forward: Torch.b\n",
     "line 2: key 'Functional.b.0.forward' is not a data name"),
    ("-dm", "A.b.0.forward.input.0: C.d.0.backward.input.0\n", "line 1: 'A.b.0.forward.input.0' and "
     "'C.d.0.backward.input.0': directions differ"),
    ("-lm", "TopLayer:\n  network_with_loss: module\nAttention:\n  q..proj: query\n",
     "line 4: Attention: 'q..proj': 'query': expected attribute names like 'qkv_proj' or dotted paths"),
    ("-lm", "TopLayer:\n  network_with_loss: [module]\n", "line 2: key 'network_with_loss'"),
    ("-lm", "TopLayer: [\n", "YAML error"),
])
def test_bad_upstream_files_name_line_and_key(attention, tmp_path, capsys, flag, text, message):
    ms, pt = attention
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    kind = {"-am": "api_mapping", "-cm": "cell_mapping", "-dm": "data_mapping", "-lm": "layer_mapping"}[flag]
    with pytest.raises(CompareInputError, match=re.escape(message)):
        load_upstream(f, kind)
    assert main(["compare", str(ms), str(pt), flag, str(f)]) == 2
    err = capsys.readouterr().err
    assert f"{flag}/--{kind} '{f}'" in err and "line" in err


def test_mapping_flag_detects_upstream_formats(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("- ms_api: A.b\n  pt_api: C.d\n  extra: 1\n")
    with pytest.raises(CompareInputError, match=r"--mapping '.*m.yaml': line 3: item 0: unknown key 'extra'"):
        load_mapping(f)


def test_mapping_flag_names_the_bad_key_of_a_data_mapping(tmp_path):
    f = tmp_path / "d.yaml"
    f.write_text("Functional.a.0.forward.input.0: Torch.a.0.forward.input.0\nFunctional.b: Torch.b\n")
    with pytest.raises(CompareInputError, match=r"--mapping '.*d.yaml': line 2: key 'Functional.b' is not a data name"):
        load_mapping(f)
