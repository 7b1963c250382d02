"""examples/ms_char_lm.py: runs, writes the documented layout, its query agrees with
dump.json, and recording leaves the losses bit-identical."""
from __future__ import annotations

import importlib.util
import inspect
import json
from pathlib import Path

import pytest

pytest.importorskip("mindspore")

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "ms_char_lm.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("ms_char_lm_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_records_and_queries(tmp_path):
    ex = _load_example()
    dump = tmp_path / "dump"
    recorded = ex.train(2, str(dump), record=True)
    plain = ex.train(2, str(dump / "unused"), record=False)
    assert [a.tobytes() for a in recorded] == [b.tobytes() for b in plain]
    assert not (dump / "unused").exists()
    for step in (0, 1):
        doc = json.loads((dump / f"step{step}" / "rank" / "dump.json").read_text())
        assert doc["framework"] == "mindspore" and doc["level"] == "mix"
        names = list(doc["data"])
        assert names[:5] == ["Primitive.get_shp.Shape.0.forward", "Primitive.reshape_flat.Reshape.0.forward",
                             "Primitive.gather.Gather.0.forward", "Primitive.reshape.Reshape.0.forward",
                             "Cell.embed.Embedding.forward.0"]
        assert "Cell.head.Dense.backward.0" in names and "Functional.cross_entropy.0.backward" in names
    table = ex.top_grad_norms(str(dump)).to_pylist()
    assert len(table) == 10
    assert [r["norm"] for r in table] == sorted((r["norm"] for r in table), reverse=True)
    top = table[0]
    doc = json.loads((dump / f"step{top['step']}" / "rank" / "dump.json").read_text())
    assert doc["data"][top["name"]][top["param"]][0]["Norm"] == top["norm"]


def test_rerun_replaces_the_previous_recording(tmp_path, capsys):
    """Training the example twice into one dump path leaves the second run only (one log,
    one run's rows); its default dump path is apart from the PyTorch example's."""
    from store.query import query

    ex = _load_example()
    assert inspect.signature(ex.train).parameters["dump_path"].default == "./dump_path_ms"
    dump = tmp_path / "dump"
    sql = "SELECT (SELECT count(*) FROM tensors) AS t, (SELECT count(*) FROM calls) AS c"
    ex.train(1, str(dump), record=True)
    assert "replaced the previous" not in capsys.readouterr().out
    once = query(str(dump), sql).to_pylist()
    ex.train(1, str(dump), record=True)
    assert capsys.readouterr().out == f"replaced the previous msprobe recording in {dump.resolve()}\n"
    assert len(list((dump / ".msprobe" / "log").glob("*.arrows"))) == 1
    assert query(str(dump), sql).to_pylist() == once
