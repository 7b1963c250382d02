"""Host synchronisations and MindSpore ops per recorded tensor (``benchmarks/ms_device_ops.py``
over a training step of examples/ms_char_lm.py's model): on the device path one host transfer
per step whatever the number of recorded tensors, and at most 2 ops per tensor; on the host
path (the CPU default, md5, task tensor) one ``asnumpy`` per recorded tensor."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("mindspore")

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("msprobe_ms_device_ops", ROOT / "benchmarks" / "ms_device_ops.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_device_path_syncs_once_per_step_and_stays_within_two_ops_per_tensor():
    bench = _bench()
    small, large = bench.count("statistics", "L1"), bench.count("statistics", "mix")
    assert large["tensors"] > small["tensors"] > 0
    for r in (small, large):
        assert r["flushes"] == 3, r  # stop(), step(), close()
        assert r["syncs"] == 1, r  # one asnumpy, at stop(): nothing is pending after it
        assert r["ops_per_tensor"] <= 2, r
        assert r["views_per_tensor"] == 1.0, r  # the flattening reshape
        assert r["by_op"]["mul"] + r["by_op"].get("cast", 0) >= r["tensors"], r  # one copy each
    # the per-flush reductions are a fixed cost: the extra tensors cost one copy each
    extra = sum(large["by_op"].values()) - sum(small["by_op"].values())
    assert extra == 2 * (large["tensors"] - small["tensors"]), (small, large)


@pytest.mark.parametrize("mode", ["statistics_host", "md5", "tensor"])
def test_host_path_copies_each_tensor_once(mode):
    r = _bench().count(mode, "L1")
    assert r["tensors"] > 0 and r["syncs"] == r["tensors"], r
    assert r["by_op"] == {}, r


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="mode 'xor'"):
        _bench().count("xor", "L1")
