"""examples/char_lm.py end to end: it runs, writes the documented layout, prints the right
query result, and recording leaves the losses bit-identical. Plus every example query of
docs/query.md, run on the same recording."""
from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "char_lm.py"
STEPS = 2

_LOSS_LINE = re.compile(r"^step (\d+): loss (\S+)$")


def _load_example():
    spec = importlib.util.spec_from_file_location("char_lm_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Run the example once in a subprocess; returns (dump_path, stdout)."""
    work = tmp_path_factory.mktemp("char_lm")
    dump_path = work / "dump"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", str(STEPS), "--dump-path", str(dump_path)],
        cwd=work, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dump_path, proc.stdout


def _dump(dump_path: Path, step: int) -> dict:
    return json.loads((dump_path / f"step{step}" / "rank" / "dump.json").read_text())


def _printed_losses(stdout: str) -> list[float]:
    losses = []
    for line in stdout.splitlines():
        m = _LOSS_LINE.match(line)
        if m:
            assert int(m.group(1)) == len(losses)
            losses.append(float(m.group(2)))
    return losses


def _printed_table(stdout: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the table printed after the query (format_table layout)."""
    lines = stdout.splitlines()
    rule = next(i for i, line in enumerate(lines) if re.fullmatch(r"-+(-\+-+)+", line))
    header = [cell.strip() for cell in lines[rule - 1].split(" | ")]
    rows = [[cell.strip() for cell in line.split(" | ")] for line in lines[rule + 1:] if line.strip()]
    return header, rows


def test_layout_and_meta(run):
    dump_path, stdout = run
    for step in range(STEPS):
        step_dir = dump_path / f"step{step}" / "rank"
        for name in ("dump.json", "stack.json", "construct.json"):
            assert (step_dir / name).is_file(), step_dir / name
        assert str(step_dir) in stdout
        doc = _dump(dump_path, step)
        assert doc["task"] == "statistics"
        assert doc["level"] == "mix"
        assert doc["framework"] == "pytorch"
    assert not (dump_path / f"step{STEPS}").exists()


def test_transformer_entries_recorded(run):
    dump_path, _ = run
    data = _dump(dump_path, 0)["data"]
    for i in range(2):
        fwd = data[f"Module.layers.{i}.TransformerEncoderLayer.forward.0"]
        bwd = data[f"Module.layers.{i}.TransformerEncoderLayer.backward.0"]
        (out,) = fwd["output"]
        assert out["shape"] == [16, 64, 64] and out["dtype"] == "torch.float32"
        assert bwd["input"][0]["shape"] == [16, 64, 64]
    assert "Module.head.Linear.parameters_grad" in data
    assert any(name.startswith("Functional.linear.") and name.endswith(".forward") for name in data)
    head = data["Module.head.Linear.parameters_grad"]
    assert set(head) == {"weight", "bias"}
    assert head["weight"][0]["shape"] == [head["bias"][0]["shape"][0], 64]


def test_query_matches_dump_json(run):
    """The printed top-10 parameter-gradient norms, recomputed from dump.json."""
    dump_path, stdout = run
    expected = []
    for step in range(STEPS):
        for name, entry in _dump(dump_path, step)["data"].items():
            if not name.endswith(".parameters_grad"):
                continue
            for param, grads in entry.items():
                for grad in grads:
                    expected.append((step, name, param, grad["Norm"]))
    expected.sort(key=lambda r: (-r[3], r[0], r[1], r[2]))
    expected = expected[:10]
    assert len(expected) == 10 and all(r[3] > 0 for r in expected)

    header, rows = _printed_table(stdout)
    assert header == ["step", "name", "param", "norm"]
    printed = [(int(s), n, p, float(v)) for s, n, p, v in rows]
    assert printed == expected


def test_recording_keeps_losses_bit_identical(run):
    _, stdout = run
    recorded = _printed_losses(stdout)
    assert len(recorded) == STEPS
    plain = _load_example().train(STEPS, record=False)
    assert plain == recorded  # exact float equality: same bits


def _counts(dump_path: Path) -> tuple[int, int]:
    from store.query import query

    table = query(str(dump_path), "SELECT (SELECT count(*) FROM tensors) AS t, (SELECT count(*) FROM calls) AS c")
    return table.column("t")[0].as_py(), table.column("c")[0].as_py()


def test_rerun_replaces_the_previous_recording(tmp_path, capsys):
    """Running the example twice into one dump path leaves the second run only: one log,
    the same rows as one run, no row of the top-ten table printed twice."""
    example = _load_example()
    dump_path = tmp_path / "dump"
    assert example.main(["--steps", "1", "--dump-path", str(dump_path)]) == 0
    first = capsys.readouterr().out
    assert "replaced the previous" not in first
    counts = _counts(dump_path)
    assert example.main(["--steps", "1", "--dump-path", str(dump_path)]) == 0
    second = capsys.readouterr().out
    assert second.splitlines()[0] == f"replaced the previous msprobe recording in {dump_path.resolve()}"
    assert len(list((dump_path / ".msprobe" / "log").glob("*.arrows"))) == 1
    assert _counts(dump_path) == counts
    _, rows = _printed_table(second)
    assert len(rows) == 10 and len({tuple(row) for row in rows}) == 10
    assert _printed_table(second) == _printed_table(first)


@pytest.mark.parametrize("other", ["notes.txt", None])
def test_rerun_never_removes_what_is_not_a_recording(tmp_path, capsys, other):
    """A dump path holding other files (without a recording, or beside one) stops the
    example with a message; nothing is removed."""
    example = _load_example()
    dump_path = tmp_path / "dump"
    dump_path.mkdir()
    if other is None:            # a directory of the user's, no msprobe recording
        (dump_path / "data.bin").write_bytes(b"keep")
        expected = "is not empty and holds no msprobe recording"
        kept = dump_path / "data.bin"
    else:                        # a recording with a file of the user's beside it
        (dump_path / ".msprobe" / "log").mkdir(parents=True)
        (dump_path / other).write_text("keep")
        expected = f"holds a msprobe recording and other files ({other})"
        kept = dump_path / other
    with pytest.raises(SystemExit) as stopped:
        example.main(["--steps", "1", "--dump-path", str(dump_path)])
    assert stopped.value.code == 2
    assert expected in capsys.readouterr().err
    assert kept.read_bytes() == b"keep"
    assert not any(p.name.startswith("step") for p in dump_path.iterdir())


# --- docs/query.md: every documented query, run on this 2-step recording --------------------------
QUERY_DOC = REPO / "docs" / "query.md"
QUERY_BLOCKS = re.findall(r"```\n\$ (msprobe query .*?)\n(.*?)```", QUERY_DOC.read_text(encoding="utf-8"),
                          flags=re.DOTALL)
#: the prefix docs/query.md writes for the checkout's absolute path in stack frames
DOC_CHECKOUT = "/path/to/msprobe/"
_FLOAT = re.compile(r"-?\d+\.\d+(?:e[-+]?\d+)?")


def _query_lines(text: str, fmt: str) -> tuple[list[str], list[list[str]]]:
    """Header and output lines (cells stripped) of one ``msprobe query`` output. A table
    cell with a newline (a stack frame) continues on the next line, which counts as a line."""
    if fmt == "csv":
        header, *rows = csv.reader(text.splitlines())
        return header, rows
    lines = text.rstrip("\n").split("\n")
    assert re.fullmatch(r"-+(-\+-+)*", lines[1]), lines[1]
    return ([c.strip() for c in lines[0].split(" | ")],
            [[c.strip() for c in line.split(" | ")] for line in lines[2:]])


def _neutral(cells: list[list[str]], checkout: str) -> list[list[str]]:
    """Floats (they depend on the step count and the build) masked, the checkout prefix neutral."""
    return [[_FLOAT.sub("<float>", c.replace(checkout, DOC_CHECKOUT)) for c in row] for row in cells]


def test_query_doc_has_the_examples():
    assert len(QUERY_BLOCKS) == 7
    assert all("/work/" not in out for _, out in QUERY_BLOCKS)   # no machine-specific paths shown


@pytest.mark.parametrize("index", range(len(QUERY_BLOCKS)))
def test_query_doc_example(run, capsys, index):
    """The doc's outputs are from 8 steps: the same columns; step-0 queries print the same
    rows (floats aside), the others as many rows as the doc (per-step rows: one per step)."""
    from msprobe.cli import main as cli

    command, doc_out = QUERY_BLOCKS[index]
    argv = shlex.split(command)
    assert argv[:3] == ["msprobe", "query", "dump_path"]
    dump_path, _ = run
    fmt = argv[argv.index("--format") + 1] if "--format" in argv else "table"
    capsys.readouterr()
    assert cli(["query", str(dump_path)] + argv[3:]) == 0
    got_header, got = _query_lines(capsys.readouterr().out, fmt)
    doc_header, doc = _query_lines(doc_out, fmt)
    assert got_header == doc_header
    sql = argv[3]
    if "step = 0" in sql:
        assert _neutral(got, str(REPO) + os.sep) == _neutral(doc, "\0")
    elif "LIMIT" in sql:
        assert len(got) == len(doc)
    else:
        assert len(got) == STEPS and len(doc) == 8
