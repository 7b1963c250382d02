"""Damage found in a log file stays reported after compaction: once a closed file is wholly
in Parquet parts the readers no longer read it, so the skipped parts the compactor saw are
kept in the manifest and reported by every reader (compare says incomplete, not identical)."""
from __future__ import annotations

import shutil

from msprobe.cli import main
from store import schema as S
from store.compact import compact
from store.log_reader import LogReader
from store.manifest import load_manifest
from store.query import query
from store.select import StoreReader


def _damaged_pair(tmp_path, sample):
    whole = tmp_path / "whole"
    log = sample.write_scenario(whole, flush_rows=5)
    damaged = tmp_path / "damaged"
    shutil.copytree(whole, damaged)
    path = damaged / S.STORE_DIR / S.LOG_DIR / log.name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10               # one flipped bit in a middle batch
    path.write_bytes(bytes(data))
    reader = LogReader(path)
    reader.read_new()
    assert len(reader.skipped) == 1 and reader.skipped[0].end is not None and reader.finished
    return whole, damaged, path, reader.skipped


def test_skips_are_reported_after_the_file_is_compacted(tmp_path, sample, capsys):
    whole, damaged, path, skipped = _damaged_pair(tmp_path, sample)
    compact(damaged)
    assert load_manifest(damaged / S.STORE_DIR / "parquet").logs[path.name].complete
    assert StoreReader(damaged).skipped == skipped
    notices: list[str] = []
    query(damaged, "SELECT count(*) FROM tensors", notices=notices)
    assert notices == [skipped[0].describe()]
    capsys.readouterr()
    assert main(["compare", str(damaged), str(whole)]) == 3
    out, err = capsys.readouterr()
    assert "incomplete" in out + err and "checksum mismatch" in out + err
    # compacting again (nothing new) keeps them
    compact(damaged)
    assert StoreReader(damaged).skipped == skipped


def test_skips_stay_reported_once_the_log_is_archived(tmp_path, sample):
    whole, damaged, path, skipped = _damaged_pair(tmp_path, sample)
    compact(damaged)
    path.unlink()
    assert StoreReader(damaged).skipped == skipped
    assert StoreReader(damaged, ranks=[1]).skipped == []


def test_incremental_compaction_keeps_the_skips_of_every_pass(tmp_path, sample):
    """Two passes over a growing file: the damage seen in the first pass is still reported
    after the second pass completes the file."""
    whole, damaged, path, skipped = _damaged_pair(tmp_path, sample)
    data = path.read_bytes()
    cut = skipped[0].end + 1
    path.write_bytes(data[:cut])               # the file as a live reader saw it mid-run
    from store.parts import Compactor
    compactor = Compactor(damaged)
    compactor.run_once()
    path.write_bytes(data)                     # the writer went on and closed it
    compactor.run_once()
    assert load_manifest(damaged / S.STORE_DIR / "parquet").logs[path.name].complete
    assert StoreReader(damaged).skipped == skipped
