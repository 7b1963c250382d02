"""The views of ``msprobe report`` in headless Chromium: heat maps use the page's width,
tables sort, filter and page through every row, plot ticks are nice values, the step
selector marks the step in the heat maps."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from msprobe.report import write_report
from msprobe.report.data import collect

sys.path.insert(0, str(Path(__file__).parent))
from chromium_page import browser_or_skip  # noqa: E402
from test_graph_in_browser import choose  # noqa: E402


@pytest.fixture(scope="module")
def browser():
    b = browser_or_skip()
    yield b
    b.close()


def table_rows(browser, cls: str) -> list[list[str]]:
    return browser.js(f"[...document.querySelectorAll('table.{cls} tr')].slice(1).map(r => [...r.cells].map(c => c.dataset.value ?? c.textContent))")


def test_heat_maps_use_the_width(browser, example_dump, tmp_path):
    browser.open(write_report(example_dump, tmp_path / "report.html"))
    assert browser.errors == []
    page = browser.js("document.documentElement.clientWidth")
    for which in ("output", "grad"):
        width = browser.js(f"document.querySelector('#heat-{which} canvas').getBoundingClientRect().width")
        left = int(browser.js(f"document.querySelector('#heat-{which} canvas').dataset.grid.split(',')[0]"))
        assert width >= 0.85 * (page - 60)
        # the label column fits the longest row name (without its "Module." prefix), up to 45 %
        longest = browser.js(f"""(() => {{ const g = document.createElement('canvas').getContext('2d'); g.font = '11px sans-serif';
            return Math.max(...readData().per_rank['0'].{which}.rows.map(r => g.measureText(r.replace(/^Module\\./, '')).width)); }})()""")
        assert left >= min(longest + 12, 0.45 * (page - 60)) - 1


def test_tables_sort_filter_and_reach_every_row(browser, example_dump, tmp_path):
    page = write_report(example_dump, tmp_path / "report.html", threshold=1e-3)
    extremes = collect(example_dump, threshold=1e-3)["largest"]["extremes"]
    assert len(extremes) > 100       # more than one page of 100 rows
    browser.open(page)
    assert browser.errors == []
    box = "document.querySelector('#largest .data-table')"
    info = lambda: browser.js(f"{box}.querySelector('.table-info').textContent")  # noqa: E731
    assert info() == f"rows 1–100 of {len(extremes)}" and len(table_rows(browser, "extremes")) == 100
    seen = [tuple(r[:4]) for r in table_rows(browser, "extremes")]
    browser.js(f"{box}.querySelector('.table-next').click()")
    seen += [tuple(r[:4]) for r in table_rows(browser, "extremes")]
    assert info() == f"rows 101–{min(200, len(extremes))} of {len(extremes)}"
    browser.js(f"{box}.querySelector('.table-all').click()")
    rows = table_rows(browser, "extremes")
    assert len(rows) == len(extremes)
    assert [tuple(r[:4]) for r in rows[: len(seen)]] == seen
    assert {(str(e["rank"]), e["name"], e["io"], e["arg"]) for e in extremes} == {tuple(r[:4]) for r in rows}
    # sort by Max (a number), twice: ascending then descending
    header = f"[...{box}.querySelectorAll('th')].find(h => h.textContent === 'Max')"
    browser.js(f"{header}.click()")
    values = [float(r[6]) for r in table_rows(browser, "extremes")]
    assert values == sorted(values)
    browser.js(f"{header}.click()")
    values = [float(r[6]) for r in table_rows(browser, "extremes")]
    assert values == sorted(values, reverse=True)
    # filter: every word typed, in any column
    browser.js(f"(() => {{ const f = {box}.querySelector('.table-filter'); f.value = 'LINEAR2 output';"
               " f.dispatchEvent(new Event('input')); })()")
    rows = table_rows(browser, "extremes")
    named = lambda e: (e["name"] + " " + ", ".join(e["seen_in"][:3])).lower()  # noqa: E731
    expected = [e for e in extremes if "linear2" in named(e) and e["io"] == "output"]
    assert len(rows) == len(expected) > 0 and all("linear2" in (r[1] + r[9]).lower() and r[2] == "output" for r in rows)
    assert browser.errors == []


def test_movers_ticks_are_nice_and_the_step_is_marked(browser, nan_dump, tmp_path):
    browser.open(write_report(nan_dump, tmp_path / "report.html"))
    ticks = [float(t) for t in browser.js("[...document.querySelectorAll('#movers .ytick')].map(t => t.textContent)")]
    assert len(ticks) >= 2
    decades = all(math.log10(t) == round(math.log10(t)) for t in ticks)
    if not decades:   # less than two decades: equally spaced multiples of 1, 2 or 5 x 10^k
        step = ticks[1] - ticks[0]
        mantissa = step / 10 ** math.floor(math.log10(step))
        assert min(abs(mantissa - m) for m in (1, 2, 5, 10)) < 1e-6
        assert all(abs((b - a) - step) < 1e-9 * max(ticks) for a, b in zip(ticks, ticks[1:]))
    for step in ("0", "2"):
        choose(browser, "step", step)
        marks = browser.js("[...document.querySelectorAll('#movers line[stroke-dasharray=\"4\"]')].map(l => l.getAttribute('x1'))")
        assert len(marks) == 1
    assert browser.errors == []


def test_largest_values_follow_the_step_when_asked(browser, example_dump, tmp_path):
    browser.open(write_report(example_dump, tmp_path / "report.html", threshold=1e-3, jump=1.2))
    data = collect(example_dump, threshold=1e-3, jump=1.2)["largest"]
    box = "document.querySelector('#largest')"
    assert len(table_rows(browser, "extremes")) == min(100, len(data["extremes"]))
    browser.js("(() => { const c = document.getElementById('largest-step-only'); c.checked = true;"
               " c.dispatchEvent(new Event('change')); })()")
    for step in (1, 2):
        choose(browser, "step", step)
        assert browser.js("document.getElementById('largest-step-only').checked") is True
        extremes = [e for e in data["extremes"] if step in e["step_list"]]
        jumps = [j for j in data["jumps"] if step in (j["step"], j["previous_step"])]
        assert browser.js(f"{box}.querySelectorAll('.table-info')[0].textContent").endswith(f"of {len(extremes)}")
        assert browser.js(f"{box}.querySelectorAll('.table-info')[1].textContent").endswith(f"of {len(jumps)}")
        assert len(jumps) > 0
    assert browser.errors == []
