"""Two ranks under ``torchrun --nproc_per_node=2`` (gloo); rank 1
perturbs ``torch.tanh`` before an all_reduce of its output (see dist_worker.py). Rank 1's
origin is that tanh; rank 0's first diverged call is the all_reduce, attributed to rank 1."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

import msprobe.compare as C
from msprobe.cli import main

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is needed")

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("dist_worker.py")


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist_compare")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(WORKER), str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return out


def test_rank1_origin_rank0_attributed(two_rank_runs, tmp_path):
    r = C.compare(two_rank_runs / "target", two_rank_runs / "base")
    assert r.exit_code == 1
    ranks = {x["rank"]: x for x in r.summary["ranks"]}
    assert sorted(ranks) == [0, 1]
    one = ranks[1]["first_origin"]
    assert one["name"] == "Torch.tanh.0.forward" and one["direction"] == "forward"
    assert "h = torch.tanh(self.fc1(x))" in one["stack"][0]
    assert ranks[1]["first_diverged"] is None
    assert ranks[0]["first_origin"] is None
    zero = ranks[0]["first_diverged"]
    assert zero["name"] == "Distributed.all_reduce.0.forward"
    assert zero["attributed_to"] == 1
    assert zero["reason"] == "received through Distributed.all_reduce.0.forward from rank 1"
    assert ranks[0]["counts"]["origin"] == 0
    g = r.summary["global_origin"]
    assert (g["rank"], g["name"]) == (1, "Torch.tanh.0.forward")
    # on rank 0 everything before the all_reduce passes (tanh included)
    before = r.con.sql("SELECT DISTINCT verdict FROM calls WHERE rank = 0 AND ord < (SELECT ord FROM calls "
                       "WHERE rank = 0 AND t_name = 'Distributed.all_reduce.0.forward')").fetchall()
    assert before == [("pass",)]
    # same answer through the CLI's summary.json
    assert main(["compare", str(two_rank_runs / "target"), str(two_rank_runs / "base"), "-o", str(tmp_path / "o")]) == 1
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["global_origin"]["rank"] == 1
    assert summary["ranks"][0]["first_diverged"]["attributed_to"] == 1


def test_identical_two_rank_runs_and_rank_selection(two_rank_runs):
    r = C.compare(two_rank_runs / "base", two_rank_runs / "base")
    assert r.exit_code == 0 and r.summary["global_origin"] is None
    # rank 0 alone: no peer to attribute to, the all_reduce is rank 0's origin
    r0 = C.compare(two_rank_runs / "target", two_rank_runs / "base", rank="0")
    assert r0.first[0]["name"] == "Distributed.all_reduce.0.forward"


def _con(rows):
    import duckdb
    con = duckdb.connect()
    con.execute("CREATE TABLE tensors (rank INT, step INT, t_call VARCHAR, io VARCHAR, arg VARCHAR, "
                "verdict VARCHAR, t_value_json VARCHAR, role VARCHAR)")
    for row in rows:
        con.execute("INSERT INTO tensors VALUES (?, ?, ?, ?, ?, ?, ?, 'in')", list(row))
    return con


def _call(rank, name="Distributed.broadcast.0.forward", verdict="origin"):
    return {"rank": rank, "step": 0, "t_name": name, "b_name": name, "verdict": verdict, "reason": "x"}


def test_directed_broadcast_counts_only_its_source():
    from msprobe.compare.distributed import attribute_collectives
    b = "Distributed.broadcast.0.forward"
    src0 = '{"type": "int", "value": 0}'
    # ranks 0 and 2 fed diverged data, rank 1 received; the source (src=0) is rank 0
    con = _con([(0, 0, b, "input_args", "0", "diverged", None), (0, 0, b, "input_args", "1", "identical", src0),
                (1, 0, b, "input_args", "0", "identical", None), (1, 0, b, "input_args", "1", "identical", src0),
                (2, 0, b, "input_args", "0", "diverged", None), (2, 0, b, "input_args", "1", "identical", src0)])
    rows = [_call(0, verdict="propagated"), _call(1), _call(2, verdict="propagated")]
    assert attribute_collectives(con, rows) == 1
    assert rows[1]["verdict"] == "propagated" and rows[1]["attributed_to"] == 0
    # src=2 (kwarg) with clean input there: rank 1's origin stays its own
    src2 = '{"type": "int", "value": 2}'
    con = _con([(0, 0, b, "input_args", "0", "diverged", None), (1, 0, b, "input_kwargs", "src", "identical", src2),
                (2, 0, b, "input_args", "0", "identical", None)])
    rows = [_call(0, verdict="propagated"), _call(1), _call(2, verdict="pass")]
    assert attribute_collectives(con, rows) == 0 and rows[1]["verdict"] == "origin"
    # group membership limits the peers of an all_reduce
    a = "Distributed.all_reduce.0.forward"
    grp = '{"type": "torch.distributed.ProcessGroup", "value": [0, 1], "group_ranks": [0, 1]}'
    con = _con([(1, 0, a, "input_kwargs", "group", "identical", grp), (2, 0, a, "input_args", "0", "diverged", None)])
    rows = [_call(1, a), _call(2, a, verdict="propagated")]
    assert attribute_collectives(con, rows) == 0


def test_reduce_attributes_only_its_destination():
    from msprobe.compare.distributed import attribute_collectives
    red = "Distributed.reduce.0.forward"
    dst0 = '{"type": "int", "value": 0}'
    # rank 1 fed diverged data into reduce(dst=0): rank 0 (the destination) received it; rank 2's
    # diverged output is its own (a reduce delivers nothing to it)
    con = _con([(0, 0, red, "input_args", "0", "identical", None), (0, 0, red, "input_args", "1", "identical", dst0),
                (1, 0, red, "input_args", "0", "diverged", None), (1, 0, red, "input_args", "1", "identical", dst0),
                (2, 0, red, "input_args", "0", "identical", None), (2, 0, red, "input_args", "1", "identical", dst0)])
    rows = [_call(0, red), _call(1, red, verdict="propagated"), _call(2, red)]
    assert attribute_collectives(con, rows) == 1
    assert rows[0]["verdict"] == "propagated" and rows[0]["attributed_to"] == 1
    assert rows[2]["verdict"] == "origin" and "attributed_to" not in rows[2]


def test_isend_irecv_keywords_pair_by_order():
    from msprobe.compare.distributed import attribute_collectives
    s0, s1 = "Distributed.isend.0.forward", "Distributed.isend.1.forward"
    r0, r1 = "Distributed.irecv.0.forward", "Distributed.irecv.1.forward"
    to1, from0 = '{"type": "int", "value": 1}', '{"type": "int", "value": 0}'
    # rank 0: isend(clean, dst=1), isend(bad, dst=1); rank 1: irecv(src=0) twice, both judged origin
    con = _con([(0, 0, s0, "input_kwargs", "tensor", "identical", None), (0, 0, s0, "input_kwargs", "dst", "identical", to1),
                (0, 0, s1, "input_kwargs", "tensor", "diverged", None), (0, 0, s1, "input_kwargs", "dst", "identical", to1),
                (1, 0, r0, "input_kwargs", "src", "identical", from0), (1, 0, r1, "input_kwargs", "src", "identical", from0)])
    rows = [dict(_call(0, s0, verdict="pass"), ord=1), dict(_call(0, s1, verdict="propagated"), ord=2),
            dict(_call(1, r0), ord=1), dict(_call(1, r1), ord=2)]
    assert attribute_collectives(con, rows) == 1
    assert rows[2]["verdict"] == "origin"                       # the first send was clean
    assert rows[3]["verdict"] == "propagated" and rows[3]["attributed_to"] == 0
    assert rows[3]["reason"] == f"received through {r1} from rank 0 (sent by {s1})"
