"""compare's report.html in headless Chromium: the model graph colours the first origin as
the origin, a click shows both runs' statistics equal to their dump.json, the step
selector changes them; the error plot is in units of tolerance; under a ``--mapping`` the
page names the TARGET's original classes everywhere, once."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from msprobe.compare import compare

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
from chromium_page import browser_or_skip  # noqa: E402
from test_graph_in_browser import STATS, choose, click, node  # noqa: E402
from test_report_data import dump_jsons  # noqa: E402


@pytest.fixture(scope="module")
def browser():
    b = browser_or_skip()
    yield b
    b.close()


@pytest.fixture(scope="module")
def gelu_two_steps(tmp_path_factory, record_run, scaled_fn):
    d = tmp_path_factory.mktemp("graph_compare")
    base = record_run(d / "base", steps=2)
    gelu = record_run(d / "gelu", steps=2, perturb={"F.gelu": scaled_fn(1 + 1e-3)})
    result = compare(gelu, base, out=d / "out", formats="summary,html")
    return gelu, base, d / "out", result.summary


def test_compare_graph_origin_and_both_runs(browser, gelu_two_steps):
    gelu, base, out, summary = gelu_two_steps
    browser.open(out / "report.html")
    assert browser.js("document.body.dataset.ready") == "1" and browser.errors == []
    origin = summary["ranks"][0]["first_origin"]
    assert origin["name"] == "Functional.gelu.0.forward" and origin["step"] == 0
    assert browser.js("document.getElementById('step').value") == "0"
    # the origin is shown (its module opened) and coloured as the origin; no other node is
    assert browser.js("[...document.querySelectorAll('#graph .node.verdict-origin')].map(e => e.dataset.name)") == [origin["name"]]
    assert browser.js(f"{node(origin['name'])}.querySelector('rect').getAttribute('fill')") == "#d32f2f"
    t_json, b_json = dump_jsons(gelu, "rank"), dump_jsons(base, "rank")
    for step in (0, 1):
        choose(browser, "step", step)
        click(browser, node(origin["name"]))
        assert browser.js("document.querySelector('#details .details-name').textContent") == origin["name"]
        rows = browser.js("[...document.querySelectorAll('#details table.both-runs tr:not(.tensor-head)')].slice(1)"
                          ".map(r => [r.cells[0].textContent, r.cells[1].dataset.value, r.cells[2].dataset.value])")
        heads = browser.js("[...document.querySelectorAll('#details table.both-runs tr.tensor-head')].map(r => r.textContent)")
        assert [h.split(" · ")[0] for h in heads] == ["input_args 0", "output 0"]
        for k, io in enumerate(("input_args", "output")):
            t_leaf, b_leaf = t_json[step][origin["name"]][io][0], b_json[step][origin["name"]][io][0]
            for (stat, t_text, b_text), expected in zip(rows[4 * k: 4 * k + 4], STATS):
                assert stat == expected
                assert float(t_text) == pytest.approx(t_leaf[stat], rel=1e-12)
                assert float(b_text) == pytest.approx(b_leaf[stat], rel=1e-12)
        if step == 1:   # step 1's values differ from step 0's (the weights moved)
            assert float(rows[4][1]) != pytest.approx(t_json[0][origin["name"]]["output"][0]["Max"], rel=1e-9)
    # the plot: e in units of tolerance, a dotted line at 1, the dashed line at the origin
    assert "largest e/tol of the outputs (log scale)" in browser.js(
        "[...document.querySelectorAll('.e-plot svg text')].map(t => t.textContent)")
    assert browser.js("document.querySelectorAll('.e-plot .hline').length") == 1
    assert browser.errors == []
