"""The report of many ranks: rank x step aggregates for every rank, detail for at most
``max_ranks`` (ranks holding NaN/Inf first), so the page does not grow with per-rank
detail beyond that."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from msprobe.report import write_report
from msprobe.report.data import collect
from store.compact import compact
from store.log_writer import LogWriter
from store.records import Call, Leaf, Marker

sys.path.insert(0, str(Path(__file__).parent))
from chromium_page import browser_or_skip  # noqa: E402

STEPS = 3
NAN_AT = (5, 1)          # (rank, step) whose fc output holds NaN
LAYERS = ("fc1", "fc2")


def _tensor(io, path, norm, nan=False):
    return Leaf(io=io, path=path, leaf_kind="tensor", type="torch.Tensor", dtype="torch.float32", shape=(4,),
                numel=4, max=norm, min=-norm, mean=0.0, norm=math.nan if nan else norm, requires_grad=True,
                has_nan=nan, has_inf=False)


def _run(root: Path, ranks: int) -> Path:
    """Per rank and step: two Linear modules (forward: input, weight, output; then the
    weight gradient), rank 5's fc2 output NaN in step 1."""
    for rank in range(ranks):
        meta = {"task": "statistics", "level": "L0", "framework": "pytorch", "dump_data_dir": None,
                "rank_dir": f"rank{rank}", "world_size": ranks}
        with LogWriter(root, rank, flush_rows=16, flush_interval_s=3600) as writer:
            writer.append_marker(Marker(step=0, kind="start", meta=meta))
            for step in range(STEPS):
                for i, layer in enumerate(LAYERS):
                    nan = (rank, step) == NAN_AT and layer == "fc2"
                    writer.append(Call(step=step, kind="module_forward", name=f"Module.{layer}.Linear.forward.0",
                                       api_type="Module", keys=("input_args", "input_kwargs", "output", "parameters"),
                                       leaves=(_tensor("input_args", (0,), 1.0 + i),
                                               _tensor("parameters", ("weight",), 2.0 + i),
                                               _tensor("output", (0,), 3.0 + i, nan=nan))))
                for layer in LAYERS:
                    writer.append(Call(step=step, kind="parameters_grad", name=f"Module.{layer}.Linear.parameters_grad",
                                       api_type="Module", keys=("weight",),
                                       leaves=(_tensor("weight", (), 0.5 + step),)))
                writer.append_marker(Marker(step=step, kind="step_end", meta=meta))
    return root


@pytest.mark.parametrize("compacted", [False, True])
def test_aggregates_for_every_rank_and_detail_for_the_nan_rank_first(tmp_path, compacted):
    dump = _run(tmp_path / "d", 8)
    if compacted:
        compact(dump)
    data = collect(dump, max_ranks=3)
    assert data["ranks"] == list(range(8))
    # the NaN rank, then the lowest ranks
    assert data["detail_ranks"] == [0, 1, 5] and sorted(data["per_rank"], key=int) == ["0", "1", "5"]
    assert data["per_rank"]["5"]["nonfinite"]["origin"]["name"] == "Module.fc2.Linear.forward.0"
    # per rank and step: 4 entries (2 forwards, 2 gradients) and 8 tensors (3 + 3 + 1 + 1)
    assert data["per_step"] == [{"rank": r, "step": s, "entries": 4, "tensors": 8}
                                for r in range(8) for s in range(STEPS)]
    assert data["nonfinite"] == [{"rank": 5, "step": 1, "nan_tensors": 1, "inf_tensors": 0,
                                  "first_nan_name": "Module.fc2.Linear.forward.0", "first_nan_step": 1}]
    assert data["limits"]["max_ranks"] == 3


def test_page_grows_by_the_overview_only_past_max_ranks(tmp_path):
    sizes = {}
    for ranks in (6, 24):
        dump = _run(tmp_path / f"d{ranks}", ranks)
        for most in (3, 24):
            sizes[ranks, most] = write_report(dump, tmp_path / f"r{ranks}-{most}.html", max_ranks=most).stat().st_size
    bounded = (sizes[24, 3] - sizes[6, 3]) / 18
    detailed = (sizes[24, 24] - sizes[6, 24]) / 18
    # an added rank without detail adds its per-step counts (3 rows) only
    assert 0 < bounded < 400 and detailed > 5 * bounded, sizes


def test_page_lists_ranks_without_detail(tmp_path):
    dump = _run(tmp_path / "d", 8)
    page = write_report(dump, tmp_path / "r.html", max_ranks=3)
    browser = browser_or_skip()
    try:
        browser.open(page)
        assert browser.js("document.body.dataset.ready") == "1" and browser.errors == []
        options = browser.js("[...document.getElementById('rank').options].map(o => o.value)")
        assert options == ["0", "1", "5"]
        assert browser.js("document.getElementById('no-nan-ranks').textContent") == \
            "ranks 2-4, 6-7: no NaN or Inf recorded"
        assert "for 3 of 8 ranks: 0-1, 5" in browser.js("document.getElementById('detail-ranks').textContent")
        assert browser.js("document.querySelector('#first-nan-5 .origin-name').textContent") == \
            "Module.fc2.Linear.forward.0"
    finally:
        browser.close()


def test_norm_jumps_by_batches_of_ranks_equal_one_batch(tmp_path):
    from msprobe.report.data import _largest
    from store.query import connect

    dump = _run(tmp_path / "d", 8)
    con = connect(dump)
    tensors = {r: 8 * STEPS for r in range(8)}
    one = _largest(con, 1.0, 1.2, 5, list(range(8)), tensors, batch_rows=10 ** 9)
    alone = _largest(con, 1.0, 1.2, 5, list(range(8)), tensors, batch_rows=8 * STEPS)   # a rank per batch
    assert one == alone
    # per rank the weight gradients' Norm goes 0.5 -> 1.5 -> 2.5 (both layers alike: one
    # row each); the five largest are the x3 jumps of ranks 0-4
    assert [(j["rank"], j["previous_step"], j["step"], j["ratio"]) for j in one["jumps"]] == \
        [(r, 0, 1, 3.0) for r in range(5)]
    assert one["jumps"][0]["name"] == "Module.fc1.Linear.parameters_grad"
    assert one["jumps"][0]["seen_in"] == ["Module.fc2.Linear.parameters_grad"]
