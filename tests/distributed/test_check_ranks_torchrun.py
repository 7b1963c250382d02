"""``msprobe check-ranks`` on 4 gloo ranks (one ``torchrun`` launch of
``replica_worker.py``: runs clean, flip, batch, fsdp1, fsdp2; see its docstring)."""
from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from msprobe.check_ranks import CORRUPTION, INPUT_DIFFERENCE, check_ranks
from msprobe.cli import main
from store.query import query

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is needed")

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("replica_worker.py")
sys.path.insert(0, str(WORKER.parent))
import replica_worker as W  # noqa: E402

LAUNCH_TIMEOUT_S = 300  # ~40 s on an idle 2-core machine


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("replicas")
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", str(WORKER), str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return out


@pytest.fixture(scope="module")
def dp_runs(tmp_path_factory) -> Path:
    """``replica_worker.py OUT data_parallel`` on 3 ranks: runs dp_clean and dp_nudge."""
    out = tmp_path_factory.mktemp("data_parallel")
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=3", str(WORKER),
           str(out), "data_parallel"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return out


def crc32_of(t: torch.Tensor) -> str:
    return f"{zlib.crc32(t.detach().contiguous().numpy().tobytes()):08x}"


def test_clean_run_agrees(runs, capsys):
    for all_calls in (False, True):
        result = check_ranks(runs / "clean", all_calls=all_calls)
        assert result.exit_code == 0
        (group,) = result.groups
        assert group.ranks == (0, 1, 2, 3) and group.steps == (0, 1, 2)   # recorded world size 4
        # per step: 4 parameters (fc1/fc2 weight, bias), the all_reduce output and, every
        # rank fed the same batch, every call output whose inputs agreed; all by CRC-32
        if not all_calls:
            ins = "('input_args', 'input_kwargs', 'parameters', 'input')"
            n_outputs = query(runs / "clean", (
                f"SELECT count(*) AS n FROM tensors t WHERE rank = 0 AND io NOT IN {ins} "
                f"AND NOT starts_with(name, 'Distributed.') AND EXISTS (SELECT 1 FROM tensors i WHERE i.rank = 0 "
                f"AND i.step = t.step AND i.io IN {ins} AND i.name IN "
                f"(t.name, regexp_replace(t.name, '\\.backward(\\.[0-9]+)?$', '.forward\\1')))")).column("n")[0].as_py()
            assert n_outputs > 20
            assert group.compared == group.exact == 5 * W.STEPS + n_outputs
    assert main(["check-ranks", str(runs / "clean")]) == 0
    assert "all replicas agree" in capsys.readouterr().out


def test_world_size_recorded_in_markers(runs):
    import json

    from store.log_reader import read_log

    table = read_log(runs / "clean").table
    metas = [json.loads(m) for m, row in zip(table.column("meta").to_pylist(), table.column("row").to_pylist())
             if row == "marker"]
    assert metas and {m["world_size"] for m in metas} == {4}


def test_preset_records_parameters_only_and_finds_the_flip(runs):
    kinds = query(runs / "preset", "SELECT DISTINCT kind FROM calls").column("kind").to_pylist()
    ios = query(runs / "preset", "SELECT DISTINCT io FROM tensors ORDER BY io").column("io").to_pylist()
    assert kinds == ["module_forward"] and ios == ["input_args", "parameters"]
    f = check_ranks(runs / "preset").groups[0].first
    assert (f.step, f.name, f.arg, f.odd, f.by) == (W.FLIP_STEP, "Module.module.fc1.Linear.forward.0", "weight",
                                                    (W.FLIP_RANK,), "crc32")


def test_recorded_crc32_is_the_parameter_bytes(runs):
    torch.manual_seed(0)
    net = W.Net()
    rows = query(runs / "clean", "SELECT rank, crc32 FROM tensors WHERE step = 0 AND "
                 "name = 'Module.module.fc1.Linear.forward.0' AND io = 'parameters' AND arg = 'weight'").to_pylist()
    assert sorted(r["rank"] for r in rows) == [0, 1, 2, 3]
    assert {r["crc32"] for r in rows} == {crc32_of(net.fc1.weight)}


def test_bit_flip_on_rank2_reported_at_step2(runs, capsys):
    result = check_ranks(runs / "flip")
    assert result.exit_code == 1
    f = result.groups[0].first
    assert (f.step, f.name, f.io, f.arg, f.category) == (W.FLIP_STEP, "Module.module.fc1.Linear.forward.0",
                                                         "parameters", "weight", "parameter")
    assert f.odd == (W.FLIP_RANK,) and f.majority == (0, 1, 3) and f.by == "crc32"
    assert f.verdict == CORRUPTION
    assert f.first_downstream == "Functional.linear.0.forward"   # the linear that reads the weight
    assert set(f.spread) == {W.FLIP_STEP} and f.spread[W.FLIP_STEP] > 10
    # the odd value is the majority's weight with bit FLIP_BIT of element [0, 0] flipped:
    # rank 2's Max/Min/Mean differ from rank 0's by exactly that one element
    rows = {r["rank"]: r for r in query(runs / "flip", (
        "SELECT rank, mean, numel FROM tensors WHERE step = 2 AND name = 'Module.module.fc1.Linear.forward.0' "
        "AND io = 'parameters' AND arg = 'weight'")).to_pylist()}
    w0 = query(runs / "flip", "SELECT max FROM tensors WHERE step = 2 AND rank = 0 AND "
               "name = 'Functional.linear.0.forward' AND io = 'input_args' AND arg = '1'").to_pylist()
    assert w0   # the weight is also the linear's input 1
    delta = (rows[2]["mean"] - rows[0]["mean"]) * rows[0]["numel"]   # = w'[0,0] - w[0,0]
    assert delta != 0 and abs(delta) < 1.0
    assert main(["check-ranks", str(runs / "flip")]) == 1
    out = capsys.readouterr().out
    assert "odd rank out: 2 (majority: ranks 0-1,3)" in out
    assert "first disagreement: step 2, Module.module.fc1.Linear.forward.0 parameters.weight" in out


def test_other_batch_is_an_input_difference(runs):
    assert check_ranks(runs / "batch").exit_code == 0   # DDP keeps the parameters replicated
    result = check_ranks(runs / "batch", all_calls=True)
    f = result.groups[0].first
    assert (f.step, f.name, f.io, f.arg) == (W.BATCH_STEP, "Functional.linear.0.forward", "input_args", "0")
    assert f.by == "statistics" and f.odd == (W.BATCH_RANK,) and f.verdict == INPUT_DIFFERENCE
    x = W.batch(W.BATCH_STEP, W.BATCH_RANK).double()
    assert f.values[W.BATCH_RANK][3] == pytest.approx(float(x.norm()), rel=1e-6)
    assert f.values[0][0] == pytest.approx(float(W.batch(W.BATCH_STEP).max()), rel=1e-7)
    assert set(f.spread) == {W.BATCH_STEP}        # the next step's parameters agree again


def test_fsdp_no_false_positive(runs):
    for name in ("fsdp1", "fsdp2"):
        result = check_ranks(runs / name)
        assert result.exit_code == 0, name
        assert result.groups[0].compared > 0


def test_group_and_step_options(runs, capsys):
    assert check_ranks(runs / "flip", groups=[[0, 1], [2, 3]]).exit_code == 1
    pair = check_ranks(runs / "flip", groups=[[0, 1], [2, 3]]).groups
    assert pair[0].first is None and pair[1].first.step == 2 and pair[1].first.odd == (2, 3)   # 1:1, no majority
    assert check_ranks(runs / "flip", steps=[0, 1]).exit_code == 0
    assert main(["check-ranks", str(runs / "flip"), "--group", "0-1", "--group", "3"]) == 0
    assert main(["check-ranks", str(runs / "flip"), "--step", "0-1"]) == 0
    capsys.readouterr()


def _positions(path: Path, rank: int, step: int) -> dict:
    """Entry name -> position in rank ``rank``'s call order of ``step`` (1 = first)."""
    rows = query(path, f"SELECT name, row_number() OVER (ORDER BY seq) AS pos FROM calls "
                       f"WHERE rank = {rank} AND step = {step}").to_pylist()
    return {r["name"]: r["pos"] for r in rows}


def _odd_only(path: Path, odd: int, majority: tuple) -> dict:
    """Per step, the tensors whose CRC-32 the majority ranks share and rank ``odd`` does
    not (computed from the ``tensors`` view, independently of the replicas view)."""
    a, b = majority
    rows = query(path, f"""
        WITH p AS (SELECT step, name, io, arg, max(crc32) FILTER (WHERE rank = {a}) AS ca,
                          max(crc32) FILTER (WHERE rank = {b}) AS cb, max(crc32) FILTER (WHERE rank = {odd}) AS co
                   FROM tensors GROUP BY ALL)
        SELECT step, count(*) AS n FROM p WHERE ca = cb AND co <> ca GROUP BY step""").to_pylist()
    return {r["step"]: r["n"] for r in rows}


def test_data_parallel_nudge_names_the_head_weight(dp_runs, capsys):
    """3 DDP ranks, each fed its own batch; rank 2's head.weight[0, 0] nudged before step 2.
    The parameter is named; the downstream call is the SGD update of that weight (after the
    head, never the embedding that runs before it); only tensors the two other ranks hold
    alike are counted as differing on rank 2, not the activations that differ by data."""
    path = dp_runs / "dp_nudge"
    result = check_ranks(path)
    assert result.exit_code == 1
    f = result.groups[0].first
    assert (f.step, f.name, f.io, f.arg, f.category) == (W.NUDGE_STEP, "Module.module.head.Linear.forward.0",
                                                         "parameters", "weight", "parameter")
    assert f.odd == (W.NUDGE_RANK,) and f.majority == (0, 1) and f.verdict == CORRUPTION
    # rank 2's weight is the others' plus NUDGE in one element: the means differ by NUDGE / numel
    means = {r["rank"]: r for r in query(path, (
        f"SELECT rank, mean, numel FROM tensors WHERE step = {W.NUDGE_STEP} AND io = 'parameters' AND arg = 'weight' "
        "AND name = 'Module.module.head.Linear.forward.0'")).to_pylist()}
    assert (means[2]["mean"] - means[0]["mean"]) * means[0]["numel"] == pytest.approx(W.NUDGE, rel=1e-3)
    # the first downstream call: the SGD update whose input is the head weight (same CRC-32 on rank 0)
    (update,) = query(path, (
        f"SELECT a.name FROM tensors a JOIN tensors w USING (rank, step) WHERE a.rank = 0 AND a.step = {W.NUDGE_STEP} "
        "AND starts_with(a.name, 'Tensor.add_.') AND a.io = 'input_args' AND a.arg = '0' "
        "AND w.name = 'Module.module.head.Linear.forward.0' AND w.io = 'parameters' AND w.arg = 'weight' "
        "AND a.crc32 = w.crc32")).column("name").to_pylist()
    assert f.first_downstream == update
    pos = _positions(path, 0, W.NUDGE_STEP)
    assert pos[f.first_downstream] > pos["Functional.linear.1.forward"] > pos["Functional.embedding.0.forward"]
    # per step from the nudge on: the head's parameter record, the weight as the head
    # linear's input 1, SGD's input and output: the tensors ranks 0 and 1 share and rank 2 not
    assert f.spread == _odd_only(path, W.NUDGE_RANK, (0, 1)) == {W.NUDGE_STEP: 4, W.NUDGE_STEP + 1: 4}
    assert main(["check-ranks", str(path)]) == 1
    out = capsys.readouterr().out
    assert "embedding" not in out and f"first downstream call whose output differs: {update}" in out


def test_data_parallel_replicas_view_classifies_what_must_agree(dp_runs):
    """In the clean DDP run every tensor that must agree does, although most call tensors
    differ (each rank has its own batch); no call output with differing inputs is checked."""
    path = dp_runs / "dp_clean"
    assert check_ranks(path).exit_code == 0
    rows = query(path, "SELECT category, must_agree, inputs_agree, io_order, agree, name FROM replicas").to_pylist()
    assert not [r for r in rows if r["must_agree"] and not r["agree"]]
    data = [r for r in rows if r["category"] == "call" and not r["agree"]]
    assert len(data) > len(rows) // 2                      # data-dependent: differ on every rank
    assert all(not r["must_agree"] for r in data)
    checked = [r for r in rows if r["category"] == "call" and r["must_agree"]]
    # the SGD updates (Tensor.add_ of weight and gradient, both replicated after DDP's all-reduce)
    assert checked and {r["name"].split(".")[1] for r in checked} == {"add_"}
    assert all(r["inputs_agree"] and r["io_order"] == 1 for r in checked)
    for r in rows:   # parameters and collectives are always checked; activations fed by the batch never
        assert r["must_agree"] == (r["category"] != "call" or (r["io_order"] == 1 and r["inputs_agree"] is True))
