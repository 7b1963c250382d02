"""StepExporter leaves alone the files it wrote whose content would not change,
and writes again a file deleted or replaced behind its back."""
from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from store import schema as S
from store.export import CONSTRUCT_FILE, DUMP_FILE, STACK_FILE, StepExporter, export_step

FILES = (DUMP_FILE, STACK_FILE, CONSTRUCT_FILE)


def _rows(tmp_path, sample):
    return sample.step0_rows(tmp_path / "dump")


def _inodes(directory: Path) -> dict[str, tuple[int, int]]:
    return {name: (os.stat(directory / name).st_ino, os.stat(directory / name).st_mtime_ns) for name in FILES}


def _reference(tmp_path, rows, stacks, meta, name="whole") -> dict[str, bytes]:
    export_step(rows, stacks, meta, tmp_path / name)
    return {f: (tmp_path / name / f).read_bytes() for f in FILES}


def test_unchanged_files_are_not_rewritten(tmp_path, sample):
    rows, stacks, meta = _rows(tmp_path, sample)
    out = tmp_path / "live"
    live = StepExporter()
    live.add(rows)
    live.write(stacks, meta, out)
    before = _inodes(out)
    live.write(stacks, meta, out)  # nothing new: every file is left as it is
    live.add(rows.slice(0, 0))
    live.write(stacks, meta, out)
    assert _inodes(out) == before
    expected = _reference(tmp_path, rows, stacks, meta)
    assert {f: (out / f).read_bytes() for f in FILES} == expected


def test_only_changed_files_are_rewritten(tmp_path, sample):
    rows, stacks, meta = _rows(tmp_path, sample)
    out = tmp_path / "live"
    live = StepExporter()
    marker = rows.filter(pc.equal(rows[S.ROW], S.ROW_MARKER))
    assert marker.num_rows  # markers change no file
    live.add(rows)
    live.write(stacks, meta, out)
    before = _inodes(out)
    one = marker.slice(0, 1)
    later = pa.array([pc.max(rows[S.SEQ]).as_py() + 1], pa.int64())  # a marker appended later
    live.add(one.set_column(one.schema.get_field_index(S.SEQ), one.schema.field(S.SEQ), later))
    live.write(stacks, meta, out)
    assert _inodes(out) == before
    # a new dump_data_dir changes dump.json only
    moved = dict(meta, dump_data_dir="/elsewhere")
    live.write(stacks, moved, out)
    after = _inodes(out)
    assert after[DUMP_FILE] != before[DUMP_FILE]
    assert after[STACK_FILE] == before[STACK_FILE] and after[CONSTRUCT_FILE] == before[CONSTRUCT_FILE]
    assert {f: (out / f).read_bytes() for f in FILES} == _reference(tmp_path, rows, stacks, moved, "moved")


def test_deleted_or_replaced_files_are_written_again(tmp_path, sample):
    rows, stacks, meta = _rows(tmp_path, sample)
    expected = _reference(tmp_path, rows, stacks, meta)
    out = tmp_path / "live"
    live = StepExporter()
    live.add(rows)
    live.write(stacks, meta, out)
    (out / DUMP_FILE).unlink()
    (out / STACK_FILE).write_bytes(b"{}")  # replaced by someone else: same path, new content
    construct = out / CONSTRUCT_FILE
    os.utime(construct, ns=(0, 0))  # touched: the mtime no longer matches what was written
    live.write(stacks, meta, out)
    assert {f: (out / f).read_bytes() for f in FILES} == expected
    assert os.stat(construct).st_mtime_ns != 0


def test_new_rows_rewrite_the_files_they_change(tmp_path, sample):
    rows, stacks, meta = _rows(tmp_path, sample)
    half = rows.num_rows // 2
    out = tmp_path / "live"
    live = StepExporter()
    live.add(rows.slice(0, half))
    live.write(stacks, meta, out)
    live.add(rows.slice(half))
    live.write(stacks, meta, out)
    assert {f: (out / f).read_bytes() for f in FILES} == _reference(tmp_path, rows, stacks, meta)


def test_another_directory_is_written_in_full(tmp_path, sample):
    rows, stacks, meta = _rows(tmp_path, sample)
    live = StepExporter()
    live.add(rows)
    live.write(stacks, meta, tmp_path / "a")
    live.write(stacks, meta, tmp_path / "b")  # same content, other place (a rank_dir change)
    expected = _reference(tmp_path, rows, stacks, meta)
    for name in ("a", "b"):
        assert {f: (tmp_path / name / f).read_bytes() for f in FILES} == expected


def test_next_step_reuses_member_texts_and_writes_the_same_bytes(tmp_path, sample):
    rows, stacks, meta = _rows(tmp_path, sample)
    first = StepExporter()
    first.add(rows)
    first.write(stacks, meta, tmp_path / "s0")
    carried = first._member_texts()
    assert carried and all(isinstance(key, tuple) for key in carried)  # members, no entry texts
    # the next step's exporter starts from them; its rows (here: the first half) decide the bytes
    half = rows.num_rows // 2
    second = StepExporter(first)
    second.add(rows.slice(0, half))
    second.write(stacks, meta, tmp_path / "s1")
    part = rows.slice(0, half)
    assert {f: (tmp_path / "s1" / f).read_bytes() for f in FILES} == _reference(tmp_path, part, stacks, meta, "half")
    third = StepExporter(second)
    third.add(rows)
    third.write(stacks, meta, tmp_path / "s2")
    assert {f: (tmp_path / "s2" / f).read_bytes() for f in FILES} == _reference(tmp_path, rows, stacks, meta)
