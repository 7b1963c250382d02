"""``compare --nan-origin`` over our store reads only the rank-steps whose summary counts a
NaN/Inf tensor, a bounded batch at a time, and gives the answer of the whole run loaded at
once (the exported dump.json layout)."""
from __future__ import annotations

import math

import pytest

import msprobe.compare.nan_origin as nan_module
from msprobe.cli import main
from msprobe.compare.nan_origin import nan_origin
from store.compact import compact
from store.export import export_log
from store.log_writer import LogWriter
from store.records import Call, Leaf, Marker

RANKS, STEPS = 10, 5
LINEAR = "Functional.linear.0.forward"
SOFTMAX = "Functional.softmax.0.forward"


def _tensor(io, path, value):
    nan, inf = math.isnan(value), math.isinf(value)
    return Leaf(io=io, path=path, leaf_kind="tensor", type="torch.Tensor", dtype="torch.float32", shape=(2,),
                numel=2, max=value, min=value, mean=value, norm=abs(value) * math.sqrt(2), crc32=None,
                requires_grad=False, has_nan=nan, has_inf=inf)


def _run(root):
    """Every rank: linear then softmax per step. Rank 1: linear turns finite inputs into NaN
    from step 2 on, and softmax then sees NaN. Rank 3: softmax gets -inf (a mask) every step
    and gives finite output: non-finite calls, no origin. The other ranks are finite."""
    for rank in range(RANKS):
        meta = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
                "rank_dir": f"rank{rank}", "world_size": RANKS}
        with LogWriter(root, rank, flush_rows=4, flush_interval_s=3600) as writer:
            writer.append_marker(Marker(step=0, kind="start", meta=meta))
            for step in range(STEPS):
                out = math.nan if rank == 1 and step >= 2 else 1.0 + step
                mask = -math.inf if rank == 3 else 0.5
                writer.append(Call(step=step, kind="api_forward", name=LINEAR, api_type="Functional",
                                   keys=("input_args", "input_kwargs", "output"),
                                   leaves=(_tensor("input_args", (0,), 1.0), _tensor("output", (0,), out))))
                writer.append(Call(step=step, kind="api_forward", name=SOFTMAX, api_type="Functional",
                                   keys=("input_args", "input_kwargs", "output"),
                                   leaves=(_tensor("input_args", (0,), out), _tensor("input_args", (1,), mask),
                                           _tensor("output", (0,), 0.5 if not math.isnan(out) else math.nan))))
                writer.append_marker(Marker(step=step, kind="step_end", meta=meta))
    return root


@pytest.fixture
def loads(monkeypatch):
    """(ranks, steps) of every load nan_origin makes."""
    seen: list[tuple] = []
    original = nan_module.load_side

    def recording(path, label, *, ranks=None, steps=None):
        seen.append((None if ranks is None else sorted(ranks), None if steps is None else sorted(steps)))
        return original(path, label, ranks=ranks, steps=steps)

    monkeypatch.setattr(nan_module, "load_side", recording)
    return seen


def _expected():
    ranks = []
    for rank in range(RANKS):
        first = None
        if rank == 1:
            first = {"name": LINEAR, "step": 2, "kind": "api_forward", "direction": "forward", "module": None,
                     "reason": "finite inputs, non-finite output", "stack": []}
        bad = 2 * (STEPS - 2) if rank == 1 else STEPS if rank == 3 else 0
        ranks.append({"rank": rank, "first_origin": first, "counts": {"nonfinite_calls": bad}})
    return {"verdict": "nonfinite", "ranks": ranks, "notices": []}


@pytest.mark.parametrize("compacted", [False, True])
@pytest.mark.parametrize("batch", [256, 2])
def test_only_rank_steps_with_nonfinite_tensors_are_loaded(tmp_path, loads, monkeypatch, compacted, batch):
    monkeypatch.setattr(nan_module, "BATCH_RANK_STEPS", batch)
    dump = _run(tmp_path / "d")
    if compacted:
        compact(dump)
    result = nan_origin(dump)
    assert result == _expected()
    loaded = {(r, s) for ranks, steps in loads for r in ranks for s in steps}
    # rank 1 from step 2 on, rank 3 every step: nothing else
    assert loaded == {(1, s) for s in range(2, STEPS)} | {(3, s) for s in range(STEPS)}
    assert all(len(ranks) * len(steps) <= batch for ranks, steps in loads)
    # each rank's steps come in ascending order
    for rank in (1, 3):
        order = [s for ranks, steps in loads if rank in ranks for s in steps]
        assert order == sorted(order)
    # the same answer from the exported layout, loaded whole
    export_log(dump, tmp_path / "upstream")
    loads.clear()
    assert nan_origin(tmp_path / "upstream") == result
    assert loads == [(None, None)]


def test_selection_and_a_finite_run_load_nothing_more(tmp_path, loads):
    dump = _run(tmp_path / "d")
    got = nan_origin(dump, ranks="0,2,4-5", steps="0-3")
    assert [r["rank"] for r in got["ranks"]] == [0, 2, 4, 5]
    assert got["verdict"] == "finite" and not any(r["first_origin"] for r in got["ranks"])
    assert loads == []                                # no rank-step of the selection holds NaN/Inf
    got = nan_origin(dump, ranks=[1], steps=[3])
    assert got["ranks"] == [{"rank": 1, "first_origin": {**_expected()["ranks"][1]["first_origin"], "step": 3},
                             "counts": {"nonfinite_calls": 2}}]
    assert loads == [([1], [3])]


def test_cli_names_clean_ranks_as_ranges_when_many(tmp_path, capsys):
    dump = _run(tmp_path / "d")
    assert main(["compare", str(dump), "--nan-origin"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [f"rank 1: first NaN/Inf origin {LINEAR} (step 2, forward) in (top level)",
                   "ranks 0,2-9: no NaN/Inf origin"]
    assert main(["compare", str(dump), "--nan-origin", "--rank", "0-2"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "rank 0: no NaN/Inf origin", f"rank 1: first NaN/Inf origin {LINEAR} (step 2, forward) in (top level)",
        "rank 2: no NaN/Inf origin"]


def test_a_rank_without_its_log_is_named_and_no_origin_is_not_confident(tmp_path, capsys):
    dump = _run(tmp_path / "d")
    (log,) = (dump / ".msprobe" / "log").glob("rank2.*")
    log.unlink()
    got = nan_origin(dump)
    assert [r["rank"] for r in got["ranks"]] == [0, 1] + list(range(3, RANKS))
    assert len(got["notices"]) == 1 and "rank 2" in got["notices"][0]
    # an origin on rank 1: status 1; without rank 1 nothing was found, but rank 2 was not read: 3
    assert main(["compare", str(dump), "--nan-origin"]) == 1
    assert main(["compare", str(dump), "--nan-origin", "--rank", "0,2-9"]) == 3
    err = capsys.readouterr().err
    assert "rank 2" in err
