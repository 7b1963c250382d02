"""check-ranks reads our store one step of one rank group at a time, and the answer is the
one the whole run gives (the exported dump.json layout is loaded whole)."""
from __future__ import annotations

from collections import Counter

import pytest

from msprobe.check_ranks import CORRUPTION, check_ranks
from store.compact import compact
from store.export import export_log
from store.log_writer import LogWriter
from store.records import Call, Leaf, Marker
from store.select import StoreReader

STEPS = 4
LINEAR = "Module.fc.Linear.forward.0"
RELU = "Functional.relu.0.forward"


def _tensor(io, path, crc):
    return Leaf(io=io, path=path, leaf_kind="tensor", type="torch.Tensor", dtype="torch.float32", shape=(2,),
                numel=2, max=1.0, min=0.0, mean=0.5, norm=1.0, crc32=crc, requires_grad=True,
                has_nan=False, has_inf=False)


def _run(root):
    """Three ranks, four steps of Linear then relu; rank 2's weight differs from step 1 on,
    and with it the Linear output and everything relu sees and makes."""
    for rank in (0, 1, 2):
        meta = {"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None,
                "rank_dir": f"rank{rank}", "world_size": 3}
        with LogWriter(root, rank, flush_rows=3, flush_interval_s=3600) as writer:
            writer.append_marker(Marker(step=0, kind="start", meta=meta))
            for step in range(STEPS):
                odd = rank == 2 and step >= 1
                crc = (lambda base: f"{base:08x}" if not odd else f"{base + 0xdead0000:08x}")
                writer.append(Call(step=step, kind="module_forward", name=LINEAR, api_type="Module",
                                   keys=("input_args", "input_kwargs", "output", "parameters"),
                                   leaves=(_tensor("parameters", ("weight",), crc(16 * step + 1)),
                                           _tensor("output", (0,), crc(16 * step + 2)))))
                writer.append(Call(step=step, kind="api_forward", name=RELU, api_type="Functional",
                                   keys=("input_args", "input_kwargs", "output"),
                                   leaves=(_tensor("input_args", (0,), crc(16 * step + 2)),
                                           _tensor("output", (0,), crc(16 * step + 3)))))
                writer.append_marker(Marker(step=step, kind="step_end", meta=meta))
    return root


def _write_step0(root, world, calls_of):
    """``world`` ranks' logs of one step (0): a start marker, ``calls_of(rank)``'s calls, the
    step_end marker."""
    for rank in range(world):
        meta = {"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None,
                "rank_dir": f"rank{rank}", "world_size": world}
        with LogWriter(root, rank, flush_rows=3, flush_interval_s=3600) as writer:
            writer.append_marker(Marker(step=0, kind="start", meta=meta))
            for call in calls_of(rank):
                writer.append(call)
            writer.append_marker(Marker(step=0, kind="step_end", meta=meta))


@pytest.fixture
def connections(monkeypatch):
    """Per step check-ranks reads: (steps selected, call/leaf rows per step it read)."""
    seen: list[tuple] = []
    original = StoreReader.table

    def recording(self, *args, **kwargs):
        table = original(self, *args, **kwargs)
        rows = table.to_pydict()
        held = Counter(s for s, r in zip(rows["step"], rows["row"]) if r in ("call", "leaf"))
        seen.append((sorted(self.steps) if self.steps is not None else None, sorted(held.items())))
        return table

    monkeypatch.setattr(StoreReader, "table", recording)
    return seen


@pytest.mark.parametrize("compacted", [False, True])
def test_every_step_is_read_alone_and_the_answer_is_the_whole_runs(tmp_path, connections, compacted):
    dump = _run(tmp_path / "d")
    if compacted:
        compact(dump)
    export_log(dump, tmp_path / "upstream")
    result = check_ranks(dump)
    # one read per step, in step order, of that step only: 3 ranks x (2 call rows + 4 leaf rows)
    assert connections == [([s], [(s, 18)]) for s in range(STEPS)]
    (g,) = result.groups
    # compared (must agree): step 0 the weight and both outputs (inputs agree); steps 1-3
    # only the weight (rank 2's inputs differ, so outputs need not agree)
    assert (g.ranks, g.steps, g.compared, g.exact) == ((0, 1, 2), (0, 1, 2, 3), 6, 6)
    f = g.first
    assert (f.step, f.name, f.io, f.arg, f.majority, f.odd, f.verdict) == (
        1, LINEAR, "parameters", "weight", (0, 1), (2,), CORRUPTION)
    assert f.values == {0: "00000011", 1: "00000011", 2: f"{0xdead0011:08x}"}
    # per step from the origin on: the weight, Linear's output, relu's input and output
    assert f.first_downstream == RELU and f.spread == {1: 4, 2: 4, 3: 4}
    # the same answer from the exported layout, loaded whole into one connection
    whole = check_ranks(tmp_path / "upstream")
    assert whole.source == "dump.json" and result.source == "log"
    assert whole.groups == result.groups


def test_a_group_reads_only_its_ranks(tmp_path, connections):
    dump = _run(tmp_path / "d")
    compact(dump)
    result = check_ranks(dump, groups=[[0, 1], [1, 2]], steps=[2, 3])
    # per group, per selected step: one read of 2 ranks x 6 rows of that step
    assert connections == [([s], [(s, 12)]) for s in (2, 3)] * 2
    agree, odd = result.groups
    # ranks 0 and 1 agree on the weight and both outputs of each step
    assert agree.first is None and (agree.steps, agree.compared) == ((2, 3), 6)
    # ranks 1 and 2: one against one, no majority
    assert (odd.first.step, odd.first.name, odd.first.majority, odd.first.odd) == (2, LINEAR, (), (1, 2))


@pytest.mark.parametrize("compacted", [False, True])
@pytest.mark.parametrize("per_read", [1, 2])
def test_a_step_is_read_a_few_ranks_at_a_time(tmp_path, monkeypatch, compacted, per_read):
    """With fewer ranks per read than the group has, each step's replicas rows are merged
    from partial rows of disjoint rank batches: the answer is the one-read answer; the whole
    step is read only where values are shown (from the disagreement's step on)."""
    import msprobe.check_ranks as check_ranks_module

    dump = _run(tmp_path / "d")
    if compacted:
        compact(dump)
    whole = check_ranks(dump)
    reads: list[tuple] = []
    original = StoreReader.table

    def recording(self, *args, **kwargs):
        reads.append((sorted(self.ranks), sorted(self.steps)))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(StoreReader, "table", recording)
    monkeypatch.setattr(check_ranks_module, "RANKS_PER_READ", per_read)
    batched = check_ranks(dump)
    assert batched.groups == whole.groups and batched.groups[0].first.spread == {1: 4, 2: 4, 3: 4}
    batches = [[0], [1], [2]] if per_read == 1 else [[0, 1], [2]]
    expected = []
    for step in range(STEPS):
        expected += [(b, [step]) for b in batches]
        if step >= 1:                    # the disagreement at step 1 and its spread after it
            expected.append(([0, 1, 2], [step]))
    assert reads == expected


@pytest.mark.parametrize("per_read", [1, 2, 64])
def test_statistics_and_tolerance_merge_over_rank_batches(tmp_path, monkeypatch, per_read):
    """Without CRC-32s agreement is by statistics: the spread over every rank of the group,
    wherever the batches split it."""
    import msprobe.check_ranks as check_ranks_module

    monkeypatch.setattr(check_ranks_module, "RANKS_PER_READ", per_read)
    root = tmp_path / "d"

    def calls(rank):
        norm = 1.0 + (1e-3 if rank == 3 else 0.0)       # rank 3's weight: Norm 0.1 % larger
        return [Call(step=0, kind="module_forward", name=LINEAR, api_type="Module",
                     keys=("input_args", "input_kwargs", "output", "parameters"),
                     leaves=(_tensor("parameters", ("weight",), None).replace(norm=norm),))]
    _write_step0(root, 4, calls)
    (g,) = check_ranks(root).groups
    assert (g.compared, g.exact, g.first.by, g.first.majority, g.first.odd) == (1, 0, "statistics", (0, 1, 2), (3,))
    assert g.first.values[3] == (1.0, 0.0, 0.5, 1.001) and g.first.values[0] == (1.0, 0.0, 0.5, 1.0)
    (g,) = check_ranks(root, tol=2e-3).groups              # 1e-3 / 1.001 of spread is within 2e-3
    assert g.first is None and g.compared == 1
    (g,) = check_ranks(root, tol=5e-4).groups
    assert g.first is not None and g.first.odd == (3,)


@pytest.mark.parametrize("compacted", [False, True])
@pytest.mark.parametrize("per_read", [1, 2, 64])
def test_entries_at_one_position_are_taken_in_name_order(tmp_path, monkeypatch, compacted, per_read):
    """Ranks that recorded different calls put several entries at one call position (each
    entry's smallest position over the ranks): the first disagreement among them is the one
    of the smallest name, however the ranks are batched, and the dump.json layout agrees."""
    import msprobe.check_ranks as check_ranks_module

    monkeypatch.setattr(check_ranks_module, "RANKS_PER_READ", per_read)
    names = [f"Functional.op{k}.0.forward" for k in range(4)]
    root = tmp_path / "d"
    _write_step0(root, 4, lambda rank: [       # rank r records op{r} then op{r+1}: each op is first on one rank
        Call(step=0, kind="api_forward", name=name, api_type="Functional", keys=("input_args", "input_kwargs", "output"),
             leaves=(_tensor("output", (0,), f"{rank:08x}"),))
        for name in (names[rank], names[(rank + 1) % 4])])
    if compacted:
        compact(root)
    export_log(root, tmp_path / "upstream")
    for dump in (root, tmp_path / "upstream"):
        (g,) = check_ranks(dump, all_calls=True).groups
        assert (g.first.name, g.first.odd, g.first.values) == (names[0], (0, 3), {0: "00000000", 3: "00000003"})


@pytest.mark.parametrize("odd", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_statistic_on_one_rank_is_the_odd_rank_out(tmp_path, odd):
    """Rank 2's weight has a NaN or infinite Mean, the others 0.5: a disagreement at any
    tolerance, rank 2 the odd rank out (by statistics: no CRC-32 recorded)."""
    root = tmp_path / "d"
    _write_step0(root, 3, lambda rank: [
        Call(step=0, kind="module_forward", name=LINEAR, api_type="Module", keys=("parameters",),
             leaves=(_tensor("parameters", ("weight",), None).replace(mean=odd if rank == 2 else 0.5),))])
    for tol in (0.0, 0.5):
        result = check_ranks(root, tol=tol)
        f = result.groups[0].first
        assert result.exit_code == 1 and (f.by, f.majority, f.odd) == ("statistics", (0, 1), (2,))
