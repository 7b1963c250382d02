"""The NaN hunt of docs/report.md in headless Chromium: a tiny Llama whose loss goes NaN at
step 4 (``tools/report_screenshots.py``'s ``record_llama_nan``: ``rms_norm_eps=0``, step 4's
batch the first with padding). The page opens on step 4 with the origin, layer 0's
``torch.rsqrt`` in ``input_layernorm``, selected; its values are dump.json's; the step
selector shows the finite values of step 3; the heat map's first NaN row is that module;
the overview gives the entries per step in one sentence (every step recorded as many)."""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from msprobe.report import write_report

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT / "examples"))
from chromium_page import browser_or_skip  # noqa: E402
from test_graph_in_browser import STATS, as_float, choose, click, node  # noqa: E402
from test_report_data import dump_jsons  # noqa: E402

ORIGIN = "Torch.rsqrt.0.forward"
NORM = "Module.model.layers.0.input_layernorm.LlamaRMSNorm"


@pytest.fixture(scope="module")
def llama_nan(tmp_path_factory):
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("report_screenshots", ROOT / "tools" / "report_screenshots.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    dump = tmp_path_factory.mktemp("llama_nan") / "dump_path"
    losses = tool.record_llama_nan(6, str(dump))
    assert tool.NAN_STEP == 4
    return dump, losses


def test_llama_nan_hunt_page(llama_nan, tmp_path):
    dump, losses = llama_nan
    assert all(math.isfinite(x) for x in losses[:4]) and all(math.isnan(x) for x in losses[4:])
    by_step = dump_jsons(dump, "rank")
    # the origin in dump.json: finite input, Inf output, step 4 only
    assert all(math.isfinite(v) for v in (by_step[4][ORIGIN]["input_args"][0][s] for s in STATS))
    assert by_step[4][ORIGIN]["output"][0]["Max"] in (math.inf, "Infinity", "inf")
    browser = browser_or_skip()
    try:
        browser.open(write_report(dump, tmp_path / "report.html"))
        assert browser.js("document.body.dataset.ready") == "1" and browser.errors == []
        assert browser.js("document.querySelector('#first-nan-0 .origin-name').textContent") == ORIGIN
        # every step recorded the same entries: one sentence, not a chart of flat lines
        (entries,) = {len(data) for data in by_step.values()}
        assert browser.js("document.getElementById('per-step').textContent").startswith(
            f"Every step recorded {entries} entries and ")
        assert browser.js("document.getElementById('step').value") == "4"
        assert browser.js("document.querySelector('#details .details-name').textContent") == ORIGIN
        assert browser.js(f"{node(ORIGIN)}.querySelector('rect').getAttribute('fill')") == "#ff00ff"   # Inf
        for step in (4, 3):
            choose(browser, "step", step)
            click(browser, node(ORIGIN))
            cells = browser.js("[...document.querySelectorAll('#details table.stats-now td.num')].map(td => td.dataset.value)")
            (out,) = by_step[step][ORIGIN]["output"]
            for text, stat in zip(cells, STATS):
                assert as_float(text) == pytest.approx(float(out[stat]), rel=1e-6)
        assert all(math.isfinite(as_float(c)) for c in cells)   # step 3: finite
        # the details' SQL, run as the page prints it, gives the call's tensors of step 3 as dump.json has them
        command = browser.js("document.querySelector('#details pre.sql').textContent")
        assert command.startswith(f"msprobe query {dump} \"")
        from store.query import query

        rows = query(str(dump), command.split(' "', 1)[1][:-1]).to_pylist()
        assert [(r["io"], r["arg"]) for r in rows] == [("input_args", "0"), ("output", "0")]
        for row, io in zip(rows, ("input_args", "output")):
            leaf = by_step[3][ORIGIN][io][0]
            assert [row[k] for k in ("max", "min", "mean", "norm")] == pytest.approx([leaf[s] for s in STATS], rel=1e-6)
            assert row["shape"] == leaf["shape"]
        stack = browser.js("document.querySelector('#details details pre').textContent")
        assert "torch.rsqrt(variance + self.variance_epsilon)" in stack
        # heat map: the first row NaN in step 4 is the module holding the origin
        rows = browser.js("readData().per_rank['0'].output.rows")
        values = browser.js("readData().per_rank['0'].output.values")
        first = next(r for r, v in zip(rows, values) if v[4] == "NaN")
        assert first == NORM and all(v[3] != "NaN" for v in values)
        assert browser.errors == []
    finally:
        browser.close()
