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
