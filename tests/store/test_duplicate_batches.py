"""A log block written twice (a batch message copied, e.g. by a file system replaying a
write or a careless concatenation): the copy is skipped as damage, the rows are read once,
and compare of such a run against the whole one says incomplete, never crashes."""
from __future__ import annotations

import shutil

import pytest

from msprobe.cli import main
from store import schema as S
from store.compact import compact
from store.log_reader import LogReader
from store.query import query

SQL = "SELECT rank, step, seq, io, arg, norm, crc32 FROM tensors ORDER BY rank, seq, io, arg"


def _rows(dump, sql=SQL) -> list:
    return [{k: repr(v) for k, v in row.items()} for row in query(dump, sql).to_pylist()]


def _boundaries(path) -> list:
    """The byte offsets where each record batch message of ``path`` starts and ends."""
    reader = LogReader(path)
    offsets = [reader.offset]
    for _ in reader.iter_new():
        offsets.append(reader.offset)
    return offsets


def _batch_rows(data: bytes, a: int, b: int) -> int:
    """Rows of the record batch message ``data[a:b]`` (decoded with pyarrow alone)."""
    import pyarrow as pa

    return pa.ipc.read_record_batch(pa.ipc.read_message(pa.py_buffer(data[a:b])), S.LOG_SCHEMA).num_rows


@pytest.fixture
def runs(tmp_path, sample):
    whole = tmp_path / "whole"
    log = sample.write_scenario(whole, flush_rows=5)
    damaged = tmp_path / "damaged"
    shutil.copytree(whole, damaged)
    return whole, damaged, damaged / S.STORE_DIR / S.LOG_DIR / log.name


@pytest.mark.parametrize("where", ["right after", "at the end"])
def test_copied_batch_is_read_once_and_reported(runs, where):
    whole, damaged, path = runs
    data = path.read_bytes()
    bounds = _boundaries(path)
    assert len(bounds) > 4
    a, b = bounds[2], bounds[3]
    copy = data[a:b]
    at = b if where == "right after" else len(data) - 8     # before the end-of-stream marker
    damaged_bytes = data[:at] + copy + data[at:]
    path.write_bytes(damaged_bytes)
    reader = LogReader(path)
    reader.read_new()
    rows = _batch_rows(data, a, b)
    assert [(s.offset, s.end, s.rows) for s in reader.skipped] == [(at, at + len(copy), rows)]
    assert reader.skipped[0].reason == f"corrupt: a second copy of the batch at byte {a}"
    assert reader.finished
    assert _rows(damaged) == _rows(whole)


def test_compare_with_a_copied_batch_is_incomplete_not_a_crash(runs, capsys):
    whole, damaged, path = runs
    data = path.read_bytes()
    bounds = _boundaries(path)
    a, b = bounds[len(bounds) // 2], bounds[len(bounds) // 2 + 1]
    path.write_bytes(data[:b] + data[a:b] + data[b:])
    assert main(["compare", str(damaged), str(whole)]) == 3
    out, err = capsys.readouterr()
    assert "a second copy of the batch" in out + err


def test_bytes_spliced_back_in_do_not_duplicate_rows(runs):
    """A torn write followed by the same bytes again from an odd offset: the part between
    is damage, the batches found again after it are copies; no row is read twice."""
    whole, damaged, path = runs
    data = path.read_bytes()
    n = len(data)
    path.write_bytes(data[:n // 2] + data[n // 4:n // 2] + data[n // 2:])
    assert _rows(damaged) == _rows(whole)
    compact(damaged)
    assert _rows(damaged) == _rows(whole)
