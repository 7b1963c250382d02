"""A page of 1,000 modules x 100 steps (``benchmarks/report_scale.py``'s synthetic log,
modules nested in blocks of 10) loads and draws in headless Chromium in under 3 s; the
graph holds all 1,000 modules of the step and draws only the open part (expand all: at
most 400 boxes)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from msprobe.report import write_report

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT / "benchmarks"))
from chromium_page import browser_or_skip  # noqa: E402
from report_scale import write_log  # noqa: E402

LOAD_LIMIT_MS = 3000


@pytest.fixture(scope="module")
def big_page(tmp_path_factory):
    d = tmp_path_factory.mktemp("scale")
    write_log(d / "dump", 100, 1000, nested=True)
    return write_report(d / "dump", d / "report.html")


def test_thousand_modules_hundred_steps_load_under_3_s(big_page):
    browser = browser_or_skip()
    try:
        times = []
        for _ in range(2):   # the better of two loads: the first one also warms Chromium up
            browser.open(big_page)
            assert browser.js("document.body.dataset.ready") == "1" and browser.errors == []
            times.append(int(browser.js("document.body.dataset.readyMs")))
        print(f"page {big_page.stat().st_size / 1e6:.2f} MB, ready after {times} ms")
        assert min(times) < LOAD_LIMIT_MS
        assert browser.js("document.getElementById('step').options.length") == 100
        assert int(browser.js("document.getElementById('graph').dataset.nodes")) == 1000
        # 100 top-level blocks: three groups of at most 40, nothing else laid out yet
        groups = browser.js("[...document.querySelectorAll('#graph .group')].map(g => g.textContent)")
        assert len(groups) == 3 and groups[0].startswith("calls 1–40 of 100")
        browser.js("document.querySelector('#graph .group').dispatchEvent(new MouseEvent('click', {bubbles: true}))")
        assert browser.js("document.querySelectorAll('#graph .node').length") == 40
        # expand all opens level by level up to 400 boxes and says where it stopped
        browser.js("[...document.querySelectorAll('#graph .graph-bar button')].find(b => b.textContent === 'expand all').click()")
        boxes = browser.js("document.querySelectorAll('#graph .node, #graph .group').length")
        assert 300 < boxes <= 400
        assert browser.js("document.querySelector('#graph .graph-cap').textContent").startswith("expand all stopped at 400 boxes")
        assert browser.errors == []
    finally:
        browser.close()
