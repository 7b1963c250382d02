"""Every command that reads a log says on stderr what it did not read (a damaged batch, a
torn tail, a deleted payload shard, an unverified format-1 log); the report page and
compare's summary.json say it too; compare's verdict is then "incomplete" (exit 3)."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.nn as nn

from msprobe.cli import main
from msprobe.pytorch import PrecisionDebugger
from store import schema as S

STEPS = 3


def record(path: Path, task: str = "statistics") -> Path:
    """``STEPS`` training steps of a small seeded MLP at level mix."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    x = torch.randn(5, 6)
    config = path.parent / f"{path.name}.json"
    config.write_text(json.dumps({"task": task, "dump_path": str(path), "level": "mix"}))
    debugger = PrecisionDebugger(config_path=str(config))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(STEPS):
        debugger.start(model=net)
        net(x).pow(2).mean().backward()
        debugger.stop()
        debugger.step()
        opt.step()
        opt.zero_grad()
    debugger.close()
    return path


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return record(tmp_path_factory.mktemp("clean") / "dump")


def log_file(dump: Path) -> Path:
    (path,) = (dump / S.STORE_DIR / S.LOG_DIR).glob("*" + S.LOG_SUFFIX)
    return path


def batch_messages(data: bytes) -> list[tuple[int, int, pa.RecordBatch]]:
    """``(start, end, batch)`` of every record batch message of a clean log."""
    out, pos, schema = [], 0, None
    while pos < len(data) and struct.unpack_from("<i", data, pos + 4)[0] != 0:
        source = pa.BufferReader(pa.py_buffer(data[pos:]))
        message = pa.ipc.read_message(source)
        if schema is None:
            schema = pa.ipc.read_schema(message)
        else:
            out.append((pos, pos + source.tell(), pa.ipc.read_record_batch(message, schema)))
        pos += source.tell()
    return out


@pytest.fixture
def damaged(clean, tmp_path):
    """A copy of ``clean`` with one bit flipped in the middle of the biggest batch holding
    step-1 rows; returns (dump, log file, (start, end) of that batch, its steps)."""
    dump = tmp_path / "damaged"
    shutil.copytree(clean, dump)
    log = log_file(dump)
    data = bytearray(log.read_bytes())
    candidates = [(end - start, start, end, batch) for start, end, batch in batch_messages(bytes(data))
                  if 1 in batch.column(S.STEP).to_pylist()]
    _, start, end, batch = max(candidates, key=lambda c: c[0])
    data[(start + end) // 2] ^= 0x08
    log.write_bytes(bytes(data))
    return dump, log, (start, end), batch


def run(argv, capsys):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def skip_line(log: Path, start: int) -> str:
    return f"skipped {log} at byte {start} (to byte "


def test_query_says_what_it_skipped_and_returns_the_intact_rows(damaged, clean, capsys):
    dump, log, (start, end), batch = damaged
    sql = "SELECT count(*) AS n FROM tensors"
    code, out, err = run(["query", dump, sql, "--format", "csv"], capsys)
    assert code == 0
    lost = sum(1 for r, kind in zip(batch.column(S.ROW).to_pylist(), batch.column(S.LEAF_KIND).to_pylist())
               if r == S.ROW_LEAF and kind == S.LEAF_TENSOR)
    _, clean_out, clean_err = run(["query", clean, sql, "--format", "csv"], capsys)
    assert int(out.split()[-1]) == int(clean_out.split()[-1]) - lost  # exactly the damaged batch
    assert skip_line(log, start) in err and "corrupt: checksum mismatch" in err
    assert "the result is partial" in err
    assert clean_err == ""


def test_report_page_and_stderr_list_the_skipped_part(damaged, tmp_path, capsys):
    dump, log, (start, end), _ = damaged
    out_file = tmp_path / "report.html"
    code, out, err = run(["report", dump, "-o", out_file], capsys)
    assert code == 0 and skip_line(log, start) in err
    page = out_file.read_text()
    assert "Not read as data" in page and json.dumps(str(log))[1:-1] in page


def test_export_says_what_it_skipped_on_stderr(damaged, tmp_path, capsys):
    dump, log, (start, end), _ = damaged
    code, out, err = run(["export", dump, "-o", tmp_path / "out"], capsys)
    assert code == 0 and skip_line(log, start) in err and "skipped" not in out


def test_check_ranks_says_what_it_skipped(damaged, capsys):
    dump, log, (start, end), _ = damaged
    code, out, err = run(["check-ranks", dump], capsys)
    assert skip_line(log, start) in err
    assert code == 3 and "exit status 3" in out       # incomplete: no "agree" over a skipped part


def test_compare_with_a_damaged_batch_is_incomplete_exit_3(damaged, clean, tmp_path, capsys):
    dump, log, (start, end), _ = damaged
    out_dir = tmp_path / "cmp"
    code, out, err = run(["compare", dump, clean, "-o", out_dir], capsys)
    assert code == 3
    assert f"TARGET: {skip_line(log, start)}" in err
    assert out.splitlines()[0].startswith("verdict: incomplete")
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["verdict"] == "incomplete" and summary["verdict_of_compared"] in ("identical", "close")
    (skip,) = summary["log_skipped"]
    assert (skip["side"], skip["path"], skip["offset"], skip["end"]) == ("TARGET", str(log), start, end)
    assert any(reason.startswith("TARGET: skipped") for reason in summary["incomplete"])
    page = (out_dir / "report.html").read_text()  # compare's page lists what was not compared
    assert "Not compared (the answer is incomplete)" in page and "TARGET: skipped" in page
    # the same two runs, undamaged: identical, exit 0
    code, out, err = run(["compare", clean, clean], capsys)
    assert code == 0 and out.startswith("verdict: identical") and err == ""


def test_compare_with_a_step_missing_is_incomplete_never_identical(clean, tmp_path, capsys):
    shorter = record(tmp_path / "two", task="statistics")
    # drop the last step from one side: its log cut after the step-1 batches
    log = log_file(shorter)
    data = log.read_bytes()
    keep = max(end for start, end, batch in batch_messages(data) if max(batch.column(S.STEP).to_pylist()) <= 1)
    log.write_bytes(data[:keep])
    out_dir = tmp_path / "cmp"
    code, out, err = run(["compare", clean, shorter, "-o", out_dir], capsys)
    summary = json.loads((out_dir / "summary.json").read_text())
    assert code == 3 and summary["verdict"] == "incomplete"
    assert f"TARGET only (not compared): rank 0 step 2; missing from BASELINE" in summary["incomplete"]


def unrelated(path: Path) -> Path:
    """A small convolutional network, nothing like the MLP of :func:`record`."""
    torch.manual_seed(1)
    net = nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(0.0),
                        nn.Linear(12, 5), nn.Softmax(dim=1))
    x = torch.randn(2, 1, 6, 6)
    config = path.parent / f"{path.name}.json"
    config.write_text(json.dumps({"task": "statistics", "dump_path": str(path), "level": "mix"}))
    debugger = PrecisionDebugger(config_path=str(config))
    for _ in range(STEPS):
        debugger.start(model=net)
        torch.log(net(x)).sum().backward()
        debugger.stop()
        debugger.step()
    debugger.close()
    return path


def test_compare_of_unrelated_models_is_inconclusive_exit_4(clean, tmp_path, capsys):
    other = unrelated(tmp_path / "cnn")
    out_dir = tmp_path / "cmp"
    code, out, err = run(["compare", other, clean, "-o", out_dir], capsys)
    summary = json.loads((out_dir / "summary.json").read_text())
    assert (code, summary["verdict"]) == (4, "inconclusive")
    assert summary["inconclusive_ranks"] == [0]
    for r in summary["ranks"]:
        c = r["counts"]
        assert c["unpaired"] > c["pass"] + c["propagated"] + c["origin"]


def test_deleted_payload_shard_is_reported_by_export_and_compare(tmp_path, capsys):
    dump = record(tmp_path / "tensors", task="tensor")
    (shard,) = sorted((dump / S.STORE_DIR / "payload").glob("*.safetensors"))[-1:]
    base = tmp_path / "base"
    shutil.copytree(dump, base)
    shard.unlink()
    code, out, err = run(["export", dump, "-o", tmp_path / "out"], capsys)
    assert code == 0 and f"skipped {shard} (whole file)" in err and "not exported: payload" in err
    # compare reads a payload, else the tensor file exported from it while recording: with
    # the files there, the deleted shard changes nothing
    code, out, err = run(["compare", dump, base, "--mode", "tensor"], capsys)
    assert code == 0 and out.startswith("verdict: identical")
    for files in dump.glob("step*/rank/dump_tensor_data"):
        shutil.rmtree(files)
    code, out, err = run(["compare", dump, base, "--mode", "tensor", "-o", tmp_path / "cmp"], capsys)
    summary = json.loads((tmp_path / "cmp" / "summary.json").read_text())
    assert code == 3 and summary["verdict"] == "incomplete"
    assert any("without data on one side" in reason for reason in summary["incomplete"])


def test_a_format_1_log_is_read_and_called_unverified(clean, tmp_path, capsys):
    dump = tmp_path / "old"
    shutil.copytree(clean, dump)
    log = log_file(dump)
    batches = [batch for _, _, batch in batch_messages(log.read_bytes())]
    old = S.LOG_SCHEMA.with_metadata({S.FORMAT_KEY: b"1"})
    with pa.ipc.new_stream(str(log), old) as writer:
        for batch in batches:
            writer.write_batch(pa.RecordBatch.from_arrays(batch.columns, schema=old))
    sql = "SELECT count(*) AS n FROM tensors"
    code, out, err = run(["query", dump, sql, "--format", "csv"], capsys)
    _, clean_out, _ = run(["query", clean, sql, "--format", "csv"], capsys)
    assert code == 0 and out == clean_out
    assert err == f"unverified {log}: log format 1 has no checksums; damage in it may go unnoticed\n"


def test_a_log_with_no_readable_batch_answers_empty_and_says_why(clean, tmp_path, capsys):
    dump = tmp_path / "torn"
    shutil.copytree(clean, dump)
    log = log_file(dump)
    first_batch_end = batch_messages(log.read_bytes())[0][1]
    log.write_bytes(log.read_bytes()[: first_batch_end - 100])  # the schema and a torn first batch
    code, out, err = run(["query", dump, "SELECT count(*) AS n FROM calls", "--format", "csv"], capsys)
    assert (code, out) == (0, "n\n0\n")
    assert err.startswith(f"skipped {log} at byte {len(S.LOG_SCHEMA.serialize())}") and "truncated" in err
    code, out, err = run(["report", dump, "-o", tmp_path / "r.html"], capsys)
    assert code == 0 and "truncated" in err


def test_check_ranks_of_a_log_with_no_readable_batch_names_the_dump_not_group(clean, tmp_path, capsys):
    """No --group given and nothing readable: the error is about the dump (and the skipped
    part is still printed), not about a --group the user never passed."""
    dump = tmp_path / "torn"
    shutil.copytree(clean, dump)
    log = log_file(dump)
    first_batch_end = batch_messages(log.read_bytes())[0][1]
    log.write_bytes(log.read_bytes()[: first_batch_end - 100])
    code, out, err = run(["check-ranks", dump], capsys)
    assert code == 2 and "--group" not in err
    assert f"DUMP_PATH {str(dump)!r}: no rank with readable rows to check" in err
    assert f"skipped {log} at byte" in err


WORLD = 3


def three_ranks(dump: Path) -> Path:
    """A run of ``WORLD`` ranks (markers carry ``world_size``), 2 steps of 3 calls each per
    rank; rank ``r``'s call ``i`` has input Norm ``r + i`` (per-rank values to count by)."""
    from store.log_writer import LogWriter
    from store.records import Call, Leaf, Marker

    meta = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
            "world_size": WORLD}
    for rank in range(WORLD):
        with LogWriter(dump, rank) as writer:
            for step in range(2):
                writer.append_marker(Marker(step=step, kind="start", meta={**meta, "rank_dir": f"rank{rank}"}))
                for i in range(3):
                    leaves = tuple(Leaf(io=io, path=(0,), leaf_kind="tensor", type="torch.Tensor",
                                        dtype="torch.float32", shape=(4,), numel=4, max=1.0, min=-1.0, mean=0.0,
                                        norm=float(rank + i)) for io in ("input_args", "output"))
                    writer.append(Call(step=step, kind="api_forward", name=f"Torch.op{i}.0.forward",
                                       api_type="Torch", keys=("input_args", "output"), leaves=leaves))
    return dump


def test_a_rank_without_a_log_is_named_by_every_command(tmp_path, capsys):
    """World size 3, rank 2's log deleted: query, report, export and check-ranks name rank 2
    on stderr (once) and answer for ranks 0 and 1; compare is incomplete (exit 3); a rank
    selection that leaves rank 2 out says nothing about it; the same after compact."""
    clean = three_ranks(tmp_path / "clean")
    dump = tmp_path / "two_logs"
    shutil.copytree(clean, dump)
    (gone,) = (dump / S.STORE_DIR / S.LOG_DIR).glob("rank2.*" + S.LOG_SUFFIX)
    gone.unlink()
    line = "skipped rank 2: no readable log, although the run recorded it"
    sql = "SELECT rank, count(*) AS n, sum(norm) AS norms FROM tensors GROUP BY rank ORDER BY rank"
    # each rank: 2 steps x 3 calls x 2 tensors; the Norms sum to 2 x 2 x (3 rank + 0 + 1 + 2)
    expected = "rank,n,norms\n" + "".join(f"{r},12,{4 * (3 * r + 3)}.0\n" for r in range(WORLD))
    code, out, err = run(["query", clean, sql, "--format", "csv"], capsys)
    assert (code, out, err) == (0, expected, "")
    code, out, err = run(["query", dump, sql, "--format", "csv"], capsys)
    assert code == 0 and out == "".join(expected.splitlines(keepends=True)[:3])
    assert err.count(line) == 1 and "the result is partial" in err
    code, out, err = run(["query", dump, sql, "--format", "csv", "--rank", "0,1"], capsys)
    assert code == 0 and err == ""                               # rank 2 not selected: nothing missing
    code, out, err = run(["query", dump, sql, "--format", "csv", "--rank", "2"], capsys)
    assert "selected rank 2: not in" in err and line not in err  # named once, as not in the dump

    code, out, err = run(["report", dump, "-o", tmp_path / "report.html"], capsys)
    assert code == 0 and err.count(line) == 1
    page = (tmp_path / "report.html").read_text()
    assert "Not read as data" in page and line in page

    code, out, err = run(["export", dump, "-o", tmp_path / "out"], capsys)
    assert code == 0 and err.count(line) == 1
    assert sorted(p.name for p in (tmp_path / "out" / "step0").iterdir()) == ["rank0", "rank1"]

    code, out, err = run(["check-ranks", dump], capsys)
    assert code == 3 and "exit status 3" in out
    assert err.count("skipped rank 2:") == 1 and line in err

    code, out, err = run(["compare", dump, clean, "-o", tmp_path / "cmp"], capsys)
    assert code == 3 and out.startswith("verdict: incomplete")
    summary = json.loads((tmp_path / "cmp" / "summary.json").read_text())
    assert "TARGET: rank 2 has no readable log (the run recorded it)" in summary["incomplete"]

    assert run(["compact", dump], capsys)[0] == 0               # rows and markers now in Parquet parts
    code, out, err = run(["query", dump, sql, "--format", "csv"], capsys)
    assert code == 0 and out == "".join(expected.splitlines(keepends=True)[:3]) and err.count(line) == 1
