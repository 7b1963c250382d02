"""The model graph of ``msprobe report`` in headless Chromium: one node per recorded call
of the chosen step, a module opens to show its children, a click shows the values
dump.json holds, the step selector changes them, search marks a hit; no console errors.
(The compare page's graph: tests/compare/test_report_graph.py.)"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from msprobe.report import write_report

sys.path.insert(0, str(Path(__file__).parent))
from chromium_page import browser_or_skip  # noqa: E402
from test_report_data import dump_jsons  # noqa: E402

STATS = ("Max", "Min", "Mean", "Norm")


@pytest.fixture(scope="module")
def browser():
    b = browser_or_skip()
    yield b
    b.close()


def choose(browser, select_id: str, value) -> None:
    browser.js(f"(() => {{ const s = document.getElementById('{select_id}'); s.value = '{value}';"
               f" s.dispatchEvent(new Event('change')); }})()")


def node(name: str) -> str:
    return f"document.querySelector('#graph .node[data-name={json.dumps(name)}]')"


def click(browser, expression: str) -> None:
    browser.js(f"{expression}.dispatchEvent(new MouseEvent('click', {{bubbles: true}}))")


def shown_names(browser) -> list[str]:
    return browser.js("[...document.querySelectorAll('#graph .node')].map(e => e.dataset.name)")


def forward_entries(construct: dict) -> set[str]:
    return {n for n in construct if n.endswith(".forward") or ".forward." in n}


def as_float(text: str) -> float:
    return float({"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}.get(text, text))


def test_report_graph_nodes_children_values_and_steps(browser, nan_dump, tmp_path):
    browser.open(write_report(nan_dump, tmp_path / "report.html"))
    assert browser.js("document.body.dataset.ready") == "1" and browser.errors == []
    by_step = dump_jsons(nan_dump, "rank")
    # the page opens on the step of the first NaN origin, the origin selected
    assert browser.js("document.getElementById('step').value") == "1"
    assert browser.js("document.querySelector('#details .details-name').textContent") == "Torch.log.0.forward"
    for step in (0, 2):
        choose(browser, "step", step)
        construct = json.loads((nan_dump / f"step{step}" / "rank" / "construct.json").read_text())
        expected = forward_entries(construct)
        assert int(browser.js("document.getElementById('graph').dataset.nodes")) == len(expected)
        browser.js("[...document.querySelectorAll('#graph .graph-bar button')].find(b => b.textContent === 'expand all').click()")
        assert sorted(shown_names(browser)) == sorted(expected)
        modules = {n for n in expected if n.startswith("Module.")}
        shown_modules = browser.js("[...document.querySelectorAll('#graph .node:not(.api)')].map(e => e.dataset.name)")
        assert sorted(shown_modules) == sorted(modules)
    # collapsed, a module's API calls are hidden; its + shows them
    browser.js("[...document.querySelectorAll('#graph .graph-bar button')].find(b => b.textContent === 'collapse all').click()")
    fc1, linear = "Module.fc1.Linear.forward.0", "Functional.linear.0.forward"
    assert linear not in shown_names(browser) and fc1 in shown_names(browser)
    click(browser, f"{node(fc1)}.querySelector('.toggle')")
    assert linear in shown_names(browser)
    assert browser.js(f"document.querySelector('#graph .cluster[data-name=\"{fc1}\"]') !== null")
    # a click shows the module's output statistics of the step: dump.json's values
    click(browser, node(fc1))
    for step in (0, 2):   # the step selector keeps the node and shows that step's values
        choose(browser, "step", step)
        assert browser.js("document.querySelector('#details .details-name').textContent") == fc1
        cells = browser.js("[...document.querySelectorAll('#details table.stats-now td.num')].map(td => td.dataset.value)")
        (out,) = by_step[step][fc1]["output"]
        for text, stat in zip(cells, STATS):
            assert as_float(text) == pytest.approx(out[stat], rel=1e-6, nan_ok=True)
        frames = browser.js("document.querySelector('#details details') ? document.querySelector('#details details pre').textContent : ''")
        assert "record_worker.py" in frames
    assert by_step[2][fc1]["output"][0]["Norm"] != by_step[2][fc1]["output"][0]["Norm"]   # NaN from step 2 on
    sql = browser.js("document.querySelector('#details pre.sql').textContent")
    assert f"AND step = 2 AND name = '{fc1}'" in sql
    # colour by NaN/Inf: fc1's output of step 2 is NaN (red), of step 0 finite
    assert browser.js(f"{node(fc1)}.querySelector('rect').getAttribute('fill')") == "#e53935"
    choose(browser, "step", 0)
    assert browser.js(f"{node(fc1)}.querySelector('rect').getAttribute('fill')") != "#e53935"
    # search opens the path to a hit and marks it
    browser.js("(() => { const s = document.querySelector('#graph .graph-search'); s.value = 'linear.1';"
               " s.dispatchEvent(new Event('input')); })()")
    assert browser.js("[...document.querySelectorAll('#graph .node.hit')].map(e => e.dataset.name)") == ["Functional.linear.1.forward"]
    assert browser.errors == []


def test_long_runs_of_api_calls_open_forty_at_a_time(browser, example_dump, tmp_path):
    browser.open(write_report(example_dump, tmp_path / "report.html"))
    assert browser.errors == []
    construct = json.loads((example_dump / "step0" / "rank" / "construct.json").read_text())
    top_apis = [n for n in forward_entries(construct) if construct[n] is None and not n.startswith("Module.")]
    group = "[...document.querySelectorAll('#graph .group')].find(g => / API calls$/.test(g.querySelector('text').textContent))"
    first = browser.js(f"{group}.querySelector('text').textContent")
    run = int(first.split()[0])
    assert run > 40 and run <= len(top_apis)
    browser.js(f"{group}.dispatchEvent(new MouseEvent('click', {{bubbles: true}}))")
    chunks = browser.js("[...document.querySelectorAll('#graph .group:not(.open)')].map(g => g.querySelector('text').textContent)")
    assert chunks[0] == f"calls 1–40 of {run}" and len(chunks) == -(-run // 40)
    before = len(shown_names(browser))
    browser.js("[...document.querySelectorAll('#graph .group:not(.open)')][0].dispatchEvent(new MouseEvent('click', {bubbles: true}))")
    assert len(shown_names(browser)) == before + 40
    assert browser.errors == []


def test_rank_and_step_selectors_drive_graph_and_tree(browser, two_rank_dump, tmp_path):
    """Each rank's graph details and module tree show that rank's dump.json values of the
    chosen step (the ranks train on different batches, so their values differ)."""
    browser.open(write_report(two_rank_dump, tmp_path / "report.html"))
    assert browser.js("document.body.dataset.ready") == "1" and browser.errors == []
    fc1 = "Module.fc1.Linear.forward.0"
    shown = {}
    for rank in (0, 1):
        choose(browser, "rank", rank)
        by_step = dump_jsons(two_rank_dump, f"rank{rank}")
        for step in (0, 1):
            choose(browser, "step", step)
            construct = json.loads((two_rank_dump / f"step{step}" / f"rank{rank}" / "construct.json").read_text())
            assert int(browser.js("document.getElementById('graph').dataset.nodes")) == len(forward_entries(construct))
            click(browser, node(fc1))
            assert browser.js("document.querySelector('#details .details-name').textContent") == fc1
            cells = browser.js("[...document.querySelectorAll('#details table.stats-now td.num')].map(td => td.dataset.value)")
            (out,) = by_step[step][fc1]["output"]
            for text, stat in zip(cells, STATS):
                assert as_float(text) == pytest.approx(out[stat], rel=1e-6, nan_ok=True)
            # the module tree of the same rank and step: fc1's output Norm (4 significant digits)
            tree = browser.js(f"document.querySelector('.tree [data-name=\"{fc1}\"] .stats').textContent")
            assert as_float(tree.split(" · ")[0].removeprefix("Norm ")) == pytest.approx(out["Norm"], rel=1e-3, nan_ok=True)
            shown[(rank, step)] = float(cells[3])
    assert shown[(0, 0)] != shown[(1, 0)] and shown[(0, 0)] != shown[(0, 1)]
    assert browser.errors == []


def test_colour_by_output_norm_follows_dump_json(browser, nan_dump, tmp_path):
    """Colour by output Norm: each node's fill is the page's colour ramp at the log-scaled
    position of its output Norm (``sqrt(sum Norm²)`` over its output tensors in dump.json)
    between the step's smallest and largest; NaN stays red."""
    browser.open(write_report(nan_dump, tmp_path / "report.html"))
    by_step = dump_jsons(nan_dump, "rank")
    for step in (0, 1):   # step 1: finite before the log of -1, NaN after it
        choose(browser, "step", step)
        choose(browser, "colour-by", 4)
        browser.js("[...document.querySelectorAll('#graph .graph-bar button')].find(b => b.textContent === 'expand all').click()")
        norms = {}
        for name, entry in by_step[step].items():
            if ".forward" not in name:
                continue
            outputs = [leaf for leaf in entry.get("output") or [] if isinstance(leaf, dict) and "Norm" in leaf]
            if outputs:
                norms[name] = math.sqrt(sum(float(o["Norm"]) ** 2 for o in outputs))
        finite = [v for v in norms.values() if math.isfinite(v) and v > 0]
        lo, hi = math.log10(min(finite)), math.log10(max(finite))
        fills = browser.js("Object.fromEntries([...document.querySelectorAll('#graph .node')]"
                           ".map(e => [e.dataset.name, e.querySelector('rect').getAttribute('fill')]))")
        assert set(norms) <= set(fills)
        for name, value in norms.items():
            if math.isnan(value):
                assert fills[name] == "#e53935"
                continue
            t = (math.log10(value) - lo) / max(hi - lo, 1e-9) if value > 0 else 0.0
            expected = browser.js(f"ramp({t!r})")
            got, want = (list(map(int, c[4:-1].split(","))) for c in (fills[name], expected))
            assert max(abs(a - b) for a, b in zip(got, want)) <= 1, (name, fills[name], expected)
        assert len(set(fills[n] for n in norms if math.isfinite(norms[n]))) > (2 if step == 0 else 1)   # a scale
        assert (step == 1) == any(math.isnan(v) for v in norms.values())
    assert browser.errors == []
