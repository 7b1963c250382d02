"""msprobe.cli: `msprobe export` and `msprobe query`, in-process and as a subprocess."""
from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from msprobe.cli import format_table, main
from store.log_writer import LogWriter
from store.records import Call, Leaf, Marker

ROOT = Path(__file__).resolve().parents[1]
META = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
        "rank_dir": "rank0"}


def tensor(io_key, index, value):
    return Leaf(io=io_key, path=(index,), leaf_kind="tensor", type="torch.Tensor",
                dtype="torch.float32", shape=(3,), numel=3, max=value, min=-value, mean=0.0,
                norm=2 * value, requires_grad=False, has_nan=False, has_inf=False)


@pytest.fixture
def dump(tmp_path):
    path = tmp_path / "dump"
    with LogWriter(path, 0, flush_rows=1) as writer:
        writer.append_marker(Marker(step=0, kind="start", meta=META))
        writer.append(Call(step=0, kind="api_forward", name="Torch.add.0.forward", api_type="Torch",
                           is_recompute=False, keys=("input_args", "input_kwargs", "is_recompute", "output"),
                           leaves=(tensor("input_args", 0, 1.0), tensor("output", 0, 2.5))))
        writer.append(Call(step=1, kind="api_forward", name="Torch.mul.0.forward", api_type="Torch",
                           is_recompute=False, keys=("input_args", "output"),
                           leaves=(tensor("output", 0, 4.0),)))
    return path


def run(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_export_prints_what_it_wrote(dump, capsys):
    code, out, err = run(["export", str(dump)], capsys)
    assert code == 0 and err == ""
    assert out.splitlines() == [
        f"wrote {dump / 'step0' / 'rank0'} (dump.json, stack.json, construct.json)",
        f"wrote {dump / 'step1' / 'rank0'} (dump.json, stack.json, construct.json)",
    ]
    data = json.loads((dump / "step0/rank0/dump.json").read_text())["data"]
    assert list(data) == ["Torch.add.0.forward"]
    assert data["Torch.add.0.forward"]["output"][0]["Max"] == 2.5


def test_export_to_out_dir_and_reports_skips(dump, tmp_path, capsys):
    log = next((dump / ".msprobe" / "log").glob("*.arrows"))
    log.write_bytes(log.read_bytes()[:-20])
    out_dir = tmp_path / "out"
    code, out, err = run(["export", str(dump), "-o", str(out_dir)], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"wrote {out_dir / 'step0' / 'rank0'} (dump.json, stack.json, construct.json)"
    errors = err.splitlines()  # what was skipped goes to stderr
    assert errors[0].startswith(f"skipped {log} at byte ") and "truncated" in errors[0]
    assert errors[-1] == "warning: 1 part(s) of the dump were skipped (above); the result is partial"
    assert (out_dir / "step0/rank0/construct.json").read_text() == "{}"


def test_query_table_csv_json(dump, capsys):
    sql = "SELECT step, name, io, max, shape FROM tensors ORDER BY step, seq, io"
    code, out, _ = run(["query", str(dump), sql], capsys)
    assert code == 0
    assert out.splitlines() == [
        "step | name                | io         | max | shape",
        "-----+---------------------+------------+-----+------",
        "0    | Torch.add.0.forward | input_args | 1.0 | [3]",
        "0    | Torch.add.0.forward | output     | 2.5 | [3]",
        "1    | Torch.mul.0.forward | output     | 4.0 | [3]",
    ]
    code, out, _ = run(["query", str(dump), sql, "--format", "csv"], capsys)
    assert code == 0
    assert list(csv.reader(io.StringIO(out))) == [
        ["step", "name", "io", "max", "shape"],
        ["0", "Torch.add.0.forward", "input_args", "1.0", "[3]"],
        ["0", "Torch.add.0.forward", "output", "2.5", "[3]"],
        ["1", "Torch.mul.0.forward", "output", "4.0", "[3]"],
    ]
    code, out, _ = run(["query", str(dump), sql, "--format", "json"], capsys)
    assert code == 0
    assert json.loads(out) == [
        {"step": 0, "name": "Torch.add.0.forward", "io": "input_args", "max": 1.0, "shape": [3]},
        {"step": 0, "name": "Torch.add.0.forward", "io": "output", "max": 2.5, "shape": [3]},
        {"step": 1, "name": "Torch.mul.0.forward", "io": "output", "max": 4.0, "shape": [3]},
    ]


def test_format_table_nulls_and_specials():
    text = format_table(["a", "b"], [[None, float("nan")], [True, float("-inf")]])
    assert text.splitlines() == [
        "a    | b",
        "-----+----------",
        "NULL | NaN",
        "true | -Infinity",
    ]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["export", "{missing}"], "does not exist"),
        (["query", "{missing}", "SELECT 1"], "does not exist"),
        (["export", "{empty}"], "no msprobe log found"),
        (["query", "{dump}", "SELEC 1"], "query failed"),
        (["query", "{dump}", "SELECT 1", "--format", "xml"], "invalid choice: 'xml'"),
        ([], "required: COMMAND"),
    ],
)
def test_errors_exit_2_with_message_on_stderr(dump, tmp_path, capsys, argv, message):
    (tmp_path / "empty").mkdir()
    paths = {"missing": tmp_path / "missing", "empty": tmp_path / "empty", "dump": dump}
    code, out, err = run([a.format(**paths) for a in argv], capsys)
    assert code == 2
    assert out == ""
    assert message in err


def test_help_exits_0(capsys):
    code, out, _ = run(["--help"], capsys)
    assert code == 0 and "export" in out and "query" in out


def test_python_dash_m_subprocess(dump):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [sys.executable, "-m", "msprobe.cli", "query", str(dump),
         "SELECT count(*) AS n FROM calls", "--format", "csv"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "n\n2\n"
    failed = subprocess.run(
        [sys.executable, "-m", "msprobe.cli", "export", str(dump / "nope")],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )
    assert failed.returncode == 2
    assert "does not exist" in failed.stderr


def test_cli_imports_no_framework():
    code = "import sys, msprobe.cli; print(any(m in sys.modules for m in ('torch', 'mindspore')))"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


# --- stdout closed early (``msprobe ... | head``) ----------------------------------------------------
def _cli(argv, stdout, unbuffered="1"):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = unbuffered
    return subprocess.Popen([sys.executable, "-m", "msprobe.cli", *argv], stdout=stdout,
                            stderr=subprocess.PIPE, env=env, cwd=ROOT)


def test_query_into_a_reader_that_closes_early(dump):
    """``msprobe query ... | head -1``: ~600 kB of output, the reader takes one line and goes."""
    proc = _cli(["query", str(dump), "SELECT range AS i FROM range(100000)", "--format", "csv"],
                subprocess.PIPE)
    assert proc.stdout.readline() == b"i\n"
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert err == ""


@pytest.mark.parametrize("argv", [
    ["query", "{dump}", "SELECT count(*) AS n FROM calls"],
    ["compare", "{dump}", "{dump}"],
    ["compare", "{dump}", "--nan-origin"],
    ["export", "{dump}", "-o", "{out}"],
    ["compact", "{dump}", "-o", "{out}"],
    ["--help"],
    ["compare", "--help"],
], ids=["query", "compare", "nan-origin", "export", "compact", "help", "compare-help"])
@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["unbuffered", "buffered"])
def test_every_subcommand_quiet_on_closed_stdout(dump, tmp_path, argv, unbuffered):
    """stdout is a pipe whose reader is already gone: exit 141 (128 + SIGPIPE), nothing on
    stderr (no 'error: [Errno 32] Broken pipe', no 'Exception ignored' at exit), whether
    stdout is buffered or not (PYTHONUNBUFFERED)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = _cli([a.format(dump=dump, out=tmp_path / "out") for a in argv], write_end, unbuffered)
    finally:
        os.close(write_end)
    err = proc.communicate(timeout=120)[1].decode()
    assert proc.returncode == 141, err
    assert err == ""


# --- query -o FILE, --format parquet; report of an API-only (L1) dump -----------------------------
def test_query_parquet_and_out_file(dump, tmp_path, capsys):
    import pyarrow.parquet as pq

    sql = "SELECT step, name, io, max, shape FROM tensors ORDER BY step, seq, io"
    out = tmp_path / "result.parquet"
    code, text, _ = run(["query", str(dump), sql, "--format", "parquet", "-o", str(out)], capsys)
    assert (code, text) == (0, f"wrote {out} (3 rows)\n")
    table = pq.read_table(out)
    assert table.column_names == ["step", "name", "io", "max", "shape"]
    assert table.to_pylist() == [
        {"step": 0, "name": "Torch.add.0.forward", "io": "input_args", "max": 1.0, "shape": [3]},
        {"step": 0, "name": "Torch.add.0.forward", "io": "output", "max": 2.5, "shape": [3]},
        {"step": 1, "name": "Torch.mul.0.forward", "io": "output", "max": 4.0, "shape": [3]},
    ]
    csv_out = tmp_path / "result.csv"
    code, text, _ = run(["query", str(dump), sql, "--format", "csv", "-o", str(csv_out)], capsys)
    assert (code, text) == (0, f"wrote {csv_out} (3 rows)\n")
    assert csv_out.read_text().splitlines()[1] == "0,Torch.add.0.forward,input_args,1.0,[3]"
    code, text, err = run(["query", str(dump), sql, "--format", "parquet"], capsys)
    assert (code, text) == (2, "")
    assert err == "msprobe query: error: --format parquet writes a file: give -o FILE\n"


def test_report_of_api_only_dump_uses_api_rows(dump, tmp_path, capsys):
    from msprobe.report.data import collect

    data = collect(dump)
    assert data["rows_are"] == "APIs"
    heat = data["per_rank"]["0"]["output"]
    # output Norm of Torch.add.0 in step 0 is 5.0 (one output tensor, norm 2 * 2.5)
    assert (heat["rows"], heat["columns"], heat["values"]) == (
        ["Torch.add.0", "Torch.mul.0"], ["0", "1"], [[5.0, None], [None, 8.0]])
    assert data["per_rank"]["0"]["grad"]["rows"] == [] and data["per_rank"]["0"]["movers"] == []
    code, text, _ = run(["report", str(dump), "-o", str(tmp_path / "r.html")], capsys)
    assert (code, text) == (0, f"wrote {tmp_path / 'r.html'}\n")


def test_report_imports_no_framework():
    code = "import sys, msprobe.report; print(any(m in sys.modules for m in ('torch', 'mindspore')))"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_version_is_the_installed_distribution(capsys):
    from importlib.metadata import version

    code, out, _ = run(["--version"], capsys)
    assert code == 0
    assert out == f"msprobe {version('msprobe-recorder')}\n"


@pytest.mark.parametrize("framework, package, extra", [("torch", "msprobe.pytorch", "msprobe-recorder[torch]"),
                                                       ("mindspore", "msprobe.mindspore", "msprobe-recorder[mindspore]")])
def test_framework_package_without_its_framework_names_the_extra(framework, package, extra):
    """Importing msprobe.pytorch (msprobe.mindspore) where torch (mindspore) cannot be
    imported (``sys.modules[name] = None`` blocks it) raises ModuleNotFoundError naming
    the extra to install, with ``name`` the missing package."""
    code = (f"import sys; sys.modules[{framework!r}] = None\n"
            f"try:\n    import {package}\n"
            f"except ModuleNotFoundError as exc:\n    print(exc.name); print(exc)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    name, message = done.stdout.splitlines()
    assert name == framework
    assert f"{package} needs" in message and f"pip install '{extra}'" in message
