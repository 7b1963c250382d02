"""``msprobe report`` pages rendered in headless Chromium (DevTools protocol): no console
errors, one heat-map cell drawn per recorded (step, module), the first-NaN text names the
right entry, the rank selector redraws, the module tree expands and filters."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from msprobe.cli import main
from msprobe.report import write_report

sys.path.insert(0, str(Path(__file__).parent))
from chromium_page import browser_or_skip  # noqa: E402
from test_report_data import dump_jsons, expected_grad_norms, expected_output_norms  # noqa: E402


@pytest.fixture(scope="module")
def browser():
    b = browser_or_skip()
    yield b
    b.close()


def rendered(browser, dump: Path, tmp_path: Path):
    page = write_report(dump, tmp_path / "report.html")
    browser.open(page)
    assert browser.js("document.body.dataset.ready") == "1", browser.errors
    return page


def cells(browser, which: str) -> int:
    return int(browser.js(f"document.querySelector('#heat-{which} canvas').dataset.cells"))


def hover_cell(browser, which: str, row: int, column: int) -> str:
    """Move the mouse (a real input event) to the centre of a heat-map cell; returns the
    tooltip's text."""
    canvas = f"document.querySelector('#heat-{which} canvas')"
    browser.js(f"{canvas}.scrollIntoView({{block: 'center'}})")
    x, y = browser.js(f"""(() => {{ const c = {canvas}, b = c.getBoundingClientRect();
        const [left, top, w, h] = c.dataset.grid.split(',').map(Number);
        return [b.left + left + ({column} + 0.5) * w, b.top + top + ({row} + 0.5) * h]; }})()""")
    browser.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
    assert browser.js("document.getElementById('tooltip').style.display") == "block"
    return browser.js("document.getElementById('tooltip').textContent")


def test_nan_dump_page(browser, nan_dump, tmp_path):
    rendered(browser, nan_dump, tmp_path)
    assert browser.errors == []
    by_step = dump_jsons(nan_dump, "rank")
    assert cells(browser, "output") == len(expected_output_norms(by_step)) == 9
    assert cells(browser, "grad") == len(expected_grad_norms(by_step)) == 6
    assert browser.js("document.querySelector('#first-nan-0 .origin-name').textContent") == "Torch.log.0.forward"
    text = browser.js("document.querySelector('#first-nan-0').innerText")
    assert "step 1, api_forward" in text and "record_worker.py" not in text   # the stack starts collapsed
    browser.js("document.querySelector('#first-nan-0 details summary').click()")
    assert "torch.log" in browser.js("document.querySelector('#first-nan-0').innerText")
    assert browser.js("document.querySelector('#summary').textContent").startswith("1 rank (0), 3 steps (0–2)")
    # hover: the cell's module, step and value (4 significant digits); rows in execution order
    lines = hover_cell(browser, "output", 0, 0).split("\n")
    assert lines[:2] == ["module: Module.fc1.Linear", "step 0"] and lines[2].startswith("output Norm: ")
    assert float(lines[2].split(": ")[1]) == pytest.approx(expected_output_norms(by_step)[("Module.fc1.Linear", 0)],
                                                           rel=1e-3)
    # step 1's update wrote NaN into the weights: fc1's output of step 2 is NaN
    assert hover_cell(browser, "output", 0, 2).split("\n")[2] == "output Norm: NaN"
    # the NaN of step 1 reaches every parameter gradient of that step, none of step 0
    for row in (0, 1):
        assert hover_cell(browser, "grad", row, 1).split("\n")[2] == "gradient Norm: NaN"
        assert float(hover_cell(browser, "grad", row, 0).split("\n")[2].split(": ")[1]) > 0
    assert browser.errors == []


def test_two_rank_page_redraws_per_rank(browser, two_rank_dump, tmp_path):
    rendered(browser, two_rank_dump, tmp_path)
    assert browser.errors == []
    origin = "document.querySelector('#first-nan-{}  .origin-name').textContent"
    assert browser.js(origin.format(1)) == "Torch.log.0.forward"
    assert browser.js(origin.format(0)).startswith("Distributed.all_reduce.")
    for rank, rank_dir in ((0, "rank0"), (1, "rank1")):
        browser.js(f"(() => {{ const s = document.getElementById('rank'); s.value = '{rank}';"
                   f" s.dispatchEvent(new Event('change')); }})()")
        assert cells(browser, "output") == len(expected_output_norms(dump_jsons(two_rank_dump, rank_dir)))
    assert browser.errors == []


def test_example_page_tree_expands_and_filters(browser, example_dump, tmp_path):
    rendered(browser, example_dump, tmp_path)
    assert browser.errors == []
    construct = json.loads((example_dump / "step0" / "rank" / "construct.json").read_text())
    modules = {n[: n.rindex(".forward.")] for n in construct if n.startswith("Module.") and ".forward." in n}
    assert int(browser.js("document.querySelector('#heat-output canvas').dataset.rows")) == len(modules)
    assert cells(browser, "output") == len(modules) * 3
    # the example's only non-finite values are its causal mask: no origin, the mask named
    assert browser.js("document.querySelector('#first-nan-0 .origin-name')") is None
    assert browser.js("document.querySelector('#first-nan-0 .first-tensor').textContent") == "Torch.triu.0.forward"
    layer = "Module.layers.0.self_attn.MultiheadAttention.forward.0"
    sel = f"document.querySelector('.tree details[data-name=\"{layer}\"]')"
    child = f"{sel}.querySelector(':scope > .leaf')"
    assert browser.js(f"{sel}.open") is False
    assert browser.js(f"{child}.checkVisibility()") is False
    browser.js(f"{sel}.querySelector('summary').click()")
    assert browser.js(f"{sel}.open") is True
    assert browser.js(f"{child}.checkVisibility()") is True
    browser.js("(() => { const s = document.getElementById('tree-search'); s.value = 'linear2';"
               " s.dispatchEvent(new Event('input')); })()")
    shown = browser.js("[...document.querySelectorAll('.tree .hit')].filter(e => e.checkVisibility())"
                       ".map(e => e.dataset.name)")
    assert shown and all("linear2" in name.lower() for name in shown)
    assert {n for n in construct if "linear2" in n.lower() and ".forward" in n} == set(shown)
    # runs of more than 5 top-level API calls (the loss, the optimizer's updates) sit in
    # collapsed groups; construct.json lists the entries in execution order
    browser.js("(() => { const s = document.getElementById('tree-search'); s.value = '';"
               " s.dispatchEvent(new Event('input')); })()")
    forward = [n for n in construct if ".forward" in n]
    runs, run = [], []
    for name in (n for n in forward if construct[n] is None):
        if name.startswith("Module."):
            runs, run = runs + [run], []
        else:
            run.append(name)
    runs = [r for r in runs + [run] if len(r) > 5]
    assert len(runs) == 1 and len(runs[0]) > 100 and runs[0][-1].startswith("Tensor.")   # AdamW's ops
    assert int(browser.js("document.querySelector('.tree').dataset.nodes")) == len(forward)
    groups = "[...document.querySelectorAll('.tree > details.group')]"
    assert browser.js(f"{groups}.map(g => [g.open, [...g.querySelectorAll(':scope > .leaf')].map(e => e.dataset.name)])"
                      ) == [[False, runs[0]]]
    assert browser.js(f"{groups}[0].querySelector('summary').textContent").startswith(
        f"{len(runs[0])} API calls outside any module ({runs[0][0]} … ")
    assert browser.errors == []


def test_cli_writes_the_page(example_dump, tmp_path, capsys):
    out = tmp_path / "r" / "page.html"
    assert main(["report", str(example_dump), "-o", str(out), "--max-rows", "5"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    text = out.read_text()
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text
    assert '"rows_total":21' in text   # 21 modules, 5 drawn: the page says it is sampled
    assert main(["report", str(tmp_path / "nowhere"), "-o", str(out)]) == 2
    assert main(["report", str(example_dump), "-o", str(out), "--max-steps", "0"]) == 2
    assert "max_steps: expected an integer >= 1, got 0" in capsys.readouterr().err
