"""compare's report.html in headless Chromium: the model graph colours the first origin as
the origin, a click shows both runs' statistics equal to their dump.json, the step
selector changes them; the error plot is in units of tolerance; under a ``--mapping`` the
page names the TARGET's original classes everywhere, once."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

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
    result = compare(gelu, base, out=d / "out", formats="summary,parquet,html")
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
                assert float(t_text) == pytest.approx(t_leaf[stat], rel=1e-6)   # 7 significant digits
                assert float(b_text) == pytest.approx(b_leaf[stat], rel=1e-6)
        # the details' SQL over tensors.parquet gives the rows shown: both runs' dump.json values
        import duckdb

        assert browser.js("document.querySelector('#details .sql-missing')") is None
        relation = duckdb.sql(browser.js("document.querySelector('#details pre.sql').textContent"))
        sql_rows = [dict(zip(relation.columns, r)) for r in relation.fetchall()]
        assert [(r["io"], str(r["arg"])) for r in sql_rows] == [("input_args", "0"), ("output", "0")]
        for r, io in zip(sql_rows, ("input_args", "output")):
            for stat in STATS:
                assert r[f"t_{stat.lower()}"] == pytest.approx(t_json[step][origin["name"]][io][0][stat], rel=1e-6)
                assert r[f"b_{stat.lower()}"] == pytest.approx(b_json[step][origin["name"]][io][0][stat], rel=1e-6)
        if step == 1:   # step 1's values differ from step 0's (the weights moved)
            assert float(rows[4][1]) != pytest.approx(t_json[0][origin["name"]]["output"][0]["Max"], rel=1e-9)
    # the plot: e in units of tolerance, a dotted line at 1, the dashed line at the origin
    assert "largest e/tol of the outputs (log scale)" in browser.js(
        "[...document.querySelectorAll('.e-plot svg text')].map(t => t.textContent)")
    assert browser.js("document.querySelectorAll('.e-plot .hline').length") == 1
    assert browser.errors == []


class _Dense(torch.nn.Linear):
    """``nn.Linear`` under the class name ``Dense`` (a MindSpore-like name), its output
    scaled by ``factor``."""

    factor = 1.0

    def forward(self, x):
        return super().forward(x) * self.factor


_Dense.__name__ = "Dense"


def _record_l0(path: Path, target: bool) -> Path:
    """Two steps of fc1 → tanh → fc2, level L0; the target's layers are ``Dense`` with fc2's
    output scaled by 1 + 1e-3, the baseline's ``Linear``."""
    from msprobe.pytorch import PrecisionDebugger

    torch.manual_seed(0)
    layer = _Dense if target else torch.nn.Linear
    net = torch.nn.Sequential()
    net.add_module("fc1", layer(8, 16))
    net.add_module("act", torch.nn.Tanh())
    net.add_module("fc2", layer(16, 4))
    if target:
        net.fc2.factor = 1 + 1e-3
    x = torch.randn(4, 8)
    config = path.parent / f"{path.name}.json"
    config.write_text(json.dumps({"task": "statistics", "dump_path": str(path), "level": "L0"}))
    debugger = PrecisionDebugger(config_path=str(config))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(2):
        debugger.start(model=net)
        net(x).pow(2).mean().backward()
        debugger.stop()
        debugger.step()
        opt.step()
        opt.zero_grad()
    debugger.close()
    return path


def test_mapped_names_are_the_targets_once_everywhere(browser, tmp_path):
    target, baseline = _record_l0(tmp_path / "dense", True), _record_l0(tmp_path / "linear", False)
    mapping = tmp_path / "map.yaml"
    mapping.write_text("layer:\n  Dense: Linear\n")
    summary = compare(target, baseline, out=tmp_path / "out", formats="summary,html", mapping=mapping).summary
    origin = summary["ranks"][0]["first_origin"]
    assert origin["name"] == "Module.fc2.Dense.forward.0" and origin["baseline_name"] == "Module.fc2.Linear.forward.0"
    browser.open(tmp_path / "out" / "report.html")
    assert browser.js("document.body.dataset.ready") == "1" and browser.errors == []
    assert browser.js("document.querySelector('.first-origin .call-name').textContent") == origin["name"]
    calls = browser.js("[...document.querySelectorAll('table.calls tr')].slice(1).map(r => r.cells[1].innerText.split('\\n'))")
    assert [origin["name"], f"baseline: {origin['baseline_name']}"] == calls[0][:2]
    assert all("Linear" not in lines[0] for lines in calls)
    tree = browser.js("[...document.querySelectorAll('.tree [data-name]')].map(e => e.dataset.name)")
    assert tree.count(origin["name"]) == 1 and all(".Dense." in n for n in tree if n.startswith("Module.fc"))
    assert browser.js("[...document.querySelectorAll('#graph .node.verdict-origin')].map(e => e.dataset.name)") == [origin["name"]]
    # without --format parquet the details say how to get the file their SQL reads
    assert browser.js("document.querySelector('#details .details-name').textContent") == origin["name"]
    assert "rerun it with --format including parquet" in browser.js("document.querySelector('#details .sql-missing').textContent")
    # the dashed line at the origin's call index
    assert browser.js("document.querySelectorAll('.e-plot line[stroke-dasharray=\"4\"]').length") == 1
    assert browser.errors == []


def page_data(html: Path) -> dict:
    text = html.read_text(encoding="utf-8")
    return json.loads(text.split("id='msprobe-data'>", 1)[1].split("</script>", 1)[0].replace("<\\/", "</"))


def test_bf16_pass_calls_stay_below_their_tolerance(tmp_path, record_run):
    """bf16 autocast against fp32: in units of each tensor's tolerance no pass call draws
    above 1, and each call's value is its largest output e/tol in compare's tensors table."""
    bf16, fp32 = record_run(tmp_path / "bf16", autocast=True, steps=2), record_run(tmp_path / "fp32", steps=2)
    summary = compare(bf16, fp32, out=tmp_path / "out", formats="summary,parquet,html").summary
    (rank,) = page_data(tmp_path / "out" / "report.html")["ranks"]
    assert rank["counts"] == summary["ranks"][0]["counts"] and rank["counts"]["propagated"] > 0
    by_verdict: dict = {}
    for _i, ratio, verdict, _name, _step, e in rank["plot"]:
        if ratio is not None:
            by_verdict.setdefault(verdict, []).append((ratio, e))
    passing, propagated = by_verdict["pass"], by_verdict["propagated"]
    assert max(r for r, _ in passing) <= 1 < max(r for r, _ in propagated)
    # each ratio is the call's largest e/tol over its output tensors (compare's own tensors table)
    import duckdb

    tensors = duckdb.sql(f"SELECT t_call, step, max(e / tol) FILTER (WHERE tol > 0 AND role = 'out') AS r "
                         f"FROM '{tmp_path / 'out' / 'tensors.parquet'}' GROUP BY ALL").fetchall()
    ratios = {(name, step): r for name, step, r in tensors}
    for _i, ratio, _verdict, name, step, _e in rank["plot"]:
        if ratio is not None:
            assert ratio == pytest.approx(ratios[(name, step)], rel=1e-12)
