"""``msprobe report`` and ``export --tensorboard`` on a MindSpore recording
(examples/ms_char_lm.py, 2 steps): Cells are the heat maps' rows and the graph's boxes,
the values equal dump.json's; the page draws without console errors."""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("mindspore")

from msprobe.report import write_report  # noqa: E402
from msprobe.report.data import collect  # noqa: E402
from msprobe.report.tensorboard import write_tensorboard  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from chromium_page import browser_or_skip  # noqa: E402
from test_export_tensorboard import scalars  # noqa: E402
from test_report_data import dump_jsons  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ms_char_lm.py"


@pytest.fixture(scope="module")
def ms_dump(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("ms_char_lm_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dump = tmp_path_factory.mktemp("ms") / "dump"
    module.train(2, str(dump), record=True)
    return dump


def cell_output_norms(by_step: dict) -> dict:
    out: dict = {}
    for step, data in by_step.items():
        for name, entry in data.items():
            if name.startswith("Cell.") and ".forward." in name:
                norms = [leaf["Norm"] for leaf in entry.get("output") or [] if isinstance(leaf, dict) and "Norm" in leaf]
                if norms:
                    key = (name[: name.rindex(".forward.")], step)
                    out[key] = out.get(key, 0.0) + sum(n * n for n in norms)
    return {k: math.sqrt(v) for k, v in out.items()}


def test_cells_are_rows_nodes_and_scalars(ms_dump, tmp_path):
    data = collect(ms_dump)
    by_step = dump_jsons(ms_dump, "rank")
    expected = cell_output_norms(by_step)
    heat = data["per_rank"]["0"]["output"]
    assert data["rows_are"] == "modules" and set(heat["rows"]) == {k for k, _ in expected}
    for i, row in enumerate(heat["rows"]):
        for j, column in enumerate(heat["columns"]):
            assert heat["values"][i][j] == pytest.approx(expected[(row, int(column))], rel=1e-9)
    graph = data["per_rank"]["0"]["graph"]
    construct = json.loads((ms_dump / "step1" / "rank" / "construct.json").read_text())
    names = {graph["nodes"][r[0]][0] for r in graph["stats"]["1"]}
    assert names == {n for n in construct if n.endswith(".forward") or ".forward." in n}
    got = scalars(write_tensorboard(ms_dump, tmp_path / "tb") and tmp_path / "tb" / "rank0")
    for (cell, step), value in expected.items():
        assert got[f"output_norm/{cell}"][step] == pytest.approx(value, rel=1e-6)
    browser = browser_or_skip()
    try:
        browser.open(write_report(ms_dump, tmp_path / "report.html"))
        assert browser.js("document.body.dataset.ready") == "1" and browser.errors == []
        assert int(browser.js("document.getElementById('graph').dataset.nodes")) == len(
            {graph["nodes"][r[0]][0] for r in graph["stats"][browser.js("document.getElementById('step').value")]})
        assert browser.js("document.querySelector('#graph .node[data-name=\"Cell.embed.Embedding.forward.0\"] text').textContent") == "embed"
    finally:
        browser.close()
