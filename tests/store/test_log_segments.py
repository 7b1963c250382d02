"""Log segments (store/log_writer.py, Segments): a writer ends its log file at a step's end
once the file reached ``segment_bytes`` and goes on in a new one. Every segment is a whole
log file (end-of-stream marker, its own stack rows, no step split across files); the rows
read back equal those of one unsegmented file; a segment wholly compacted into Parquet parts
can be moved away and every reader still answers over every step."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from store import schema as S
from store.compact import compact
from store.export import export_log
from store.log_names import SEGMENT_ENV, segment_bytes
from store.log_reader import LogReader, find_log_files, read_log
from store.log_writer import LogWriter
from store.manifest import load_manifest, parquet_dir
from store.query import query
from store.records import Call, Marker, Stack, make_leaf
from store.export import StepFiles

REPO = Path(__file__).resolve().parents[2]
META = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "rank_dir": "rank0",
        "extra_info": None}
STEPS = 6
CALLS = 40


def _leaf(io: str, value: float):
    return make_leaf((io, (0,), "tensor", "torch.Tensor", "torch.float32", (4,), 4, value, -value, value / 3,
                      value * 2.0, None, None, None, False, False, False, None, None, None))


def _record(writer: LogWriter, files: StepFiles, steps=range(STEPS), close: bool = True) -> None:
    """``steps`` steps of CALLS calls each (two call sites, stacks 1 and 2), each step
    exported and ended as a session does."""
    writer.append_stack(Stack(stack_id=1, frames=("File a.py, line 1, in f, \n x = y",)))
    writer.append_stack(Stack(stack_id=2, frames=("File b.py, line 9, in g, \n z = w",)))
    for step in steps:
        writer.append_marker(Marker(step=step, kind=S.MARKER_START, meta=META))
        for i in range(CALLS):
            writer.append(Call(step=step, kind="api_forward", name=f"Torch.add.{i}.forward", api_type="Torch",
                               stack_id=1 + i % 2, keys=("input_args", "output"),
                               leaves=(_leaf("input_args", step + i / 7), _leaf("output", step * 2 + i / 5))))
        writer.append_marker(Marker(step=step, kind=S.MARKER_STEP_END, meta=META))
        files.export(step, META, True)
        files.end_step(step)
    if close:
        writer.close()


def _write(dump: Path, segment: int) -> LogWriter:
    writer = LogWriter(dump, 0, flush_rows=32, flush_interval_s=0, segment_bytes=segment)
    _record(writer, StepFiles(writer, dump))
    return writer


def _rows(table: pa.Table, row: str) -> list[dict]:
    keep = np.asarray(table.column(S.ROW).to_pylist()) == row
    return table.filter(pa.array(keep)).to_pylist()


@pytest.fixture
def two_logs(tmp_path):
    """(one-file dump, segmented dump, the segmented writer)."""
    whole, split = tmp_path / "whole", tmp_path / "split"
    _write(whole, 0)
    writer = _write(split, 16 * 1024)
    return whole, split, writer


def test_segments_are_whole_log_files_holding_whole_steps(two_logs):
    _, split, writer = two_logs
    files = find_log_files(split)
    assert len(files) >= 3 and [p.name for p in files] == [p.name for p in writer.paths]
    steps_seen: list[set] = []
    for path in files:
        reader = LogReader(path)
        table = pa.Table.from_batches(reader.read_new(), schema=S.LOG_SCHEMA)
        assert not reader.unfinished and not reader.skipped      # an end-of-stream marker, nothing damaged
        calls = _rows(table, S.ROW_CALL)
        # each segment holds the stack rows its own calls name
        assert {c[S.STACK_ID] for c in calls} <= {s[S.STACK_ID] for s in _rows(table, S.ROW_STACK)}
        seqs = [c[S.SEQ] for c in calls]
        assert seqs[0] == 1 and seqs == sorted(seqs)              # seq counts from 0 per file (0: the start marker)
        steps_seen.append({c[S.STEP] for c in calls})
    every = [s for steps in steps_seen for s in steps]
    assert sorted(every) == list(range(STEPS))                     # no step in two files


def test_segmented_log_reads_as_the_unsegmented_one(two_logs):
    whole, split, _ = two_logs
    a, b = read_log(whole).table, read_log(split).table
    for row in (S.ROW_CALL, S.ROW_LEAF, S.ROW_MARKER):
        assert _rows(a, row) == _rows(b, row)                     # seq included: shifted across files
    assert read_log(whole).stacks == read_log(split).stacks
    sql = "SELECT step, name, seq, max FROM tensors WHERE io = 'output' ORDER BY step, seq"
    assert query(whole, sql).to_pylist() == query(split, sql).to_pylist()


def test_live_step_files_equal_the_export_of_the_segments(two_logs, tmp_path):
    _, split, _ = two_logs
    export_log(split, tmp_path / "offline")
    live = {p.relative_to(split).parts: p.read_bytes() for p in split.rglob("*.json") if ".msprobe" not in p.parts}
    offline = {p.relative_to(tmp_path / "offline").parts: p.read_bytes() for p in (tmp_path / "offline").rglob("*.json")}
    assert live == offline and len([k for k in live if k[-1] == "dump.json"]) == STEPS
    dump = json.loads((split / f"step{STEPS - 1}" / "rank0" / "dump.json").read_text())
    assert dump["data"]["Torch.add.5.forward"]["output"][0]["Max"] == pytest.approx((STEPS - 1) * 2 + 5 / 5)


def test_compacted_segments_can_be_archived(two_logs):
    whole, split, writer = two_logs
    report = compact(split)
    manifest = load_manifest(parquet_dir(split))
    archived = writer.paths[:-1]
    assert all(manifest.logs[p.name].complete for p in archived)
    # the writer closed every segment, the last one too: each is wholly in parts
    assert report.archivable == tuple(sorted(p.name for p in writer.paths))
    for path in archived:                                          # moved away, as an archive would
        shutil.move(str(path), str(path.with_suffix(".archived")))
    notices: list = []
    sql = "SELECT step, seq, name, io, arg, max, norm FROM tensors ORDER BY step, seq, io, arg"
    assert query(split, sql, notices=notices).to_pylist() == query(whole, sql).to_pylist()
    assert notices == []


def test_segments_archived_while_the_run_goes_on_keep_seq(two_logs, tmp_path):
    whole, _, _ = two_logs
    dump = tmp_path / "live"
    writer = LogWriter(dump, 0, flush_rows=32, flush_interval_s=0, segment_bytes=16 * 1024)
    files = StepFiles(writer, dump)
    _record(writer, files, range(3), close=False)
    report = compact(dump)
    assert report.archivable                     # closed segments wholly in parts
    for name in report.archivable:
        path = dump / ".msprobe" / "log" / name
        shutil.move(str(path), str(path.with_suffix(".archived")))
    _record(writer, files, range(3, STEPS))
    sql = "SELECT step, seq, name, kind FROM calls ORDER BY step, seq"
    expected = query(whole, sql).to_pylist()
    assert query(dump, sql).to_pylist() == expected          # parts of the archived, log of the rest
    compact(dump)
    assert query(dump, sql).to_pylist() == expected          # and once everything is in parts
    seqs = [row["seq"] for row in expected]
    assert len(set(seqs)) == len(seqs)


def test_compact_names_the_files_that_may_be_archived(two_logs, capsys):
    from msprobe.cli import main

    _, split, writer = two_logs
    assert main(["compact", str(split)]) == 0
    line = [l for l in capsys.readouterr().out.splitlines() if l.startswith("log files wholly in parts")]
    assert line == ["log files wholly in parts (may be archived): " + ", ".join(sorted(p.name for p in writer.paths))]


def test_parts_written_elsewhere_leave_every_log_file_needed(two_logs, tmp_path):
    _, split, _ = two_logs
    report = compact(split, tmp_path / "elsewhere")
    assert report.written and report.archivable == ()      # readers do not look in -o OUT


def test_no_segments_when_size_is_zero_or_steps_are_small(tmp_path):
    writer = _write(tmp_path / "a", 0)
    assert len(writer.paths) == 1
    writer = _write(tmp_path / "b", 1 << 30)
    assert len(writer.paths) == 1


def test_a_segment_is_not_ended_while_rows_of_a_step_are_retained(tmp_path):
    writer = LogWriter(tmp_path, 0, flush_rows=1, flush_interval_s=0, segment_bytes=1)
    writer.append(Call(step=0, kind="api_forward", name="Torch.add.0.forward", api_type="Torch", keys=("output",),
                       leaves=(_leaf("output", 1.0),)))
    writer.flush()
    assert writer.end_segment_if_due() is False                   # step 0's rows not taken yet
    writer.take_step(0)
    assert writer.end_segment_if_due() is True
    writer.close()
    assert len(writer.paths) == 1                                  # nothing after: no empty segment is opened


def test_segment_size_from_the_environment():
    assert segment_bytes({}) == 256 << 20
    assert segment_bytes({SEGMENT_ENV: "0"}) == 0
    assert segment_bytes({SEGMENT_ENV: " 2 "}) == 2 << 20
    assert segment_bytes({SEGMENT_ENV: "1e-9"}) == 1          # above 0 stays above 0
    for bad in ("-1", "ten", "inf", "nan"):
        with pytest.raises(ValueError, match=SEGMENT_ENV):
            segment_bytes({SEGMENT_ENV: bad})
    with pytest.raises(ValueError, match="segment_bytes"):
        LogWriter("/nonexistent", 0, segment_bytes=-5)


def test_a_bad_segment_size_is_a_config_error_before_training(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from msprobe.core.errors import ConfigError
    from msprobe.pytorch import PrecisionDebugger

    monkeypatch.setenv(SEGMENT_ENV, "-3")
    with pytest.raises(ConfigError, match=SEGMENT_ENV) as info:
        PrecisionDebugger(dump_path=str(tmp_path / "d"), task="statistics", level="L1")
    assert info.value.field == SEGMENT_ENV and info.value.value == "-3"
    assert not (tmp_path / "d" / ".msprobe").exists()


_TRAIN = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {repo!r})
    from msprobe.pytorch import PrecisionDebugger
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    debugger = PrecisionDebugger(dump_path={dump!r}, task="statistics", level="L1")
    x = torch.randn(8, 16)
    for _ in range(5):
        debugger.start()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        debugger.stop()
        debugger.step()
    debugger.close()
""")


@pytest.mark.parametrize("writer", ["process", "inprocess"])
def test_training_run_writes_segments_read_as_one_log(tmp_path, writer):
    dump = tmp_path / "dump"
    env = dict(os.environ, **{SEGMENT_ENV: "0.01", "MSPROBE_WRITER": writer})   # ~10 KiB
    subprocess.run([sys.executable, "-c", _TRAIN.format(repo=str(REPO), dump=str(dump))], env=env, check=True,
                   timeout=300)
    files = find_log_files(dump)
    assert len(files) >= 2
    for path in files:
        reader = LogReader(path)
        assert reader.read_new() and not reader.unfinished and not reader.skipped
    steps = query(dump, "SELECT DISTINCT step FROM calls ORDER BY step").column("step").to_pylist()
    assert steps == list(range(5))
    export_log(dump, tmp_path / "offline")
    for step in range(5):
        live = (dump / f"step{step}" / "rank" / "dump.json").read_bytes()
        assert live == (tmp_path / "offline" / f"step{step}" / "rank" / "dump.json").read_bytes()
