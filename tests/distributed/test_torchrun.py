"""Distributed recording under ``torchrun --nproc_per_node=2`` (gloo, CPU).

One torchrun launch (module fixture) runs ``worker.py ddp``: a DDP model at level mix,
the Distributed calls of ``worker.collectives`` and a second debugger with ``rank: [1]``.
A second launch of two plain processes (``worker.py kill``) SIGKILLs rank 1 mid-step.
Expected values are recomputed here from the worker's seeds with numpy float64.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from store.log_reader import read_log
from store.query import query

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is needed")

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("worker.py")
LAUNCH_TIMEOUT_S = 240  # the run takes ~15 s on an idle 2-core machine, ~45 s under load


def rank_tensor(seed: int, n: int = 6) -> np.ndarray:
    """``worker.rank_tensor`` recomputed: the float32 values as float64."""
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)).numpy().astype(np.float64)


def np_stats(a: np.ndarray) -> dict:
    return {"Max": float(a.max()), "Min": float(a.min()), "Mean": float(a.mean()),
            "Norm": float(np.sqrt((a * a).sum()))}


def assert_stats(rec: dict, a: np.ndarray) -> None:
    assert rec["type"] == "torch.Tensor" and rec["shape"] == list(a.shape)
    exp = np_stats(a)
    for key in ("Max", "Min", "Mean", "Norm"):
        assert rec[key] == pytest.approx(exp[key], rel=1e-6, abs=1e-6), (key, rec[key], exp[key])


def load(dump: Path, step: int, rank: int) -> dict:
    return json.loads((dump / f"step{step}" / f"rank{rank}" / "dump.json").read_text())["data"]


def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT), e.get("PYTHONPATH", "")])
    e["OMP_NUM_THREADS"] = "1"
    return e


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(WORKER), "ddp", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert "msprobe" not in done.stdout + done.stderr, done.stderr[-3000:]   # no internal error logged
    # no warning caused by recording, except FSDP2's view warning (docs/distributed.md, known issue)
    warnings = [line for line in done.stderr.splitlines()
                if "Warning" in line and "FSDP2-wrapped module" not in line and "OMP_NUM_THREADS" not in line]
    assert not warnings, warnings
    return out


def test_two_rank_directories_per_step(ddp_run):
    for step in (0, 1):
        ranks = sorted(p.name for p in (ddp_run / "a" / f"step{step}").iterdir())
        assert ranks == ["rank0", "rank1"]
    logs = sorted(p.name.split(".")[0] for p in (ddp_run / "a" / ".msprobe" / "log").iterdir())
    assert logs == ["rank0", "rank1"]


def test_identical_names_on_both_ranks(ddp_run):
    for step in (0, 1):
        d0, d1 = load(ddp_run / "a", step, 0), load(ddp_run / "a", step, 1)
        assert list(d0) == list(d1)
        c0, c1 = (json.loads((ddp_run / "a" / f"step{step}" / f"rank{r}" / "construct.json").read_text())
                  for r in (0, 1))
        assert c0 == c1
    names = list(load(ddp_run / "a", 0, 0))
    assert names[:8] == [
        "Functional.linear.0.forward", "Module.module.fc1.Linear.forward.0",
        "Module.module.fc1.Linear.parameters_grad", "Torch.relu.0.forward",
        "Functional.linear.1.forward", "Module.module.fc2.Linear.forward.0",
        "Module.module.fc2.Linear.parameters_grad", "Module.module.Net.forward.0",
    ]
    assert [n for n in names if n.startswith("Distributed.")] == [
        "Distributed.all_reduce.0.forward", "Distributed.all_reduce.1.forward",
        "Distributed.all_reduce.2.forward", "Distributed.broadcast.0.forward",
        "Distributed.all_gather.0.forward", "Distributed.isend.0.forward",
        "Distributed.irecv.0.forward", "Distributed.batch_isend_irecv.0.forward",
        "Distributed.barrier.0.forward",
    ]


def test_all_reduce_sum_equals_sum_of_rank_inputs(ddp_run):
    total = rank_tensor(100) + rank_tensor(101)
    for rank in (0, 1):
        e = load(ddp_run / "a", 0, rank)["Distributed.all_reduce.0.forward"]
        assert list(e) == ["input_args", "input_kwargs", "is_recompute", "output"]
        assert_stats(e["input_args"][0], rank_tensor(100 + rank))   # before the call
        assert_stats(e["output"][0], total)                          # the buffer after it
        assert len(e["output"]) == 1 and e["input_kwargs"] == {}


def test_reduce_op_and_group_are_values(ddp_run):
    group_id = hashlib.md5(b"[0, 1]").hexdigest()
    for rank in (0, 1):
        e = load(ddp_run / "a", 0, rank)["Distributed.all_reduce.1.forward"]
        op = {"type": "torch.distributed.ReduceOp", "value": "RedOpType.MAX"}
        group = {"type": "torch.distributed.ProcessGroup", "value": [0, 1], "group_ranks": [0, 1],
                 "group_id": group_id}
        assert e["input_kwargs"] == {"op": op, "group": group}
        assert e["output"][1:] == [op, group]
        assert_stats(e["output"][0], np.maximum(rank_tensor(200), rank_tensor(201)))


def test_async_all_reduce_output_recorded_at_completion(ddp_run):
    for rank in (0, 1):
        report = json.loads((ddp_run / f"report{rank}.json").read_text())
        assert report["async_is_work"] is True
        e = load(ddp_run / "a", 0, rank)["Distributed.all_reduce.2.forward"]
        assert e["input_kwargs"] == {"async_op": {"type": "bool", "value": True}}
        assert_stats(e["input_args"][0], rank_tensor(300 + rank))
        assert_stats(e["output"][0], rank_tensor(300) + rank_tensor(301))
        assert e["output"][1] == {"type": "bool", "value": True}
        assert list(e) == ["input_args", "input_kwargs", "is_recompute", "output"]


def test_broadcast_gather_and_point_to_point(ddp_run):
    a = ddp_run / "a"
    d1 = load(a, 0, 1)
    b = d1["Distributed.broadcast.0.forward"]
    assert_stats(b["input_args"][0], np.zeros(6))
    assert_stats(b["output"][0], rank_tensor(400))
    assert b["input_kwargs"] == {"src": {"type": "int", "value": 0}}
    for rank in (0, 1):
        d = load(a, 0, rank)
        g = d["Distributed.all_gather.0.forward"]["output"]
        assert_stats(g[0][0], rank_tensor(500))
        assert_stats(g[0][1], rank_tensor(501))
        recv = d["Distributed.irecv.0.forward"]
        assert recv["input_kwargs"] == {"src": {"type": "int", "value": 1 - rank}}
        assert_stats(recv["input_args"][0], np.zeros(6))
        assert_stats(recv["output"][0], rank_tensor(600 + 1 - rank))   # filled when wait() returned
        report = json.loads((ddp_run / f"report{rank}.json").read_text())
        assert report["irecv_sum"] == pytest.approx(rank_tensor(600 + 1 - rank).sum(), rel=1e-6)
        send = d["Distributed.isend.0.forward"]
        assert send["input_kwargs"] == {"dst": {"type": "int", "value": 1 - rank}}
        batch = d["Distributed.batch_isend_irecv.0.forward"]
        ops = batch["output"][0]
        assert [op["op"]["value"] for op in ops] == ["isend", "irecv"]
        assert ops[0]["class_type"] == {"type": "str", "value": "torch.distributed.P2POp"}
        assert ops[0]["peer"] == {"type": "int", "value": 1 - rank}
        assert_stats(ops[0]["tensor"], rank_tensor(700 + rank))
        assert_stats(batch["input_args"][0][1]["tensor"], np.zeros(6))
        assert_stats(ops[1]["tensor"], rank_tensor(700 + 1 - rank))
        assert d["Distributed.barrier.0.forward"] == {"input_args": [], "input_kwargs": {},
                                                     "is_recompute": False, "output": []}


DOC = ROOT / "docs" / "distributed.md"


def doc_block(tag: str) -> str:
    """The fenced code block after ``<!-- {tag} -->`` in docs/distributed.md."""
    text = DOC.read_text()
    start = text.index(f"<!-- {tag} -->")
    body = text[text.index("\n", text.index("```", start)) + 1:]
    return body[: body.index("```")]


FIRST_NORM_DIFFERENCE = doc_block("sql: first_norm_difference")
FIRST_NAN_RANK = doc_block("sql: first_nan_rank")


def test_cross_rank_queries(ddp_run):
    row = query(ddp_run / "a", FIRST_NORM_DIFFERENCE).to_pylist()
    expected = np_stats(rank_tensor(100))["Norm"], np_stats(rank_tensor(101))["Norm"]
    assert len(row) == 1
    assert row[0]["step"] == 0 and row[0]["name"] == "Distributed.all_reduce.0.forward"
    assert (row[0]["io"], row[0]["arg"]) == ("input_args", "0")
    assert row[0]["norms"] == pytest.approx(list(expected), rel=1e-6)
    nan = query(ddp_run / "a", FIRST_NAN_RANK).to_pylist()
    assert [(r["rank"], r["step"], r["name"], r["pos"]) for r in nan] == [(1, 1, "Functional.linear.0.forward", 1)]
    ranks = query(ddp_run / "a", "SELECT DISTINCT rank FROM calls ORDER BY rank").column("rank").to_pylist()
    assert ranks == [0, 1]


def test_rank_filter_records_only_rank1(ddp_run):
    b = ddp_run / "b"
    assert sorted(p.name for p in b.iterdir()) == [".msprobe", "step0"]
    assert [p.name for p in (b / "step0").iterdir()] == ["rank1"]
    assert [p.name.split(".")[0] for p in (b / ".msprobe" / "log").iterdir()] == ["rank1"]
    assert query(b, "SELECT DISTINCT rank FROM calls").column("rank").to_pylist() == [1]
    e = load(b, 0, 1)["Distributed.all_reduce.0.forward"]
    assert_stats(e["output"][0], np.full(3, 3.0))
    assert json.loads((ddp_run / "report0.json").read_text())["b_hooked"] is False  # rank 0: no hooks at all
    assert json.loads((ddp_run / "report1.json").read_text())["b_hooked"] is True


def _start_kill_ranks(out: Path) -> list[subprocess.Popen]:
    procs = []
    for rank in (0, 1):
        e = env()
        e.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
        procs.append(subprocess.Popen([sys.executable, str(WORKER), "kill", str(out)], cwd=ROOT, env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def test_killed_rank_keeps_other_logs_and_export_rebuilds(tmp_path):
    procs = _start_kill_ranks(tmp_path)
    try:
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        while not (tmp_path / "ready1").exists():
            assert procs[1].poll() is None, procs[1].communicate()[0][-3000:]
            assert time.monotonic() < deadline, "rank 1 never reached its loop"
            time.sleep(0.05)
        procs[1].send_signal(signal.SIGKILL)
        assert procs[1].wait(timeout=30) == -signal.SIGKILL
        out0, _ = procs[0].communicate(timeout=LAUNCH_TIMEOUT_S)
        assert procs[0].returncode == 0, out0[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    dump = tmp_path / "k"
    live = {(s, r): load(dump, s, r) for s, r in ((0, 0), (1, 0), (2, 0), (0, 1), (1, 1))}
    assert list(live[(1, 1)]) == ["Torch.add.0.forward"]      # exported at rank 1's stop()
    for step in (0, 1, 2):
        shutil.rmtree(dump / f"step{step}")
    done = subprocess.run([sys.executable, "-m", "msprobe.cli", "export", str(dump)], cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for (step, rank), data in live.items():
        rebuilt = load(dump, step, rank)
        if (step, rank) != (1, 1):
            assert rebuilt == data, (step, rank)
    total = rank_tensor(100) + rank_tensor(101)
    for rank in (0, 1):
        assert_stats(load(dump, 0, rank)["Distributed.all_reduce.0.forward"]["output"][0], total)
    # rank 1, step 1: what was flushed before the kill, a prefix of Torch.add.0, 1, 2, ...
    rebuilt = load(dump, 1, 1)
    names = list(rebuilt)
    assert names[0] == "Torch.add.0.forward" and rebuilt[names[0]] == live[(1, 1)][names[0]]
    assert names == [f"Torch.add.{k}.forward" for k in range(len(names))]
    for k, name in enumerate(names[1:], start=1):
        assert_stats(rebuilt[name]["input_args"][0], np.arange(4.0) + k)
        assert_stats(rebuilt[name]["output"][0], np.arange(4.0) + k + 1)
    assert list(load(dump, 2, 0)) == ["Torch.mul.0.forward"]


def test_parquet_copy_answers_the_same_cross_rank_query(ddp_run, tmp_path):
    """docs/distributed.md "Outgrowing one machine": compact, then DuckDB over the files only."""
    import duckdb

    from msprobe.cli import main

    assert main(["compact", str(ddp_run / "a"), "-o", str(tmp_path / "pq")]) == 0
    con = duckdb.connect()
    con.execute(f"CREATE VIEW tensors AS SELECT * FROM read_parquet('{tmp_path}/pq/step_bucket=*/rank=*/*.parquet', "
                "hive_partitioning = true) WHERE row = 'leaf' AND leaf_kind = 'tensor'")
    got = con.execute(FIRST_NORM_DIFFERENCE).fetchall()
    assert [(r[0], r[1], r[2], r[3]) for r in got] == [(0, "Distributed.all_reduce.0.forward", "input_args", "0")]


def test_documented_pyarrow_duckdb_reader(ddp_run):
    """docs/distributed.md "DuckDB without msprobe": the snippet, run on this dump."""
    code = doc_block("python: load_logs").replace('"/shared/run1"', repr(str(ddp_run / "a")))
    scope: dict = {}
    exec(compile(code, "docs/distributed.md", "exec"), scope)
    con = scope["con"]
    assert [tuple(r[:4]) for r in con.execute(FIRST_NORM_DIFFERENCE).fetchall()] == [
        (0, "Distributed.all_reduce.0.forward", "input_args", "0")]
    assert [tuple(r) for r in con.execute(FIRST_NAN_RANK).fetchall()] == [(1, 1, "Functional.linear.0.forward", 1)]
    assert scope["log"].num_rows == read_log(ddp_run / "a").table.num_rows


def reference_fsdp():
    """The worker's Net and FSDP batch, unsharded: outputs and gradients by autograd."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dist_worker", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    torch.manual_seed(0)
    net = worker.Net()
    x = worker.fsdp_batch()
    h = net.fc1(x)
    y = net.fc2(torch.relu(h))
    grads = torch.autograd.grad(y.sum(), [net.fc1.weight, net.fc1.bias, net.fc2.weight, net.fc2.bias])
    return h.detach(), y.detach(), [g.double().numpy() for g in grads]


def test_fsdp_names_stable_across_ranks_and_values(ddp_run):
    h, y, (g_w1, g_b1, g_w2, g_b2) = reference_fsdp()
    d = {r: load(ddp_run / "fsdp1", 0, r) for r in (0, 1)}
    assert list(d[0]) == list(d[1])
    assert "Module._fsdp_wrapped_module.fc1.Linear.forward.0" in d[0]
    for r in (0, 1):
        assert_stats(d[r]["Module._fsdp_wrapped_module.fc1.Linear.forward.0"]["output"][0], h.double().numpy())
        assert_stats(d[r]["Module._fsdp_wrapped_module.Net.forward.0"]["output"][0], y.double().numpy())
    d = {r: load(ddp_run / "fsdp2", 0, r) for r in (0, 1)}
    assert list(d[0]) == list(d[1])
    for r in (0, 1):
        assert_stats(d[r]["Module.fc1.FSDPLinear.forward.0"]["output"][0], h.double().numpy())
        # parameters and gradients are DTensors sharded on dim 0: recorded by the local shard
        pg1, pg2 = d[r]["Module.fc1.FSDPLinear.parameters_grad"], d[r]["Module.fc2.FSDPLinear.parameters_grad"]
        assert_stats(pg1["weight"][0], np.array_split(g_w1, 2, axis=0)[r])
        assert_stats(pg1["bias"][0], np.array_split(g_b1, 2)[r])
        assert_stats(pg2["weight"][0], np.array_split(g_w2, 2, axis=0)[r])
        assert_stats(pg2["bias"][0], np.array_split(g_b2, 2)[r])
