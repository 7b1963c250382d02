"""Comparing dumps of different tools: ours against upstream 1.2.2 and 26.2.0 fixtures of the
same seeded computations (``tests/compare/data/upstream``, written by ``tools/upstream_dumps.py``
under each upstream release), and the reading of 26.x's layout.

Ours is recorded here, in-process, with the same function the fixtures were made with.
The skip counts asserted are counted here from the dump files themselves.
"""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

import msprobe.compare as C
from msprobe.compare.errors import CompareInputError
from msprobe.compare.load import load_side
from msprobe.compare.producers import OURS, UPSTREAM_1, UPSTREAM_26

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data" / "upstream"
VERSIONS = {"1.2.2": UPSTREAM_1, "26.2.0": UPSTREAM_26}
RUNS = [(w, lv) for w in ("cnn", "mlp") for lv in ("L1", "mix")]
FIRST_PERTURBED = {"cnn": "Functional.relu.0.forward", "mlp": "Torch.tanh.0.forward"}


def _tool():
    spec = importlib.util.spec_from_file_location("upstream_dumps", ROOT / "tools" / "upstream_dumps.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    """``{(workload, level, perturbed): dump_path}`` recorded by ours in this process."""
    tool = _tool()
    d = tmp_path_factory.mktemp("cross_tool")
    out = {}
    for w, lv in RUNS:
        out[(w, lv, False)] = d / f"{w}_{lv}"
        tool.record(out[(w, lv, False)], w, lv)
    for w, lv in RUNS:
        out[(w, lv, True)] = d / f"{w}_{lv}_perturbed"
        tool.record(out[(w, lv, True)], w, lv, perturb=True)
    return out


def fixture(version: str, run: str) -> Path:
    return DATA / version / run


def dump_json(root: Path) -> dict:
    (f,) = list(root.rglob("dump.json"))
    return json.loads(f.read_text())["data"]


def api_backward_output_leaves(data: dict) -> int:
    """Leaves under ``output`` of API backward entries, counted as the importer flattens:
    every tensor record, null, value and empty container is one leaf."""
    def count(v) -> int:
        if isinstance(v, list):
            return sum(count(x) for x in v) if v else 1
        if isinstance(v, dict) and v and "type" not in v and "dtype" not in v:
            return sum(count(x) for x in v.values())
        return 1
    return sum(count(e["output"]) for name, e in data.items()
               if name.endswith(".backward") and not name.startswith(("Module.", "Cell.")) and e.get("output"))


def ours_api_backward_output_leaves(path: Path) -> int:
    from store.query import query
    t = query(path, "SELECT count(*) AS n FROM tensors t JOIN calls c USING (rank, step, seq) "
                    "WHERE c.kind = 'api_backward' AND t.io = 'output'")
    n_tensors = t["n"][0].as_py()
    # non-tensor leaves (null gradients, ints) count too: read them from the export
    data = dump_json(path)
    return max(n_tensors, api_backward_output_leaves(data))


#: tensors whose exact value is 0, so that what both runs record is rounding noise of the
#: CPU's kernels: the CNN's conv bias feeds BatchNorm, which subtracts the batch mean of each
#: channel, so dL/d(conv bias) = sum of the channel's output gradients = 0 in exact arithmetic
ZERO_BY_CONSTRUCTION = {("cnn", "Module.conv.Conv2d.parameters_grad", "bias")}


def assert_rounding_noise(con, side: str) -> None:
    """Assert that the conv bias gradient of ``side`` (``"t"`` or ``"b"``) is within the
    rounding bound of its reduction: each channel sums n = 64 output gradients g, so its
    float32 error is at most n·eps32·sum|g| <= n·eps32·sqrt(n)·||g|| (Higham, recursive
    summation), with ||g|| the Norm of the conv module's backward input on the same side."""
    (g_norm,), = con.sql(f"SELECT {side}_norm FROM tensors WHERE t_call = 'Module.conv.Conv2d.backward.0' "
                         "AND io = 'input'").fetchall()
    (mx, mn, nrm), = con.sql(f"SELECT {side}_max, {side}_min, {side}_norm FROM tensors "
                             "WHERE t_call = 'Module.conv.Conv2d.parameters_grad' AND io = 'bias'").fetchall()
    n = 4 * 4 * 4
    bound = n * 2.0 ** -23 * math.sqrt(n) * g_norm
    assert max(abs(mx), abs(mn)) <= bound and nrm <= math.sqrt(2) * bound, (mx, mn, nrm, bound)


@pytest.mark.parametrize("version", sorted(VERSIONS))
@pytest.mark.parametrize("workload,level", RUNS)
def test_ours_against_upstream_no_divergence(ours, version, workload, level):
    """Ours against the upstream fixture of the same computation: no divergence, except on
    a tensor whose exact value is 0 (:data:`ZERO_BY_CONSTRUCTION`): there both sides hold
    only the rounding noise of their CPU's kernels (the fixtures were recorded on another
    CPU), and each side's noise is checked against the reduction's rounding bound."""
    path = ours[(workload, level, False)]
    up = fixture(version, f"{workload}_{level}")
    for target, baseline, labels in ((path, up, ("TARGET", "BASELINE")), (up, path, ("BASELINE", "TARGET"))):
        r = C.compare(target, baseline)
        diverged = set(r.con.sql("SELECT t_call, io FROM tensors WHERE verdict = 'diverged'").fetchall())
        noise = {(call, io) for w, call, io in ZERO_BY_CONSTRUCTION if w == workload}
        assert diverged <= noise, (target, baseline, diverged)
        if diverged:
            assert_rounding_noise(r.con, "t")
            assert_rounding_noise(r.con, "b")
        else:
            assert r.summary["verdict"] in ("identical", "close"), (target, baseline, r.first)
        assert r.summary["producers"] == {labels[0]: OURS, labels[1]: VERSIONS[version]}
        skipped = r.summary["skipped"]
        assert set(skipped) == {"api_backward_output"}
        assert skipped["api_backward_output"][labels[1]] == api_backward_output_leaves(dump_json(up))
        assert skipped["api_backward_output"][labels[0]] == api_backward_output_leaves(dump_json(path))
        assert any(n.startswith("skipped ") and "api_backward_output" in n for n in r.summary["notes"])
        # what is compared is compared: forward outputs and backward inputs paired and judged
        (n_judged,), = r.con.sql("SELECT count(*) FROM tensors WHERE verdict IN ('identical', 'close')").fetchall()
        assert n_judged >= 10
        (n_api_bwd_out,), = r.con.sql("SELECT count(*) FROM tensors WHERE call_kind = 'api_backward' "
                                      "AND io = 'output'").fetchall()
        assert n_api_bwd_out == 0


@pytest.mark.parametrize("workload,level", RUNS)
def test_upstream_releases_against_each_other(workload, level):
    a, b = fixture("1.2.2", f"{workload}_{level}"), fixture("26.2.0", f"{workload}_{level}")
    r = C.compare(a, b)
    assert r.summary["verdict"] in ("identical", "close"), r.first
    assert r.summary["producers"] == {"TARGET": UPSTREAM_1, "BASELINE": UPSTREAM_26}
    assert r.summary["skipped"] == {}    # the same backward semantics: everything is compared
    (n,), = r.con.sql("SELECT count(*) FROM tensors WHERE call_kind = 'api_backward' AND io = 'output' "
                      "AND verdict IN ('identical', 'close')").fetchall()
    assert n > 0


@pytest.mark.parametrize("version", sorted(VERSIONS))
@pytest.mark.parametrize("workload,level", RUNS)
def test_perturbed_run_diverges_at_the_perturbed_op(ours, version, workload, level):
    """The allowances do not hide a real divergence: an op's output scaled by 1 + 1e-3 is
    the first origin, with e the scale's 1e-3 (Max of a non-negative output moves by it)."""
    for target, baseline in ((ours[(workload, level, True)], fixture(version, f"{workload}_{level}")),
                             (fixture(version, f"{workload}_{level}"), ours[(workload, level, True)])):
        r = C.compare(target, baseline)
        assert r.summary["verdict"] == "diverged"
        first = r.first[0]
        assert first["name"] == FIRST_PERTURBED[workload]
        assert first["e"] == pytest.approx(1e-3, rel=0.05)


def test_reads_26_layout():
    side = load_side(fixture("26.2.0", "cnn_mix"), "BASELINE")
    assert side.producer == UPSTREAM_26
    assert set(side.calls["rank"].to_pylist()) == {0} and set(side.calls["step"].to_pylist()) == {0}
    raw = dump_json(fixture("26.2.0", "cnn_mix"))
    assert "Module.fc.Linear.parameters_grad.0" in raw
    calls = {r["name"]: r for r in side.calls.to_pylist()}
    assert calls["Module.fc.Linear.parameters_grad"]["kind"] == "parameters_grad"
    # ordered after the module's backward (its gradients arrive with it)
    assert calls["Module.fc.Linear.parameters_grad"]["seq"] > calls["Module.fc.Linear.backward.0"]["seq"]
    # the deduplicated stack.json: every name of a group gets the group's frames
    (stack_file,) = list(fixture("26.2.0", "cnn_mix").rglob("stack.json"))
    groups = json.loads(stack_file.read_text())
    names, frames = next(iter(groups.values()))
    sid = calls[names[0]]["stack_id"]
    assert sid is not None and all(calls[n]["stack_id"] == sid for n in names if n in calls)
    stored = [f for s, _, f in sorted(zip(side.stacks["stack_id"].to_pylist(), side.stacks["depth"].to_pylist(),
                                          side.stacks["frame"].to_pylist())) if s == sid]
    assert stored == frames
    leaves = [r for r in side.leaves.to_pylist() if r["name"] == "Module.fc.Linear.parameters_grad"]
    by_io = {r["io"]: r for r in leaves}
    w = raw["Module.fc.Linear.parameters_grad.0"]["weight"][0]
    assert by_io["weight"]["shape"] == w["shape"] and by_io["weight"]["norm"] == w["Norm"]
    assert load_side(fixture("1.2.2", "cnn_mix"), "TARGET").producer == UPSTREAM_1


def test_our_export_is_recognised_as_ours(ours):
    side = load_side(ours[("cnn", "L1", False)] / "step0", "TARGET")
    assert side.source == "dump.json" and side.producer == OURS


def _write(root: Path, sub: str, data: dict, **header) -> Path:
    d = root / "step0" / sub
    d.mkdir(parents=True)
    (d / "dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch",
                                             "dump_data_dir": None, **header, "data": data}))
    return root


def test_dtensor_records_are_tensors_with_their_placements(tmp_path):
    rec = {"type": "torch.distributed.tensor.DTensor", "dtype": "torch.float32", "shape": [4, 3],
           "md5": "0x3f8000003f800000", "requires_grad": False, "device_mesh": [0, 1],
           "placements": [{"Shard": {"dim": 0}}]}
    _write(tmp_path / "d", "rank0", {"Torch.relu.0.forward": {"input_args": [rec], "input_kwargs": {}, "output": [rec]}})
    side = load_side(tmp_path / "d", "TARGET")
    (leaf, _) = side.leaves.to_pylist()
    assert leaf["leaf_kind"] == "tensor" and leaf["crc32"] == "0x3f8000003f800000" and leaf["shape"] == [4, 3]
    assert json.loads(leaf["value_json"]) == {"device_mesh": [0, 1], "placements": [{"Shard": {"dim": 0}}]}
    assert side.producer == UPSTREAM_26


def test_xor_checksums_of_ours_and_26_agree(tmp_path):
    """Ours and 26.x take the same XOR checksum of the same values. The fixture was
    recorded on another CPU, so only tensors that no kernel of the run computed (the input,
    the target, parameters and buffers as passed to each call, non-tensor arguments) hold
    the same values on every CPU; those must have the same checksum. Every value a kernel
    computed may round differently here and is not compared bit for bit."""
    tool = _tool()
    path = tmp_path / "ours_xor"
    loss = tool.record(path, "cnn", "L1", summary_mode="xor")
    r = C.compare(path, fixture("26.2.0", "cnn_L1_xor"))
    assert r.summary["mode"] == "md5"      # auto: checksums and no statistics on both sides
    rows = r.con.sql("SELECT t_call, io, arg, verdict, t_md5 FROM tensors WHERE verdict NOT IN ('unpaired')").fetchall()
    differ = {(c, io, a) for c, io, a, v, _ in rows if v != "identical"}
    # a forward argument is computed by a kernel of this run when it is some forward output
    computed = {m for c, io, a, v, m in rows if io == "output"}
    kernel_free = {(c, io, a) for c, io, a, v, m in rows
                   if c.endswith(".forward") and io == "input_args" and (m is None or m not in computed)}
    # 26.x takes the checksum of an argument the call updates in place after the call
    # (batch_norm's running mean and variance)
    in_place = {("Functional.batch_norm.0.forward", "input_args", "1"),
                ("Functional.batch_norm.0.forward", "input_args", "2")}
    assert in_place <= differ
    assert (kernel_free - in_place) & differ == set()
    # the input, both weights and biases, BatchNorm's weight and bias, the target, and the
    # non-tensor arguments of conv2d and batch_norm
    assert len(kernel_free - in_place) >= 14
    assert ("Functional.conv2d.0.forward", "input_args", "0") in kernel_free
    assert ("Functional.linear.0.forward", "input_args", "1") in kernel_free
    # 26.x writes a 0-dim tensor's value as its md5; ours is the XOR of the value's bits
    (t_md5, b_md5), = r.con.sql("SELECT t_md5, b_md5 FROM tensors WHERE t_call = 'Functional.cross_entropy.0.forward' "
                                "AND io = 'output'").fetchall()
    up_loss = dump_json(fixture("26.2.0", "cnn_L1_xor"))["Functional.cross_entropy.0.forward"]["output"][0]["md5"]
    assert b_md5 == "0x%016x" % int(np.array(up_loss, np.float32).view(np.uint32))
    assert t_md5 == "0x%016x" % int(np.array(loss, np.float32).view(np.uint32))


def test_checksums_of_different_kinds_are_not_compared(tmp_path):
    tool = _tool()
    path = tmp_path / "ours_md5"
    tool.record(path, "cnn", "L1", summary_mode="md5")
    with pytest.raises(CompareInputError, match="different kinds.*crc32.*xor"):
        C.compare(path, fixture("26.2.0", "cnn_L1_xor"), mode="md5")


def _stat(values, dtype="torch.float32", norm=None, shape=None):
    a = np.asarray(values, np.float64)
    return {"type": "torch.Tensor", "dtype": dtype, "shape": list(a.shape) if shape is None else shape,
            "Max": float(a.max()), "Min": float(a.min()), "Mean": float(a.mean()),
            "Norm": float(np.sqrt((a * a).sum())) if norm is None else norm, "requires_grad": False}


def _big(norm, n=1_000_000):
    """A record of n elements: Max 1, Min -1, Mean 0, the given Norm."""
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [n], "Max": 1.0, "Min": -1.0, "Mean": 0.0,
            "Norm": norm, "requires_grad": False}


def _as_ours(root: Path) -> Path:
    """``root/step0``, with ``root/.msprobe/log`` beside it: the layout our exporter writes."""
    (root / ".msprobe" / "log").mkdir(parents=True)
    return root / "step0"


@pytest.mark.parametrize("rel_norm,verdict", [(50 * 2.0 ** -23, "close"), (1e-3, "diverged")])
def test_statistics_allowance_follows_the_producers(tmp_path, rel_norm, verdict):
    """torch.norm's float32 accumulation: an upstream Norm of 1e6 elements off by 50 eps32 is
    rounding (allowance eps32·(2 + n/1000) ≈ 1002 eps32, plus ours eps32·(2 + log2 n)), 1e-3 is not; between two dumps of
    one producer the same 50 eps32 is a divergence (no allowance, float32 rtol 1.3e-6)."""
    norm = 500.0
    entry = lambda nrm: {"Torch.tanh.0.forward": {"input_args": [_big(norm)], "input_kwargs": {},
                                                  "output": [_big(nrm)]}}
    up = _write(tmp_path / "up", "proc7", entry(norm * (1 + rel_norm)))
    mine = _as_ours(_write(tmp_path / "mine", "rank", entry(norm)))
    r = C.compare(up, mine)
    assert r.summary["producers"] == {"TARGET": UPSTREAM_26, "BASELINE": OURS}
    (e, v), = r.con.sql("SELECT e, verdict FROM tensors WHERE io = 'output'").fetchall()
    # upstream's torch.norm allowance plus ours (the float32 cascade of our fallback path)
    allowance = 2.0 ** -23 * (2 + 1e6 / 1000) + 2.0 ** -23 * (2 + math.log2(1e6))
    assert e == pytest.approx(max(rel_norm - allowance, 0.0), abs=1e-12)
    assert v == verdict
    same = C.compare(up, _write(tmp_path / "up2", "proc8", entry(norm)))
    assert same.summary["producers"] == {"TARGET": UPSTREAM_26, "BASELINE": UPSTREAM_26}
    (e2, v2), = same.con.sql("SELECT e, verdict FROM tensors WHERE io = 'output'").fetchall()
    assert e2 == pytest.approx(rel_norm, rel=1e-6) and v2 == "diverged"


def test_upstream_zero_dim_norm_is_its_absolute_value(tmp_path):
    # upstream writes a 0-dim tensor's value as its Norm (spec 8, defect 10); ours |value|
    loss_up = _stat([-2.5], shape=[]) | {"Norm": -2.5}
    loss_ours = _stat([-2.5], shape=[]) | {"Norm": 2.5}
    x = _stat([1.0, -2.0, 3.0])
    entry = lambda out: {"Torch.sum.0.forward": {"input_args": [x], "input_kwargs": {}, "output": [out]}}
    r = C.compare(_write(tmp_path / "up", "rank", entry(loss_up)), _as_ours(_write(tmp_path / "o", "rank", entry(loss_ours))))
    assert r.summary["verdict"] == "identical"


def test_alias_slots_are_skipped_and_counted(tmp_path):
    """``x * x`` gives one gradient for both slots; the second carries alias_of and is skipped."""
    import torch

    from msprobe.pytorch import PrecisionDebugger

    def run(path: Path, scale: float):
        cfg = path.parent / f"{path.name}.json"
        cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(path), "level": "L1"}))
        torch.manual_seed(0)
        x = torch.randn(3, 4, requires_grad=True)
        dbg = PrecisionDebugger(config_path=str(cfg))
        dbg.start()
        y = torch.mul(x, x)
        (y * scale).sum().backward()
        dbg.stop()
        dbg.step()
        dbg.close()
        return path
    a, b = run(tmp_path / "a", 1.0), run(tmp_path / "b", 1.0)
    data = dump_json(a)
    aliases = [(name, i) for name, e in data.items() for i, rec in enumerate(e.get("output") or [])
               if isinstance(rec, dict) and "alias_of" in rec]
    assert aliases == [("Torch.mul.0.backward", 1)]
    assert data["Torch.mul.0.backward"]["output"][1]["alias_of"] == "output.0"
    r = C.compare(a, b)
    assert r.summary["verdict"] == "identical"
    assert list(r.summary["skipped"]) == ["alias_slot"]
    assert (r.summary["skipped"]["alias_slot"]["TARGET"], r.summary["skipped"]["alias_slot"]["BASELINE"]) == (1, 1)
    rows = r.con.sql("SELECT io, arg FROM tensors WHERE t_call = 'Torch.mul.0.backward'").fetchall()
    assert ("output", "1") not in rows and ("output", "0") in rows
    # the referenced slot is still compared: a changed gradient there diverges
    c = run(tmp_path / "c", 1.5)
    r2 = C.compare(c, a)
    (v,), = r2.con.sql("SELECT verdict FROM tensors WHERE t_call = 'Torch.mul.0.backward' AND io = 'output' "
                       "AND arg = '0'").fetchall()
    assert v == "diverged"
    # an alias slot in an upstream-layout dump.json (our export) is skipped the same way
    r3 = C.compare(a / "step0", b)
    assert r3.summary["skipped"]["alias_slot"]["TARGET"] == 1


PEER_DIRS = {"26.2.0": "/work/wt/_peers/u262", "1.2.2": "/work/wt/_peers/u122"}


def _peer(version: str) -> tuple[Path, dict]:
    """The ``msprobe`` script of an upstream peer of ``version`` and the environment to run
    it in: ``$MSPROBE_UPSTREAM_PYTHON`` when it holds that version, else the peer
    directory of ``tools/upstream_dumps.py``'s docstring; skips when neither has it."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}   # our msprobe must not shadow theirs
    candidates = [os.environ.get("MSPROBE_UPSTREAM_PYTHON"), f"{PEER_DIRS[version]}/bin/python"]
    for python in filter(None, candidates):
        exe = Path(python).with_name("msprobe")
        if not exe.is_file():
            continue
        got = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('mindstudio-probe'))"],
                             capture_output=True, text=True, env=env, cwd="/", timeout=120).stdout.strip()
        if got == version:
            return exe, env
    pytest.skip(f"upstream mindstudio-probe {version} not installed: neither MSPROBE_UPSTREAM_PYTHON "
                f"({os.environ.get('MSPROBE_UPSTREAM_PYTHON')!r}) nor {PEER_DIRS[version]} holds it "
                f"(shared/tools/install-upstream-peer.sh DIR {version})")


def _upstream_compare(version: str, target: Path, golden: Path, out: Path) -> list[dict]:
    """Rows of the CSV/xlsx that upstream ``version``'s compare writes for two dump.json files."""
    import csv
    import subprocess

    exe, env = _peer(version)
    out.mkdir(parents=True)
    if version.startswith("26."):
        cmd = [str(exe), "compare", "--target_path", str(target), "--golden_path", str(golden),
               "--output_path", str(out)]
    else:
        spec = out / "compare.json"
        spec.write_text(json.dumps({"npu_path": str(target), "bench_path": str(golden), "is_print_compare_log": False}))
        cmd = [str(exe), "-f", "pytorch", "compare", "-i", str(spec), "-o", str(out)]
    proc = subprocess.run(cmd, cwd=out, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = sorted(out.glob("compare_result_*"))
    assert results, proc.stdout[-3000:]
    if results[0].suffix == ".csv":
        return list(csv.DictReader(results[0].open()))
    import openpyxl
    sheet = openpyxl.load_workbook(results[0], read_only=True).active
    rows = [[c for c in r] for r in sheet.iter_rows(values_only=True)]
    return [dict(zip(rows[0], r)) for r in rows[1:]]


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_upstream_compare_accepts_our_dumps(ours, version, tmp_path):
    """Upstream's ``msprobe compare`` reads our dump.json: against itself every row passes.
    Against 26.2.0's dump of the same computation, 26.2.0's compare flags only API backward
    outputs (they mean different gradients, see :mod:`msprobe.compare.producers`); 1.2.2's
    pairs our forward rows with its own (its backward rows find no partner there: its dump
    holds ``Torch.ones_like.0.forward`` first, and it pairs by order)."""
    mine = next((ours[("cnn", "L1", False)] / "step0").rglob("dump.json"))
    up = next(fixture(version, "cnn_L1").rglob("dump.json"))
    for golden, name in ((mine, "self"), (up, "upstream")):
        rows = _upstream_compare(version, mine, golden, tmp_path / name)
        assert len(rows) >= 40
        names = {r["NPU Name"] for r in rows}
        assert "Functional.conv2d.0.forward.output.0" in names
        result = "Result" if "Result" in rows[0] else "Accuracy Reached or Not"
        bad = {r["NPU Name"] for r in rows if str(r[result]).lower() not in ("pass", "", "none", "yes")}
        if name == "self":
            assert bad == set()
        elif version.startswith("26."):
            assert bad and all(".backward.output." in n for n in bad), sorted(bad)
        else:
            paired = {r["NPU Name"] for r in rows if r["Bench Name"] not in (None, "N/A")}
            assert {n for n in names if ".forward." in n} <= paired
