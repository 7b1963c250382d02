"""``msprobe export DUMP_PATH --tensorboard DIR``: the event files, read back with
TensorBoard's own EventAccumulator, hold per module and step the output Norm and gradient
Norm computed from dump.json, and the NaN/Inf counts of dump.json, per rank."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from msprobe.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from test_report_data import dump_jsons, expected_grad_norms, expected_output_norms  # noqa: E402

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def scalars(run: Path) -> dict:
    """{tag: {step: value}} of the event files of one run directory."""
    acc = event_accumulator.EventAccumulator(str(run), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def leaves(entry: dict):
    """Every tensor statistics dict of a dump.json entry (lists, dicts, nested)."""
    stack = [entry]
    while stack:
        item = stack.pop()
        if isinstance(item, dict) and "Max" in item and "type" in item:
            yield item
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def is_nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value) or value in ("NaN", "nan")


def non_finite(value) -> bool:
    return is_nan(value) or value in ("Infinity", "-Infinity", "inf", "-inf") or \
        (isinstance(value, float) and math.isinf(value))


def check_run(run: Path, by_step: dict) -> None:
    got = scalars(run)
    outputs, grads = expected_output_norms(by_step), expected_grad_norms(by_step)
    assert {t for t in got if t.startswith("output_norm/")} == {f"output_norm/{m}" for m, _ in outputs}
    assert {t for t in got if t.startswith("grad_norm/")} == {f"grad_norm/{m}" for m, _ in grads}
    for prefix, expected in (("output_norm/", outputs), ("grad_norm/", grads)):
        for (module, step), value in expected.items():
            point = got[prefix + module][step]     # float32 in the event file
            assert (math.isnan(point) and math.isnan(value)) or point == pytest.approx(value, rel=1e-6)
    for step, data in by_step.items():
        all_leaves = [leaf for entry in data.values() for leaf in leaves(entry)]
        assert got["nan_tensors/all"][step] == sum(1 for leaf in all_leaves if is_nan(leaf["Max"]) or is_nan(leaf["Min"]))
        finite = [abs(v) for leaf in all_leaves for v in (leaf["Max"], leaf["Min"])
                  if isinstance(v, (int, float)) and math.isfinite(v)]
        for name, entry in data.items():
            if name.startswith("Module.") and ".forward." in name:
                bad = sum(1 for leaf in leaves(entry.get("output")) if non_finite(leaf["Max"]) or non_finite(leaf["Min"]))
                assert got[f"nonfinite/{name[: name.rindex('.forward.')]}"][step] == bad
        assert got["max_abs/all"][step] == pytest.approx(max(finite), rel=1e-6)


def test_scalars_equal_dump_json(nan_dump, tmp_path, capsys):
    out = tmp_path / "tb"
    dump_json = nan_dump / "step0" / "rank" / "dump.json"
    before = dump_json.stat().st_mtime_ns
    assert main(["export", str(nan_dump), "--tensorboard", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out / 'rank0'} (")
    check_run(out / "rank0", dump_jsons(nan_dump, "rank"))
    # NaN from step 1 on: fc1's gradient of step 1 and its output of step 2 are NaN
    got = scalars(out / "rank0")
    assert math.isnan(got["grad_norm/Module.fc1.Linear"][1]) and math.isnan(got["output_norm/Module.fc1.Linear"][2])
    assert got["nan_tensors/all"][0] == 0 and got["nan_tensors/all"][1] > 0
    assert dump_json.stat().st_mtime_ns == before   # without -o the dump layout is not rewritten


def test_scalars_per_rank(two_rank_dump, tmp_path):
    out = tmp_path / "tb"
    assert main(["export", str(two_rank_dump), "--tensorboard", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["rank0", "rank1"]
    for rank in (0, 1):
        check_run(out / f"rank{rank}", dump_jsons(two_rank_dump, f"rank{rank}"))


def test_missing_dump_is_an_error(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nowhere"), "--tensorboard", str(tmp_path / "tb")]) == 2
    assert "msprobe export: error:" in capsys.readouterr().err


def test_rank_and_step_select_the_scalars(two_rank_dump, tmp_path):
    out = tmp_path / "tb"
    assert main(["export", str(two_rank_dump), "--tensorboard", str(out), "--rank", "1", "--step", "1"]) == 0
    assert [p.name for p in out.iterdir()] == ["rank1"]
    by_step = dump_jsons(two_rank_dump, "rank1")
    check_run(out / "rank1", {1: by_step[1]})
    assert {step for points in scalars(out / "rank1").values() for step in points} == {1}


def test_malformed_selection_writes_nothing(two_rank_dump, tmp_path, capsys):
    out = tmp_path / "tb"
    assert main(["export", str(two_rank_dump), "--tensorboard", str(out), "--rank", "x"]) == 2
    assert "msprobe export: error: --rank: got 'x'" in capsys.readouterr().err
    assert not out.exists()
