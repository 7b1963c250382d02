"""Crash recovery: a training process killed with SIGKILL at several
points, including in the middle of a log write; ``msprobe export`` afterwards rebuilds every
entry that reached the log, and everything up to the last flush point is there.

The training script is ``tests/crash_child.py``; it announces each kill point on stdout and
waits to be killed. The offline export goes to a separate directory and is compared with
the files the live process wrote before it died (at stop()/step(), the flush points).
"""
from __future__ import annotations

import json
import os
import signal
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from msprobe.cli import main as cli_main
from store.log_reader import read_log

REPO = Path(__file__).resolve().parent.parent
CHILD = REPO / "tests" / "crash_child.py"
STALL_CHILD = REPO / "tests" / "stall_child.py"
FILES = ("dump.json", "stack.json", "construct.json")


RUNS = {  # name: (kill point, flush_rows)
    "after_step1": ("after_step1", 1),
    "after_stop2": ("after_stop2", 100000),
    "mid_forward2_flushed": ("mid_forward2", 1),
    "mid_forward2_buffered": ("mid_forward2", 100000),
    "during_write2": ("during_write2", 1),
}


def kill_at_ready(procs: dict) -> dict[str, list[str]]:
    """Wait for each child's ``READY`` line, SIGKILL it; return the names it had emitted
    in its current step."""
    emitted = {}
    for name, proc in procs.items():
        line = proc.stdout.readline()
        if not line.startswith("READY "):
            proc.kill()
            raise AssertionError((name, line, proc.stderr.read()))
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
        emitted[name] = json.loads(line[len("READY "):])
    return emitted


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """Run every scenario of RUNS at once (in parallel: starting torch is the slow part);
    returns ``{name: (dump_path, emitted names)}``. Tests copy a dump before changing it."""
    root = tmp_path_factory.mktemp("crash")
    procs = {}
    try:
        for name, (point, flush_rows) in RUNS.items():
            procs[name] = subprocess.Popen(
                [sys.executable, str(CHILD), str(root / name), point, str(flush_rows)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        emitted = kill_at_ready(procs)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()
    return {name: (root / name, emitted[name]) for name in RUNS}


def copy_of(killed, name: str, tmp_path: Path) -> tuple[Path, list[str]]:
    dump, emitted = killed[name]
    target = tmp_path / "dump"
    shutil.copytree(dump, target, symlinks=True)
    return target, emitted


def export(dump: Path, out: Path, capsys) -> str:
    assert cli_main(["export", str(dump), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    return captured.out + captured.err  # what was written, then what was skipped


def files_of(root: Path, step: int) -> dict[str, bytes]:
    return {name: (root / f"step{step}" / "rank" / name).read_bytes() for name in FILES}


def data_of(root: Path, step: int) -> dict:
    return json.loads((root / f"step{step}" / "rank" / "dump.json").read_text())["data"]


def test_killed_after_step_end(killed, tmp_path, capsys):
    out = tmp_path / "out"
    dump, _ = copy_of(killed, "after_step1", tmp_path)
    report = export(dump, out, capsys)
    assert "skipped" not in report
    for step in (0, 1):  # finished steps: offline files are byte-identical to the live ones
        assert files_of(out, step) == files_of(dump, step)
    assert not (out / "step2").exists()
    data = data_of(out, 1)
    assert {"Module.0.Linear.forward.0", "Module.0.Linear.backward.0", "Module.2.Linear.parameters_grad",
            "Functional.linear.0.forward", "Functional.linear.0.backward"} <= set(data)


def test_killed_after_stop(killed, tmp_path, capsys):
    out = tmp_path / "out"
    dump, _ = copy_of(killed, "after_stop2", tmp_path)
    export(dump, out, capsys)
    # stop() is a flush point: step 2 as written live at stop() is rebuilt exactly
    for step in (0, 1, 2):
        assert files_of(out, step) == files_of(dump, step)
    assert "Module.2.Linear.forward.0" in data_of(out, 2)


def test_killed_mid_step_with_every_row_flushed(killed, tmp_path, capsys):
    out = tmp_path / "out"
    dump, emitted = copy_of(killed, "mid_forward2_flushed", tmp_path)
    assert emitted == ["Functional.linear.0.forward", "Module.0.Linear.forward.0"]
    export(dump, out, capsys)
    # every entry emitted before the kill reached the log (flush_rows=1) and is rebuilt
    assert list(data_of(out, 2)) == emitted
    for step in (0, 1):
        assert files_of(out, step) == files_of(dump, step)
    live = json.loads((dump / "step2" / "rank" / "dump.json").read_text())
    assert live["data"] == {}  # the live files of step 2 were only the start() skeleton


def test_killed_mid_step_loses_at_most_the_rows_since_the_last_flush(killed, tmp_path, capsys):
    out = tmp_path / "out"
    dump, emitted = copy_of(killed, "mid_forward2_buffered", tmp_path)
    assert len(emitted) == 2
    export(dump, out, capsys)
    # the last flush point was start() of step 2: its skeleton is rebuilt, the two entries
    # emitted after it were still in memory and are lost
    assert data_of(out, 2) == {}
    for step in (0, 1):
        assert files_of(out, step) == files_of(dump, step)


def test_killed_during_a_write(killed, tmp_path, capsys):
    out = tmp_path / "out"
    dump, emitted = copy_of(killed, "during_write2", tmp_path)
    contents = read_log(dump)
    assert len(contents.skipped) == 1 and contents.skipped[0].reason.startswith(("truncated", "corrupt"))
    report = export(dump, out, capsys)
    assert f"skipped {contents.skipped[0].path} at byte {contents.skipped[0].offset}" in report
    for step in (0, 1):
        assert files_of(out, step) == files_of(dump, step)
    # the torn batch held the first entry of step 2 (flush_rows=1)
    assert data_of(out, 2) == {}
    assert emitted[:1] == ["Functional.linear.0.forward"]
    # the reader stops exactly at the torn batch: the rows before it are all there
    log = contents.files[0]
    assert contents.skipped[0].offset < log.stat().st_size


def test_half_written_export_is_rebuilt(killed, tmp_path, capsys):
    """A process killed while exporting leaves a truncated dump.json (or a stale temporary
    file): ``msprobe export`` rewrites complete files from the log."""
    dump, _ = copy_of(killed, "after_step1", tmp_path)
    live = files_of(dump, 1)
    target = dump / "step1" / "rank" / "dump.json"
    target.write_bytes(live["dump.json"][: len(live["dump.json"]) // 3])
    (dump / "step1" / "rank" / ".dump.json.abc123.tmp").write_bytes(b'{"task": "stat')
    with pytest.raises(json.JSONDecodeError):
        json.loads(target.read_text())
    export(dump, dump, capsys)
    assert files_of(dump, 1) == live
    assert files_of(dump, 0) == files_of(killed["after_step1"][0], 0)


def test_corrupted_log_middle_loses_exactly_the_damaged_batch(killed, tmp_path, capsys):
    out = tmp_path / "out"
    dump, _ = copy_of(killed, "after_step1", tmp_path)
    log = read_log(dump).files[0]
    original = log.read_bytes()
    raw = bytearray(original)
    full = read_log(dump).table
    # overwrite 16 bytes two thirds into the file with garbage
    at = len(raw) * 2 // 3
    raw[at:at + 16] = b"\xde\xad\xbe\xef" * 4
    log.write_bytes(bytes(raw))
    damaged = read_log(dump)
    assert len(damaged.skipped) == 1
    skip = damaged.skipped[0]
    assert skip.offset <= at < skip.end and skip.reason.startswith("corrupt")
    # the rows of the original log's batches, as any Arrow reader gives them
    bounds = np.cumsum([0] + [batch.num_rows for batch in pa.ipc.open_stream(original)])
    kept = damaged.table
    lost = full.num_rows - kept.num_rows
    assert lost == skip.rows > 0
    first = next(i for i in range(kept.num_rows + 1)
                 if i == kept.num_rows or kept.slice(i, 1).to_pylist() != full.slice(i, 1).to_pylist())
    # everything but one contiguous run of rows (the damaged batch) comes back unchanged
    assert kept.to_pylist() == full.slice(0, first).to_pylist() + full.slice(first + lost).to_pylist()
    assert first in bounds and first + lost in bounds and list(bounds).index(first + lost) == list(bounds).index(first) + 1
    report = export(dump, out, capsys)
    assert f"skipped {skip.path} at byte {skip.offset}" in report
    assert files_of(out, 0) == files_of(dump, 0)  # step 0 lies before the damage


def np_stats(values: list) -> dict:
    """float64 statistics of a float32 tensor given as nested lists."""
    a = np.asarray(values, dtype=np.float32).astype(np.float64)
    return {"Max": float(a.max()), "Min": float(a.min()), "Mean": float(a.mean()),
            "Norm": float(np.sqrt((a * a).sum())), "shape": list(a.shape)}


def assert_stats(record: dict, values: list) -> None:
    expected = np_stats(values)
    assert record["shape"] == expected["shape"]
    assert (record["Max"], record["Min"]) == (expected["Max"], expected["Min"])
    for key in ("Mean", "Norm"):
        assert record[key] == pytest.approx(expected[key], rel=1e-6, abs=1e-12), key


def test_killed_after_a_stall_keeps_the_rows_older_than_the_flush_interval(tmp_path, capsys):
    """A process records, then stalls without another append (a collective that never
    returns) and is killed by a watchdog with SIGKILL after more than the flush interval
    (0.5 s by default): the flush timer wrote every entry recorded before the stall
    (fewer than ``flush_rows``, no stop()/step() since start()), with its real values."""
    dump, out = tmp_path / "dump", tmp_path / "out"
    proc = subprocess.Popen([sys.executable, str(STALL_CHILD), str(dump)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        line = proc.stdout.readline()
        if not line.startswith("READY "):
            proc.kill()
            raise AssertionError((line, proc.stderr.read()))
        time.sleep(2.5)  # five flush intervals
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    values = json.loads(line[len("READY "):])
    assert data_of(dump, 0) == {}  # the live files were only the start() skeleton
    assert "skipped" not in export(dump, out, capsys)
    data = data_of(out, 0)
    # every entry of the forward (inner API call first, then its module)
    assert list(data) == ["Functional.linear.0.forward", "Module.0.Linear.forward.0",
                          "Functional.relu.0.forward", "Module.1.ReLU.forward.0"]
    linear = data["Functional.linear.0.forward"]
    for record, key in zip(linear["input_args"], ("x", "weight", "bias")):
        assert_stats(record, values[key])
    assert_stats(linear["output"][0], values["y"])
    assert_stats(data["Module.0.Linear.forward.0"]["input_args"][0], values["x"])
    assert_stats(data["Module.0.Linear.forward.0"]["output"][0], values["y"])
    for name in ("Functional.relu.0.forward", "Module.1.ReLU.forward.0"):
        assert_stats(data[name]["input_args"][0], values["y"])
        assert_stats(data[name]["output"][0], values["z"])
