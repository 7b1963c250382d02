"""Multi-rank pairing: ``--rank-map`` pairs TARGET rank
T with BASELINE rank B; point-to-point and rooted collectives attribute a divergence
received through them to the sending rank. Dumps are hand-written upstream-layout
``step0/rank{N}/dump.json`` files whose answers are known by construction."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import msprobe.compare as C
from msprobe.cli import main
from msprobe.compare.errors import CompareInputError
from msprobe.compare.options import parse_rank_map


def rec(values) -> dict:
    a = np.asarray(values, dtype=np.float64)
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(a.shape), "Max": float(a.max()),
            "Min": float(a.min()), "Mean": float(a.mean()), "Norm": float(np.sqrt((a * a).sum())),
            "requires_grad": False}


def val(v) -> dict:
    return {"type": "int", "value": v}


def write_rank(root: Path, rank: int, data: dict) -> None:
    d = root / "step0" / f"rank{rank}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch",
                                             "dump_data_dir": None, "data": data}))
    (d / "stack.json").write_text(json.dumps({n: [f"File user.py, line {i + 1}, in f, \n y = op{i}(x)"]
                                              for i, n in enumerate(data)}))
    (d / "construct.json").write_text("{}")


def unary(x, y) -> dict:
    return {"input_args": [rec(x)], "input_kwargs": {}, "output": [rec(y)]}


A = np.array([1.0, -2.0, 3.0, -4.0])
B = np.array([0.5, 0.25, -0.75, 2.0])


# --- --rank-map -------------------------------------------------------------------------------

@pytest.fixture
def swapped(tmp_path):
    """TARGET rank 0 computed on A and rank 1 on B; the BASELINE recorded them the other way."""
    t, b = tmp_path / "t", tmp_path / "b"
    for root, ranks in ((t, (A, B)), (b, (B, A))):
        for rank, x in enumerate(ranks):
            write_rank(root, rank, {"Torch.exp.0.forward": unary(x, np.exp(x)),
                                    "Torch.tanh.0.forward": unary(np.exp(x), np.tanh(np.exp(x)))})
    return t, b


def test_rank_map_pairs_swapped_ranks(swapped, tmp_path):
    t, b = swapped
    r = C.compare(t, b)
    assert r.exit_code == 1 and {x["rank"] for x in r.summary["ranks"] if x["first_origin"] or x["first_diverged"]} == {0, 1}
    r = C.compare(t, b, rank_map="0:1,1:0")
    assert r.exit_code == 0 and r.verdict == "identical"
    assert [(x["rank"], x["baseline_rank"]) for x in r.summary["ranks"]] == [(0, 1), (1, 0)]
    assert "--rank-map: TARGET rank 0 ~ BASELINE rank 1, TARGET rank 1 ~ BASELINE rank 0" in r.summary["notes"]
    assert main(["compare", str(t), str(b), "--rank-map", "0:1,1:0", "-o", str(tmp_path / "o")]) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["verdict"] == "identical"


def test_rank_map_partial_leaves_a_rank_out(swapped):
    t, b = swapped
    # TARGET 0 ~ BASELINE 1; TARGET 1 would pair by id with BASELINE 1, which is taken: not compared,
    # and BASELINE 0 has no TARGET partner (its id 0 belongs to the pair 0:1)
    r = C.compare(t, b, rank_map={0: 1})
    assert [x["rank"] for x in r.summary["ranks"]] == [0]
    # what was compared is identical; ranks left out by the map make the answer incomplete
    assert r.verdict == "incomplete" and r.summary["verdict_of_compared"] == "identical" and r.exit_code == 3
    assert any("BASELINE rank 0 is not compared" in n for n in r.summary["notes"])
    assert any("TARGET only (not compared): rank 1 step 0" in n for n in r.summary["notes"])


@pytest.mark.parametrize("spec, message", [
    ("0-1", "--rank-map: got '0-1'; allowed: comma-separated TARGET:BASELINE rank pairs"),
    ("0:x", "--rank-map: got '0:x'"),
    ("0:1,0:0", "TARGET rank 0 is mapped twice"),
    ("0:1,1:1", "BASELINE rank 1 is mapped twice"),
    ("-1:0", "ranks are integers >= 0"),
])
def test_bad_rank_map(spec, message):
    with pytest.raises(CompareInputError, match=message.replace("(", r"\(")):
        parse_rank_map(spec)


def test_rank_map_names_a_missing_rank(swapped, capsys):
    t, b = swapped
    with pytest.raises(CompareInputError, match=r"--rank-map 0:5: BASELINE .* has no rank 5 \(ranks \[0, 1\]\)"):
        C.compare(t, b, rank_map="0:5")
    assert main(["compare", str(t), str(b), "--rank-map", "0:5"]) == 2
    assert main(["compare", str(t), str(b), "--rank-map", "0:1:2"]) == 2
    assert "--rank-map: got '0:1:2'" in capsys.readouterr().err


# --- point-to-point attribution -------------------------------------------------------------

ZERO = np.zeros(4)


def send(x, dst) -> dict:
    return {"input_args": [rec(x), val(dst)], "input_kwargs": {}, "output": [rec(x), val(dst)]}


def recv(got, src) -> dict:
    return {"input_args": [rec(ZERO), val(src)], "input_kwargs": {}, "output": [rec(got), val(src)]}


def p2p_runs(root: Path, scale: float) -> Path:
    """Three ranks. Rank 0 sends A to rank 1, then exp(A)*scale (scale 1.001 in the TARGET:
    its exp is the origin); rank 2 sends B to rank 1 before them; rank 1 receives from 2,
    0, 0 and applies tanh to the last value."""
    e = np.exp(A) * scale
    write_rank(root, 0, {"Distributed.send.0.forward": send(A, 1),
                         "Torch.exp.0.forward": unary(A, e),
                         "Distributed.send.1.forward": send(e, 1)})
    write_rank(root, 1, {"Distributed.recv.0.forward": recv(B, 2),
                         "Distributed.recv.1.forward": recv(A, 0),
                         "Distributed.recv.2.forward": recv(e, 0),
                         "Torch.tanh.0.forward": unary(e, np.tanh(e))})
    write_rank(root, 2, {"Distributed.send.0.forward": send(B, 1)})
    return root


def test_receive_attributed_to_the_sending_rank(tmp_path):
    t, b = p2p_runs(tmp_path / "t", 1.001), p2p_runs(tmp_path / "b", 1.0)
    r = C.compare(t, b)
    ranks = {x["rank"]: x for x in r.summary["ranks"]}
    assert ranks[0]["first_origin"]["name"] == "Torch.exp.0.forward"
    one = ranks[1]
    assert one["first_origin"] is None and one["counts"]["origin"] == 0
    fd = one["first_diverged"]
    # the third receive (the second from rank 0) carried the diverged data, not the one from rank 2
    assert fd["name"] == "Distributed.recv.2.forward" and fd["attributed_to"] == 0
    assert fd["reason"] == ("received through Distributed.recv.2.forward from rank 0 "
                            "(sent by Distributed.send.1.forward)")
    verdicts = dict(r.con.sql("SELECT t_name, verdict FROM calls WHERE rank = 1").fetchall())
    assert verdicts["Distributed.recv.0.forward"] == verdicts["Distributed.recv.1.forward"] == "pass"
    g = r.summary["global_origin"]
    assert (g["rank"], g["name"]) == (0, "Torch.exp.0.forward")
    assert r.stats["attributed"] == 1


def test_receive_with_clean_send_stays_an_origin(tmp_path):
    # the TARGET's rank 1 received different data although rank 0 sent the same: rank 1's origin
    t, b = tmp_path / "t", tmp_path / "b"
    for root, got in ((t, A * 1.01), (b, A)):
        write_rank(root, 0, {"Distributed.send.0.forward": send(A, 1)})
        write_rank(root, 1, {"Distributed.recv.0.forward": recv(got, 0)})
    r = C.compare(t, b)
    one = {x["rank"]: x for x in r.summary["ranks"]}[1]
    assert one["first_origin"]["name"] == "Distributed.recv.0.forward"
    assert "attributed_to" not in one["first_origin"]
    assert r.summary["global_origin"]["rank"] == 1


def test_batch_isend_irecv_items_pair_by_order(tmp_path):
    def op(kind, x, peer):
        return {"class_type": {"type": "str", "value": "torch.distributed.P2POp"},
                "op": {"type": "str", "value": kind}, "tensor": rec(x), "peer": val(peer)}

    def runs(root, scale):
        e = np.exp(A) * scale
        write_rank(root, 0, {"Torch.exp.0.forward": unary(A, e),
                             "Distributed.batch_isend_irecv.0.forward": {
                                 "input_args": [[op("isend", e, 1)]], "input_kwargs": {},
                                 "output": [[op("isend", e, 1)]]}})
        write_rank(root, 1, {"Distributed.batch_isend_irecv.0.forward": {
            "input_args": [[op("irecv", ZERO, 0)]], "input_kwargs": {}, "output": [[op("irecv", e, 0)]]}})
        return root

    r = C.compare(runs(tmp_path / "t", 1.001), runs(tmp_path / "b", 1.0))
    one = {x["rank"]: x for x in r.summary["ranks"]}[1]
    assert one["first_diverged"]["name"] == "Distributed.batch_isend_irecv.0.forward"
    assert one["first_diverged"]["attributed_to"] == 0 and one["counts"]["origin"] == 0
