"""msprobe.report.data: the numbers the report shows, against values computed another way
(the exported dump.json files read with json; the model's forward recomputed in float64)."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from msprobe.report.data import collect, plain
from store.errors import LogNotFoundError

sys.path.insert(0, str(Path(__file__).parent))
from record_worker import Net  # noqa: E402


def dump_jsons(dump: Path, rank_dir: str) -> dict:
    """{step: dump.json data} of one rank."""
    out = {}
    for step_dir in sorted(dump.glob("step*")):
        out[int(step_dir.name[4:])] = json.loads((step_dir / rank_dir / "dump.json").read_text())["data"]
    return out


def expected_output_norms(data_by_step: dict) -> dict:
    """{(module, step): sqrt(sum Norm^2)} over the forward outputs of each module."""
    cells: dict = {}
    for step, data in data_by_step.items():
        for name, entry in data.items():
            if not name.startswith("Module.") or ".forward." not in name:
                continue
            key = name[: name.rindex(".forward.")]
            norms = [leaf["Norm"] for leaf in entry.get("output", []) if isinstance(leaf, dict) and "Norm" in leaf]
            if norms:
                cells[(key, step)] = cells.get((key, step), 0.0) + sum(n * n for n in norms)
    return {k: math.sqrt(v) for k, v in cells.items()}


def expected_grad_norms(data_by_step: dict) -> dict:
    cells: dict = {}
    for step, data in data_by_step.items():
        for name, entry in data.items():
            if name.endswith(".parameters_grad"):
                key = name[: -len(".parameters_grad")]
                cells[(key, step)] = math.sqrt(sum(leaves[0]["Norm"] ** 2 for leaves in entry.values()))
    return cells


def cells_of(heat: dict) -> dict:
    out = {}
    for i, row in enumerate(heat["rows"]):
        for j, column in enumerate(heat["columns"]):
            value = heat["values"][i][j]
            if value is not None:
                out[(row, int(column))] = float(value)
    return out


def test_heat_maps_equal_norms_of_dump_json(nan_dump):
    data = collect(nan_dump)
    by_step = dump_jsons(nan_dump, "rank")
    got, want = cells_of(data["per_rank"]["0"]["output"]), expected_output_norms(by_step)
    assert set(got) == set(want)
    for key in want:
        if math.isnan(want[key]):
            assert math.isnan(got[key]), key
        else:
            assert got[key] == pytest.approx(want[key], rel=1e-12), key
    got, want = cells_of(data["per_rank"]["0"]["grad"]), expected_grad_norms(by_step)
    assert set(got) == set(want) == {(m, s) for m in ("Module.fc1.Linear", "Module.fc2.Linear") for s in (0, 1, 2)}
    for key in want:
        assert (math.isnan(got[key]) and math.isnan(want[key])) or got[key] == pytest.approx(want[key], rel=1e-12)


def test_step0_output_norm_of_fc1_equals_float64_forward(nan_dump):
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    w, b = model.fc1.weight.detach().double().numpy(), model.fc1.bias.detach().double().numpy()
    h = x.double().numpy() @ w.T + b
    heat = collect(nan_dump)["per_rank"]["0"]["output"]
    value = heat["values"][heat["rows"].index("Module.fc1.Linear")][heat["columns"].index("0")]
    assert value == pytest.approx(float(np.sqrt((h * h).sum())), rel=1e-5)


def test_first_nan_origin_is_the_log_of_minus_one(nan_dump):
    nf = collect(nan_dump)["per_rank"]["0"]["nonfinite"]
    assert (nf["origin"]["name"], nf["origin"]["step"], nf["origin"]["kind"]) == ("Torch.log.0.forward", 1, "api_forward")
    assert (nf["first_tensor"]["name"], nf["first_tensor"]["io"], nf["first_tensor"]["has_nan"]) == (
        "Torch.log.0.forward", "output", True)
    assert any("record_worker.py" in frame and "torch.log" in frame for frame in nf["origin"]["stack"])


def test_two_ranks_each_name_their_origin(two_rank_dump):
    data = collect(two_rank_dump)
    assert data["ranks"] == [0, 1]
    origins = {r: data["per_rank"][str(r)]["nonfinite"]["origin"] for r in (0, 1)}
    assert origins[1]["name"] == "Torch.log.0.forward" and origins[1]["step"] == 1
    # rank 0 receives the NaN gradient through the all-reduce: finite input, NaN output
    assert origins[0]["name"].startswith("Distributed.all_reduce.") and origins[0]["step"] == 1
    counts = {(r["rank"], r["step"]): r["entries"] for r in data["per_step"]}
    for rank, rank_dir in ((0, "rank0"), (1, "rank1")):
        for step, entries in dump_jsons(two_rank_dump, rank_dir).items():
            assert counts[(rank, step)] == len(entries)


def test_steps_binned_and_rows_sampled_beyond_the_limits(nan_dump):
    full = collect(nan_dump)["per_rank"]["0"]["output"]
    small = collect(nan_dump, max_rows=2, max_steps=2)["per_rank"]["0"]["output"]
    assert (small["bin"], small["columns"], small["steps_total"]) == (2, ["0-1", "2"], 3)
    assert small["rows_total"] == len(full["rows"]) == 3 and small["rows"] == [full["rows"][0], full["rows"][1]]
    for i in range(2):
        finite = [v for v in full["values"][i][:2] if v not in ("NaN", None)]
        nan = "NaN" in full["values"][i][:2]
        assert small["values"][i][0] == ("NaN" if nan else max(finite))
        assert small["values"][i][1] == full["values"][i][2]


def test_movers_are_parameters_with_the_largest_norm_ratio(nan_dump):
    by_step = dump_jsons(nan_dump, "rank")
    ratios = {}
    for module in ("Module.fc1.Linear", "Module.fc2.Linear"):
        for param in ("weight", "bias"):
            norms = [by_step[s][module + ".parameters_grad"][param][0]["Norm"] for s in sorted(by_step)]
            finite = [n for n in norms if math.isfinite(n) and n > 0]
            ratios[f"{module}.{param}"] = max(finite) / min(finite)
    movers = collect(nan_dump, movers=2)["per_rank"]["0"]["movers"]
    assert [m["param"] for m in movers] == sorted(ratios, key=lambda k: (-ratios[k], k))[:2]
    assert movers[0]["ratio"] == pytest.approx(max(ratios.values()), rel=1e-12)


def test_largest_values_and_norm_jumps(nan_dump):
    largest = collect(nan_dump, threshold=1e30, jump=1e30)["largest"]
    # NaN is not a large value (the first-NaN section shows it); this dump holds no Inf
    assert largest["extremes"] == [] and largest["jumps"] == []
    largest = collect(nan_dump, threshold=1.0, jump=1.5)["largest"]
    by_step = dump_jsons(nan_dump, "rank")
    for row in largest["extremes"]:
        entry = by_step[row["first_step"]][row["name"]][row["io"]]
        assert max(abs(float(row["max"])), abs(float(row["min"]))) >= 1.0
        assert entry is not None
    for row in largest["jumps"]:
        assert max(row["ratio"], 1 / row["ratio"]) >= 1.5
        assert row["ratio"] == pytest.approx(row["norm"] / row["previous"], rel=1e-12)
    # one row per tensor handed on: no two rows jump between the same steps and Norms
    jumps = collect(nan_dump, jump=1.0001)["largest"]["jumps"]
    keys = [(r["rank"], r["previous_step"], r["step"], r["previous"], r["norm"]) for r in jumps]
    assert len(keys) == len(set(keys)) and any(r["seen_in"] for r in jumps)


def test_graph_is_construct_json_of_every_step_with_output_statistics(nan_dump):
    graph = collect(nan_dump)["per_rank"]["0"]["graph"]
    by_step = dump_jsons(nan_dump, "rank")
    assert graph["steps"] == sorted(by_step) == [0, 1, 2]
    names = [n[0] for n in graph["nodes"]]
    assert len(set(names)) == len(names)
    for step, data in by_step.items():
        construct = json.loads((nan_dump / f"step{step}" / "rank" / "construct.json").read_text())
        rows = graph["stats"][str(step)]
        nodes = {graph["nodes"][r[0]][0]: graph["nodes"][r[0]] for r in rows}
        forward = {k: v for k, v in construct.items() if k.endswith(".forward") or ".forward." in k}
        assert {name: (None if n[1] < 0 else graph["nodes"][n[1]][0]) for name, n in nodes.items()} == forward
        for i, mx, mn, mean, norm, flag, count in rows:
            outputs = [leaf for leaf in data[graph["nodes"][i][0]].get("output", [])
                       if isinstance(leaf, dict) and "Norm" in leaf]
            assert count == len(outputs)
            if not outputs:
                continue
            values = np.array([[o["Max"], o["Min"], o["Mean"], o["Norm"]] for o in outputs], dtype=np.float64)
            numel = np.array([np.prod(o["shape"]) for o in outputs], dtype=np.float64)
            nan = bool(np.isnan(values).any())
            assert flag & 1 == int(nan)
            expected = [values[:, 0].max(), values[:, 1].min(), (values[:, 2] * numel).sum() / numel.sum(),
                        np.sqrt((values[:, 3] ** 2).sum())]
            got = [float(v) if not isinstance(v, str) else float(v.replace("Infinity", "inf")) for v in (mx, mn, mean, norm)]
            for g, e in zip(got, expected):
                if nan and math.isnan(e):
                    continue
                assert g == pytest.approx(e, rel=1e-6)


def test_largest_values_list_a_tensor_handed_on_once(nan_dump):
    """The same tensor (equal statistics and shape) seen as one call's output and the next
    call's input is one row, named by its first entry."""
    by_step = dump_jsons(nan_dump, "rank")
    largest = collect(nan_dump, threshold=0.5)["largest"]["extremes"]
    keys = []
    for row in largest:
        assert row["name"] not in row["seen_in"]
        keys.append((row["rank"], row["name"], row["io"], row["arg"]))
    assert len(keys) == len(set(keys))
    # step 0: tensors reaching 0.5, grouped by (Max, Min, Mean, Norm, shape) from dump.json
    groups = {}
    for name, entry in by_step[0].items():
        for io, leaves in entry.items():
            items = leaves.items() if isinstance(leaves, dict) else enumerate(leaves or [])
            for arg, leaf in items:
                if isinstance(leaf, dict) and "Max" in leaf and leaf["Max"] is not None \
                        and max(abs(leaf["Max"]), abs(leaf["Min"])) >= 0.5 and leaf["Max"] == leaf["Max"]:
                    key = (leaf["Max"], leaf["Min"], leaf["Mean"], leaf["Norm"], tuple(leaf["shape"]))
                    groups.setdefault(key, set()).add((name, io, str(arg)))
    rows0 = [r for r in largest if r["first_step"] == 0]
    assert len(rows0) == len(groups)
    assert any(len(names) > 1 for names in groups.values())   # fc1's output is act's input
    for entries in groups.values():   # one row per group, naming the others (seen_in: over all its steps)
        (row,) = [r for r in rows0 if (r["name"], r["io"], r["arg"]) in entries]
        assert {name for name, _, _ in entries} - {row["name"]} <= set(row["seen_in"])


def test_bad_limits_and_missing_log_raise(tmp_path, nan_dump):
    with pytest.raises(ValueError, match="max_rows: expected an integer >= 1, got 0"):
        collect(nan_dump, max_rows=0)
    with pytest.raises(ValueError, match="threshold: expected a positive number, got nan"):
        collect(nan_dump, threshold=float("nan"))
    with pytest.raises(LogNotFoundError):
        collect(tmp_path)


def test_plain_spells_non_finite_floats():
    assert plain({"a": [1.0, float("nan"), (float("inf"), -float("inf"))], "b": None}) == {
        "a": [1.0, "NaN", ["Infinity", "-Infinity"]], "b": None}
