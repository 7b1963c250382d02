"""``msprobe compare``'s report.html rendered in headless Chromium: no console errors, the
path to the first origin marked in the module tree, labelled axes, no Python reprs, each
table row linked to a stack on the page, unpaired rows naming the missing side."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from msprobe.compare import compare

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
from chromium_page import browser_or_skip  # noqa: E402


@pytest.fixture(scope="module")
def gelu_report(tmp_path_factory, record_run, scaled_fn):
    d = tmp_path_factory.mktemp("compare_html")
    base = record_run(d / "base", md5=True)
    gelu = record_run(d / "gelu", md5=True, perturb={"F.gelu": scaled_fn(1 + 1e-3)})
    compare(gelu, base, out=d / "out", formats="summary,html")
    return d / "out"


def test_report_html_in_browser(gelu_report):
    summary = json.loads((gelu_report / "summary.json").read_text())
    origin = summary["ranks"][0]["first_origin"]
    browser = browser_or_skip()
    try:
        browser.open(gelu_report / "report.html")
        assert browser.js("document.body.dataset.ready") == "1"
        assert browser.errors == []
        assert browser.js("document.querySelector('.first-origin .call-name').textContent") == origin["name"]
        # the path: the origin and each module above it, outermost open
        marked = browser.js("[...document.querySelectorAll('.tree .path')].map(e => e.dataset.name)")
        assert origin["name"] in marked and origin["module"] in marked
        assert browser.js(f"document.querySelector('.tree [data-name=\"{origin['name']}\"]').checkVisibility()")
        labels = browser.js("[...document.querySelectorAll('.e-plot svg text')].map(t => t.textContent)")
        assert "call (execution order, all steps)" in labels and "largest e/tol of the outputs (log scale)" in labels
        # ticks: x at a multiple of 1, 2 or 5 x 10^k from 0; y at powers of ten (e spans decades)
        xticks = [float(v) for v in browser.js("[...document.querySelectorAll('.e-plot .xtick')].map(t => t.textContent)")]
        step = xticks[1] - xticks[0]
        assert xticks[0] == 0 and step / 10 ** math.floor(math.log10(step)) in (1, 2, 5)
        assert xticks == [k * step for k in range(len(xticks))]
        yticks = [float(v) for v in browser.js("[...document.querySelectorAll('.e-plot .ytick')].map(t => t.textContent)")]
        assert len(yticks) >= 2 and all(math.log10(v) == round(math.log10(v)) for v in yticks)
        # tables, headings and the first-origin line (stacks quote source code and are left out)
        text = browser.js("[...document.querySelectorAll('td, th, h1, h2, .first-origin > p')]"
                          ".map(e => e.innerText).join(' | ')")
        assert origin["name"] in text
        assert "None" not in text and "{'" not in text and "nan" not in text
        links = browser.js("[...document.querySelectorAll('a.stack-link')].map(a => a.getAttribute('href'))")
        assert len(links) == sum(v for k, v in summary["ranks"][0]["counts"].items() if k != "pass")
        assert all(browser.js(f"document.getElementById({json.dumps(h[1:])}) !== null") for h in links)
    finally:
        browser.close()


@pytest.fixture(scope="module")
def inserted_reports(tmp_path_factory, record_run):
    """report.html of a run with three inserted ops against one without, both ways."""
    d = tmp_path_factory.mktemp("compare_html_ins")
    base, ins = record_run(d / "base"), record_run(d / "ins", insert=True)
    compare(ins, base, out=d / "inserted", formats="summary,html")
    compare(base, ins, out=d / "deleted", formats="summary,html")
    return d


def call_cells(browser) -> list[list[str]]:
    """The lines of each call cell of the table of calls that did not pass."""
    return browser.js("[...document.querySelectorAll('table.calls tr')].slice(1)"
                      ".map(r => r.cells[1].innerText.split('\\n'))")


def test_unpaired_rows_name_the_missing_side(inserted_reports):
    browser = browser_or_skip()
    try:
        for side in ("inserted", "deleted"):
            browser.open(inserted_reports / side / "report.html")
            assert browser.js("document.body.dataset.ready") == "1" and browser.errors == []
            text = browser.js("[...document.querySelectorAll('td, th')].map(e => e.innerText).join(' | ')")
            assert "None" not in text and "null" not in text and "undefined" not in text
            cells = {tuple(c) for c in call_cells(browser)}
            if side == "inserted":   # the target's extra calls: in their module, no partner
                assert ("Torch.tanh.0.forward", "baseline: — (no partner)", "in Module.blocks.0.Block.forward.0") in cells
            else:                    # the baseline's calls missing from the target: no module shown
                assert ("— (no target call)", "baseline: Torch.tanh.0.forward") in cells
    finally:
        browser.close()
