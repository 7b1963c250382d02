"""Views of a storage freed or shrunk with ``resize_`` (FSDP frees parameter memory so):
their data pointer is their offset, not 0, and their elements lie outside the allocation.
Recording them must give null statistics and no tensor file, never read the memory (which
crashed the process: run in a child process here, so that a crash fails the test)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

CASES = {
    "freed, view at an offset": "base = torch.randn(10); v = base[4:]; base.untyped_storage().resize_(0)",
    "shrunk below the view": "base = torch.randn(1 << 20); v = base[4:]; base.untyped_storage().resize_(64)",
    "shrunk, whole tensor": "v = torch.randn(1 << 20); v.untyped_storage().resize_(64)",
}
TASKS = {
    "statistics": {"task": "statistics", "statistics": {"summary_mode": "statistics"}},
    "md5": {"task": "statistics", "statistics": {"summary_mode": "md5"}},
    "tensor": {"task": "tensor"},
}


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_view_of_freed_storage_recorded_without_values(tmp_path, case, task):
    cfg = dict(TASKS[task], dump_path=str(tmp_path / "d"), level="L1")
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    code = textwrap.dedent(f"""
        import torch
        from msprobe.pytorch import PrecisionDebugger
        dbg = PrecisionDebugger(config_path={str(tmp_path / "c.json")!r})
        {CASES[case]}
        dbg.start()
        v.transpose(0, -1)  # a view: reads no data, recorded with v as its input
        dbg.stop()
        dbg.close()
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    data = json.loads((tmp_path / "d" / "step0" / "rank" / "dump.json").read_text())["data"]
    leaves = [entry["input_args"][0] for entry in data.values() if entry.get("input_args")]
    assert leaves, data
    for leaf in leaves:
        assert leaf["type"] == "torch.Tensor"
        assert (leaf["Max"], leaf["Min"], leaf["Mean"], leaf["Norm"]) == (None, None, None, None)
        assert "md5" not in leaf and "data_name" not in leaf


@pytest.mark.filterwarnings("ignore:.*quantize.*deprecated:UserWarning")
def test_storage_covers_counts_elements_and_bytes():
    import torch

    from msprobe.pytorch.stats import storage_covers

    x = torch.randn(4, 5)  # 80 bytes
    assert storage_covers(x, 80) and not storage_covers(x, 79)
    assert storage_covers(x[1:], 80) and not storage_covers(x[1:], 76)  # offset 5: (5 + 15) * 4
    assert storage_covers(x.t(), 80) and not storage_covers(x.t(), 79)  # strides (1, 5): 20 elements
    assert storage_covers(x[:, 1], 80) and not storage_covers(x[:, 1], 67)  # offset 1, 1 + 3 * 5: 17 * 4
    assert storage_covers(x[:1].expand(7, 5), 20)  # stride 0: 5 elements
    assert storage_covers(torch.tensor(2.0), 4) and not storage_covers(torch.tensor(2.0), 3)
    d = torch.randn(3, dtype=torch.float64)
    assert storage_covers(d, 24) and not storage_covers(d, 23)
    q = torch.quantize_per_tensor(torch.rand(3, 6), 0.1, 0, torch.quint4x2)  # 18 values in 9 bytes
    assert storage_covers(q, 9) and not storage_covers(q, 8)
