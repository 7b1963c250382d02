"""msprobe.check_ranks and ``msprobe check-ranks``: upstream dump.json layouts, bad input."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from msprobe.check_ranks import CORRUPTION, NOT_SYNCHRONISED, CheckRanksInputError, check_ranks, parse_ranks
from msprobe.cli import main


def tensor(md5: str, norm: float = 1.0, requires_grad: bool = True) -> dict:
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0, "Min": 0.0,
            "Mean": 0.5, "Norm": norm, "requires_grad": requires_grad, "md5": md5}


def upstream(root: Path, ranks: int, odd: dict) -> Path:
    """step{0,1}/rank{R}/dump.json: a Linear's forward with its parameters and an all_reduce;
    ``odd`` maps (step, rank) to the md5 that rank records for the weight."""
    for step in (0, 1):
        for rank in range(ranks):
            d = root / f"step{step}" / f"rank{rank}"
            d.mkdir(parents=True)
            data = {
                "Functional.linear.0.forward": {"input_args": [tensor(f"0000000{rank}", requires_grad=False)],
                                                "input_kwargs": {}, "output": [tensor(f"1000000{rank}")]},
                "Module.fc.Linear.forward.0": {
                    "input_args": [tensor(f"0000000{rank}", requires_grad=False)], "input_kwargs": {},
                    "output": [tensor(f"1000000{rank}")],
                    "parameters": {"weight": tensor(odd.get((step, rank), f"aaaaaaa{step}")),
                                   "bias": tensor(f"bbbbbbb{step}")}},
                "Distributed.all_reduce.0.forward": {"input_args": [tensor(f"2000000{rank}")], "input_kwargs": {},
                                                     "output": [tensor(f"3000000{step}")]},
            }
            (d / "dump.json").write_text(json.dumps({"task": "statistics", "level": "mix", "framework": "pytorch",
                                                     "dump_data_dir": None, "data": data}))
    return root


def test_upstream_layout_agrees(tmp_path):
    result = check_ranks(upstream(tmp_path, 3, {}))
    assert result.source == "dump.json" and result.exit_code == 0
    (g,) = result.groups
    assert g.ranks == (0, 1, 2) and g.steps == (0, 1) and g.compared == g.exact == 6


def test_upstream_odd_rank(tmp_path, capsys):
    root = upstream(tmp_path, 3, {(1, 2): "deadbeef"})
    f = check_ranks(root).groups[0].first
    assert (f.step, f.name, f.io, f.arg, f.odd, f.majority) == (1, "Module.fc.Linear.forward.0", "parameters",
                                                                "weight", (2,), (0, 1))
    assert f.values == {0: "aaaaaaa1", 1: "aaaaaaa1", 2: "deadbeef"} and f.verdict == CORRUPTION
    assert main(["check-ranks", str(root)]) == 1
    assert "odd rank out: 2 (majority: ranks 0-1)" in capsys.readouterr().out


def test_first_step_parameter_difference_is_not_synchronised(tmp_path):
    f = check_ranks(upstream(tmp_path, 3, {(0, 0): "deadbeef"})).groups[0].first
    assert (f.step, f.odd, f.verdict) == (0, (0,), NOT_SYNCHRONISED)


def test_all_calls_reports_the_input_first(tmp_path):
    f = check_ranks(upstream(tmp_path, 3, {}), all_calls=True).groups[0].first
    assert (f.name, f.io, f.arg, f.verdict) == ("Functional.linear.0.forward", "input_args", "0", "input difference")


@pytest.mark.parametrize("argv, message", [
    (["--group", "3-1"], "--group: got '3-1'"),
    (["--step", "x"], "--step: got 'x'"),
    (["--tol", "-1"], "--tol: got -1.0"),
    (["--tol", "abc"], "--tol: got 'abc'"),
])
def test_bad_options_exit_2(tmp_path, capsys, argv, message):
    root = upstream(tmp_path, 2, {})
    assert main(["check-ranks", str(root)] + argv) == 2
    assert message in capsys.readouterr().err


def test_missing_or_empty_path_exit_2(tmp_path, capsys):
    assert main(["check-ranks", str(tmp_path / "nope")]) == 2
    assert "path does not exist" in capsys.readouterr().err
    assert main(["check-ranks", str(tmp_path)]) == 2
    assert "no dump.json found" in capsys.readouterr().err


def test_parse_ranks():
    assert parse_ranks("--group", "0-3,6,2") == (0, 1, 2, 3, 6)
    with pytest.raises(CheckRanksInputError, match="expected integers >= 0"):
        parse_ranks("--group", "")


def data_parallel(root: Path) -> Path:
    """step{0,1,2}/rank{0,1,2}/dump.json and construct.json of a data-parallel run, each rank
    its own batch: an embedding, then the head (its linear nested in it, reading the head
    weight), then SGD's update of the head weight (``Tensor.add_``: weight and the
    all-reduced gradient in, the new weight out). Rank 2's head weight differs from step 1
    on (a nudge before step 1), and so does its update's output."""
    for step in range(3):
        for rank in range(3):
            odd = rank == 2 and step >= 1
            w = f"w{step}{'odd' if odd else 'ok'}".ljust(8, "0")[:8]
            w_next = f"n{step}{'odd' if odd else 'ok'}".ljust(8, "0")[:8]
            act = f"a{step}{rank}".ljust(8, "0")
            d = root / f"step{step}" / f"rank{rank}"
            d.mkdir(parents=True)
            data = {
                "Functional.embedding.0.forward": {"input_args": [tensor(f"t{step}{rank}".ljust(8, "0"), requires_grad=False)],
                                                   "input_kwargs": {}, "output": [tensor(act)]},
                "Functional.linear.0.forward": {"input_args": [tensor(act), tensor(w)], "input_kwargs": {},
                                                "output": [tensor(f"o{step}{rank}".ljust(8, "0"))]},
                "Module.head.Linear.forward.0": {"input_args": [tensor(act)], "input_kwargs": {},
                                                 "output": [tensor(f"o{step}{rank}".ljust(8, "0"))],
                                                 "parameters": {"weight": tensor(w)}},
                "Tensor.add_.0.forward": {"input_args": [tensor(w), tensor(f"g{step}".ljust(8, "0"))],
                                          "input_kwargs": {"alpha": {"type": "float", "value": -0.1}},
                                          "output": [tensor(w_next)]},
            }
            (d / "dump.json").write_text(json.dumps({"task": "statistics", "level": "mix", "framework": "pytorch",
                                                     "dump_data_dir": None, "data": data}))
            (d / "construct.json").write_text(json.dumps({"Functional.linear.0.forward": "Module.head.Linear.forward.0"}))
    return root


def test_data_parallel_downstream_is_causal_and_replicated(tmp_path, capsys):
    """Each rank its own batch: the head weight is named; the embedding (before the head)
    and the activations (different on every rank) are never downstream; the update of the
    weight is, and per step the weight's three records (parameter, linear input, update
    input) and the update's output differ on rank 2 while ranks 0 and 1 agree."""
    root = data_parallel(tmp_path)
    result = check_ranks(root)
    (g,) = result.groups
    f = g.first
    assert (f.step, f.name, f.io, f.arg, f.odd, f.majority) == (1, "Module.head.Linear.forward.0", "parameters",
                                                                "weight", (2,), (0, 1))
    assert f.first_downstream == "Tensor.add_.0.forward"
    assert f.spread == {1: 4, 2: 4}
    # compared: per step the parameter and the update's output (equal inputs), less the
    # update of the odd steps, whose inputs differ on rank 2
    assert g.compared == 3 + 1
    assert main(["check-ranks", str(root)]) == 1
    out = capsys.readouterr().out
    assert "embedding" not in out and "first downstream call whose output differs: Tensor.add_.0.forward" in out


def test_a_group_with_nothing_to_compare_says_so(tmp_path, capsys):
    """One rank has no replicas; a group whose other rank recorded nothing compares nothing:
    neither is reported as replicas that agree."""
    root = upstream(tmp_path, 2, {})
    assert main(["check-ranks", str(root), "--group", "0"]) == 0
    out = capsys.readouterr().out
    assert "0 tensor records compared" in out and "nothing compared (one rank: no replicas)" in out
    assert "all replicas agree" not in out
    assert main(["check-ranks", str(root), "--group", "0,5"]) == 3    # incomplete: rank 5 recorded nothing
    captured = capsys.readouterr()
    assert "skipped rank 5" in captured.err
    assert "nothing compared (no tensor that must agree was recorded on two or more of its ranks)" in captured.out
    assert main(["check-ranks", str(root)]) == 0
    assert "all replicas agree" in capsys.readouterr().out
