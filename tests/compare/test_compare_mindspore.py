"""PyTorch vs MindSpore (CPU PyNative), the same two-layer network,
weights and input. With a mapping (Cell → Module, Dense → Linear) every call pairs and
nothing diverges under ``--tol loose``; a different MindSpore activation (Tanh, mapped
onto ReLU) is the first origin; unmapped, the unmatched names are listed. Plus the
mapping file's sections and its errors (line, key)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

import torch  # noqa: E402

import msprobe.compare as C  # noqa: E402
from msprobe.cli import main  # noqa: E402
from msprobe.compare.errors import CompareInputError  # noqa: E402
from msprobe.compare.mapping import load_mapping  # noqa: E402

RNG = np.random.default_rng(0)
W1, B1 = RNG.standard_normal((3, 4)).astype(np.float32), RNG.standard_normal(3).astype(np.float32)
W2, B2 = RNG.standard_normal((2, 3)).astype(np.float32), RNG.standard_normal(2).astype(np.float32)
X = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)

MAPPING = """# PyTorch names for the MindSpore side
module:
  Cell: Module
layer:
  Dense: Linear
"""


def record_torch(path, level="L0"):
    import torch.nn as nn
    from msprobe.pytorch import PrecisionDebugger

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.d1, self.relu, self.d2 = nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)

        def forward(self, x):
            return self.d2(self.relu(self.d1(x)))

    net = Net()
    with torch.no_grad():
        for p, v in zip((net.d1.weight, net.d1.bias, net.d2.weight, net.d2.bias), (W1, B1, W2, B2)):
            p.copy_(torch.from_numpy(v))
    dbg = PrecisionDebugger(dump_path=str(path), level=level, task="statistics")
    dbg.start(model=net)
    net(torch.from_numpy(X)).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    return path


def record_ms(path, activation="ReLU", level="L0"):
    from mindspore import Tensor, nn
    from msprobe.mindspore import PrecisionDebugger
    ms.set_device("CPU")

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.d1, self.relu, self.d2 = nn.Dense(4, 3), getattr(nn, activation)(), nn.Dense(3, 2)

        def construct(self, x):
            return self.d2(self.relu(self.d1(x)))

    net = Net()
    for p, v in zip(net.trainable_params(), (W1, B1, W2, B2)):
        p.set_data(Tensor(v))
    dbg = PrecisionDebugger(dump_path=str(path), level=level, task="statistics")
    dbg.start(model=net)
    ms.value_and_grad(lambda i: net(i).sum(), None, net.trainable_params())(Tensor(X))
    dbg.stop()
    dbg.step()
    if hasattr(dbg, "close"):
        dbg.close()
    return path


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("pt_ms")
    (d / "map.yaml").write_text(MAPPING)
    (d / "map_tanh.yaml").write_text(MAPPING + "  Tanh: ReLU\n")
    return {"pt": record_torch(d / "pt"), "ms": record_ms(d / "ms"), "ms_tanh": record_ms(d / "ms_tanh", "Tanh"),
            "map": d / "map.yaml", "map_tanh": d / "map_tanh.yaml"}


def test_mapped_all_calls_pair_no_origin(pair, tmp_path):
    r = C.compare(pair["ms"], pair["pt"], mapping=pair["map"], tol="loose")
    counts = r.summary["ranks"][0]["counts"]
    n_pt = r.con.sql("SELECT count(*) FROM b_calls").fetchall()[0][0]
    assert counts["unpaired"] == 0 and counts["origin"] == 0 and counts["pass"] == n_pt == 8
    assert r.exit_code == 0 and r.summary["unmatched"] == {"target": [], "baseline": []}
    pairs = dict(r.con.sql("SELECT b_name, how FROM alignment").fetchall())
    assert set(pairs) >= {"Module.d1.Linear.forward.0", "Module.d2.Linear.backward.0",
                          "Module.d1.Linear.parameters_grad"}
    # every float32 leaf agrees to well within the loose rtol (1e-4); independent check of one
    (e,), = r.con.sql("SELECT e FROM tensors WHERE t_call = 'Module.d1.Linear.forward.0' AND io = 'output'").fetchall()
    assert e < 1e-6
    assert main(["compare", str(pair["ms"]), str(pair["pt"]), "--mapping", str(pair["map"]), "--tol", "loose"]) == 0


def test_different_activation_is_first_origin(pair):
    r = C.compare(pair["ms_tanh"], pair["pt"], mapping=pair["map_tanh"], tol="loose")
    first = r.first[0]
    assert first["name"] == "Cell.relu.Tanh.forward.0"          # reported in the target's own name
    assert first["baseline_name"] == "Module.relu.ReLU.forward.0"
    assert first["direction"] == "forward"
    # the d1 layer before it passes
    (v,), = r.con.sql("SELECT verdict FROM calls WHERE t_name = 'Module.d1.Linear.forward.0'").fetchall()
    assert v == "pass"


def test_unmapped_uses_builtin_table_and_lists_unmatched_names(pair, capsys):
    # no mapping: the built-in table maps Cell -> Module and Dense -> Linear, so every call pairs
    r = C.compare(pair["ms"], pair["pt"], tol="loose")
    counts = r.summary["ranks"][0]["counts"]
    assert counts == {"pass": 8, "propagated": 0, "origin": 0, "unpaired": 0}
    assert r.summary["unmatched"] == {"target": [], "baseline": []}
    assert any("frameworks differ" in n and "built-in MindSpore/PyTorch table" in n for n in r.summary["notes"])
    # a layer class with no PyTorch counterpart here (Tanh vs ReLU) stays unmatched and is listed
    r = C.compare(pair["ms_tanh"], pair["pt"], tol="loose")
    assert r.summary["unmatched"] == {"target": ["Cell.relu.Tanh"], "baseline": ["Module.relu.ReLU"]}
    assert r.con.sql("SELECT b_name FROM alignment WHERE b_name = 'Module.d1.Linear.forward.0' "
                     "AND t_name IS NOT NULL").fetchall()
    main(["compare", str(pair["ms_tanh"]), str(pair["pt"])])
    assert "unmatched target names: Cell.relu.Tanh" in capsys.readouterr().out


def test_builtin_table_renames_the_mindspore_baseline(pair):
    # PyTorch TARGET, MindSpore BASELINE: the table renames the BASELINE; the unmatched
    # listing shows the names MindSpore recorded
    r = C.compare(pair["pt"], pair["ms"], tol="loose")
    assert r.summary["ranks"][0]["counts"] == {"pass": 8, "propagated": 0, "origin": 0, "unpaired": 0}
    r = C.compare(pair["pt"], pair["ms_tanh"], tol="loose")
    assert r.summary["unmatched"] == {"target": ["Module.relu.ReLU"], "baseline": ["Cell.relu.Tanh"]}
    # the first divergence keeps the TARGET's (PyTorch) name: d2 sees ReLU vs Tanh outputs
    first = r.summary["ranks"][0]["first_origin"] or r.summary["ranks"][0]["first_diverged"]
    assert first["name"].startswith("Module.")


def test_mapping_api_leaf_ignore_sections(tmp_path):
    m = load_mapping({"api": {"Primitive.relu.ReLU": "Functional.relu"},
                      "leaf": {"Functional.linear": {"input_args.1": "input_args.2"}},
                      "ignore": ["Primitive.shape_op"]})
    assert m.api["Primitive.relu.ReLU"] == "Functional.relu" and m.ignore == ("Primitive.shape_op",)


@pytest.mark.parametrize("text, message", [
    ("module:\n  Cell: Module\nlayers:\n  Dense: Linear\n", "line 3: unknown key 'layers'; allowed sections"),
    ("module:\n  - Cell\n", "line 1: section 'module': expected a mapping"),
    ("ignore: Primitive\n", "section 'ignore': expected a list"),
    ("leaf:\n  Functional.linear:\n    x: y\n", "section 'leaf', 'Functional.linear': got 'x': 'y'"),
    ("module: [\n", "YAML error"),
])
def test_bad_mapping_names_line_and_key(tmp_path, text, message):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(CompareInputError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_mapping(f)
    assert main(["compare", str(f), str(f), "--mapping", str(f)]) == 2


MIX_MAPPING = MAPPING + """api:
  Primitive.bias_add.BiasAdd: Functional.linear
  Primitive.relu.ReLU: Functional.relu
leaf:
  Functional.linear.forward:     # BiasAdd(x @ W.T, b) vs linear(x, W, b): only b and the output pair
    input_args.0: input_args.matmul_result
    input_args.1: input_args.2
  Functional.linear.backward:
    output.0: output.matmul_result
    output.1: output.2
ignore:
  - Primitive.shape_op.Shape
  - Primitive.matmul.MatMul
"""

#: the mapping file README.md shows for the same comparison (its only ```yaml block)
README_MAPPING = re.search(r"```yaml\n(.*?)```", (Path(__file__).resolve().parents[2] / "README.md")
                           .read_text(encoding="utf-8"), flags=re.DOTALL).group(1)


def _n_paired(r) -> int:
    return r.con.sql("SELECT count(*) FROM alignment WHERE t_name IS NOT NULL AND b_name IS NOT NULL").fetchall()[0][0]


def test_mix_level_api_leaf_ignore_mapping_pairs_every_call(tmp_path, monkeypatch):
    pt = record_torch(tmp_path / "pt", level="mix")
    msd = record_ms(tmp_path / "ms", level="mix")
    f = tmp_path / "mix.yaml"
    f.write_text(MIX_MAPPING)
    r = C.compare(msd, pt, mapping=f, tol="loose")
    counts = r.summary["ranks"][0]["counts"]
    n_pt = r.con.sql("SELECT count(*) FROM b_calls").fetchall()[0][0]
    assert counts == {"pass": n_pt, "propagated": 0, "origin": 0, "unpaired": 0} and n_pt == 16
    assert r.summary["unmatched"] == {"target": [], "baseline": []}
    assert "TARGET: 6 calls ignored by the mapping" in r.summary["notes"]   # 2 Shape + 2 MatMul fwd/bwd
    pairs = dict(r.con.sql("SELECT t_name, b_name FROM alignment").fetchall())
    assert pairs["Functional.linear.1.forward"] == "Functional.linear.1.forward"
    # BiasAdd's bias input pairs with linear's input_args.2; the output agrees (numpy check)
    (e,), = r.con.sql("SELECT e FROM tensors WHERE t_call = 'Functional.linear.0.forward' AND io = 'input_args' "
                      "AND arg = '2'").fetchall()
    assert e == 0.0 or e < 1e-7
    h = X.astype(np.float64) @ W1.T.astype(np.float64) + B1
    (t_mean,), = r.con.sql("SELECT t_mean FROM tensors WHERE t_call = 'Functional.linear.0.forward' "
                           "AND io = 'output'").fetchall()
    assert t_mean == pytest.approx(h.mean(), rel=1e-5)
    # README's copy of this file, as a user would paste it, pairs the same way: every call
    # passes, backward included (linear's input gradients against BiasAdd's)
    readme = tmp_path / "readme.yaml"
    readme.write_text(README_MAPPING)
    r = C.compare(msd, pt, mapping=readme, tol="loose")
    assert r.summary["ranks"][0]["counts"] == {"pass": 16, "propagated": 0, "origin": 0, "unpaired": 0}
    assert r.exit_code == 0 and r.summary["unmatched"] == {"target": [], "baseline": []}
    (n,), = r.con.sql("SELECT count(*) FROM tensors WHERE b_call = 'Functional.linear.1.backward' AND io = 'output' "
                      "AND t_norm IS NOT NULL AND b_norm IS NOT NULL").fetchall()
    assert n == 1   # the bias gradient; x's gradient has no MindSpore counterpart
    # no mapping: the built-in table pairs the Dense/Linear modules and ReLU with F.relu (12 of the
    # 16 PyTorch calls); Dense's MatMul + BiasAdd against F.linear need the file above
    r = C.compare(msd, pt, tol="loose")
    assert _n_paired(r) == 12 and r.exit_code == 0
    assert r.summary["unmatched"] == {"target": ["Primitive.bias_add.BiasAdd", "Primitive.matmul.MatMul",
                                                 "Primitive.shape_op.Shape"], "baseline": ["Functional.linear"]}
    import msprobe.compare.builtin_table as bt
    from msprobe.compare.mapping import BUILTIN
    monkeypatch.setattr(bt, "builtin_mapping", lambda path=None: BUILTIN)   # Cell -> Module only
    assert _n_paired(C.compare(msd, pt, tol="loose")) == 4


# --- the built-in table at API level: the same computation through functional APIs -------------
W3 = np.random.default_rng(2).standard_normal((4, 3)).astype(np.float32)
W4 = np.random.default_rng(3).standard_normal((6, 2)).astype(np.float32)


def record_torch_functional(path):
    import torch.nn.functional as F
    from msprobe.pytorch import PrecisionDebugger

    dbg = PrecisionDebugger(dump_path=str(path), level="L1", task="statistics")
    dbg.start()
    x = torch.from_numpy(X)
    h = torch.matmul(x, torch.from_numpy(W3))       # ops.matmul
    h = torch.cat((h, h), 1)                        # ops.concat
    h = F.gelu(h)                                   # ops.gelu (same name)
    h = F.silu(h)                                   # mint.nn.functional.silu
    h = F.softmax(h, -1)                            # ops.softmax (same name)
    h = h.add(h)                                    # Tensor.add (same name)
    h = torch.matmul(h, torch.from_numpy(W4))       # mint.matmul
    dbg.stop()
    dbg.step()
    dbg.close()
    return path, h.numpy()


def record_ms_functional(path):
    from mindspore import Tensor, mint, ops
    from msprobe.mindspore import PrecisionDebugger
    ms.set_device("CPU")

    dbg = PrecisionDebugger(dump_path=str(path), level="L1", task="statistics")
    dbg.start()
    x = Tensor(X)
    h = ops.matmul(x, Tensor(W3))
    h = ops.concat((h, h), 1)
    h = ops.gelu(h)
    h = mint.nn.functional.silu(h)
    h = ops.softmax(h, -1)
    h = h.add(h)
    h = mint.matmul(h, Tensor(W4))
    dbg.stop()
    dbg.step()
    if hasattr(dbg, "close"):
        dbg.close()
    return path, h.asnumpy()


def test_builtin_table_pairs_functional_calls_the_prefix_table_cannot(tmp_path, monkeypatch):
    pt, pt_out = record_torch_functional(tmp_path / "pt")
    msd, ms_out = record_ms_functional(tmp_path / "ms")
    np.testing.assert_allclose(ms_out, pt_out, rtol=1e-5, atol=1e-6)   # the runs agree
    r = C.compare(msd, pt, tol="loose")
    paired = r.con.sql("SELECT count(*) FROM alignment WHERE t_name IS NOT NULL AND b_name IS NOT NULL").fetchall()[0][0]
    pairs = dict(r.con.sql("SELECT b_name, t_name FROM alignment WHERE t_name IS NOT NULL").fetchall())
    # each MindSpore call pairs with its PyTorch counterpart
    assert r.summary["unmatched"] == {"target": [], "baseline": []}
    assert paired == 7 and r.summary["ranks"][0]["counts"] == {"pass": 7, "propagated": 0, "origin": 0, "unpaired": 0}
    assert set(pairs) == {"Torch.matmul.0.forward", "Torch.cat.0.forward", "Functional.gelu.0.forward",
                          "Functional.silu.0.forward", "Functional.softmax.0.forward", "Tensor.add.0.forward",
                          "Torch.matmul.1.forward"}
    assert r.summary["ranks"][0]["first_origin"] is None
    from msprobe.compare.mapping import resolve_api
    assert resolve_api(bt_mapping(), ["Mint.matmul", "MintFunctional.silu", "Functional.concat"],
                       ["Torch.matmul", "Functional.silu", "Torch.cat"]) == {
        "Mint.matmul": "Torch.matmul", "MintFunctional.silu": "Functional.silu", "Functional.concat": "Torch.cat"}
    # without the table (only Cell -> Module, as before): only the same-name calls pair
    import msprobe.compare.builtin_table as bt
    from msprobe.compare.mapping import BUILTIN
    monkeypatch.setattr(bt, "builtin_mapping", lambda path=None: BUILTIN)
    r0 = C.compare(msd, pt, tol="loose")
    paired0 = r0.con.sql("SELECT count(*) FROM alignment WHERE t_name IS NOT NULL AND b_name IS NOT NULL"
                         ).fetchall()[0][0]
    assert paired0 == 3 < paired
    assert r0.summary["unmatched"] == {
        "target": ["Functional.concat", "Functional.matmul", "Mint.matmul", "MintFunctional.silu"],
        "baseline": ["Functional.silu", "Torch.cat", "Torch.matmul"]}


def bt_mapping():
    from msprobe.compare.builtin_table import builtin_mapping
    return builtin_mapping()
