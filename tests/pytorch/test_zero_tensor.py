"""A ZeroTensor (``torch._efficientzerotensor``: autograd's known-zero gradients) has no
memory (data_ptr 0) while its storage reports bytes. Recording one must give the statistics,
CRC-32 and tensor file of its zeros, not read address 0 (that raised ValueError in the native
pass and stopped recording; a payload snapshot copied uninitialised bytes)."""
from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from pt_helpers import load_dump
from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch.stats import materialized, tensor_stats


def test_materialized_gives_zeros_and_leaves_others_alone():
    z = torch._efficientzerotensor((3, 4), dtype=torch.bfloat16)
    m = materialized(z)
    assert m.data_ptr() != 0 and m.dtype == torch.bfloat16 and m.shape == (3, 4) and not m.any()
    x = torch.ones(2)
    assert materialized(x) is x
    s = tensor_stats(z)
    assert (s.max, s.min, s.mean, s.norm) == (0.0, 0.0, 0.0, 0.0)


@pytest.mark.parametrize("task,summary", [("statistics", "statistics"), ("statistics", "md5"), ("tensor", None)])
def test_zero_tensor_recorded_as_zeros(tmp_path, task, summary):
    z = torch._efficientzerotensor((3, 4))
    config = {"task": task, "level": "L1", "dump_path": str(tmp_path / "d")}
    if summary:
        config["statistics"] = {"summary_mode": summary}
    (tmp_path / "c.json").write_text(json.dumps(config))
    dbg = PrecisionDebugger(config_path=str(tmp_path / "c.json"))
    dbg.start()
    torch.add(z, 1.5)
    torch.mul(z, 2.0)  # recorded again: the payload window must not compare address 0
    after = torch.ones(2) * 3  # recording goes on after the ZeroTensor
    dbg.stop(); dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    rec = data["Torch.add.0.forward"]["input_args"][0]
    assert (rec["Max"], rec["Min"], rec["Mean"], rec["Norm"]) == (0.0, 0.0, 0.0, 0.0)
    assert data["Torch.add.0.forward"]["output"][0]["Max"] == 1.5
    assert "Tensor.__mul__.0.forward" in data and after.sum().item() == 6.0
    if summary == "md5":
        assert rec["md5"] == format(zlib.crc32(bytes(48)), "08x")
    if task == "tensor":
        for name in ("Torch.add.0.forward", "Torch.mul.0.forward"):
            leaf = data[name]["input_args"][0]
            loaded = torch.load(Path(tmp_path / "d" / "step0" / "rank" / "dump_tensor_data") / leaf["data_name"],
                                weights_only=True)
            assert np.array_equal(loaded.numpy(), np.zeros((3, 4), np.float32))
