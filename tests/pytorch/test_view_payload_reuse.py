"""Task tensor, end to end: the transposed views nn.MultiheadAttention makes of a
batch-first input (recorded as the output of one call and as query, key and value of the
next): every .pt file holds the recorded tensor's values. Checked against values
captured independently by forward hooks and against float64 numpy statistics of the
file's contents."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from pt_helpers import load_dump
from msprobe.pytorch import PrecisionDebugger


def _records(value, out):
    if isinstance(value, dict):
        if value.get("type") == "torch.Tensor" and value.get("data_name"):
            out.append(value)
        else:
            for v in value.values():
                _records(v, out)
    elif isinstance(value, list):
        for v in value:
            _records(v, out)
    return out


def test_mha_batch_first_views_files_hold_recorded_values(tmp_path):
    torch.manual_seed(3)
    mha = nn.MultiheadAttention(16, 2, batch_first=True)
    x = torch.randn(3, 5, 16)
    seen = {"q": x.detach().clone()}  # MHA's input; nothing writes it
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), task="tensor", level="L1")
    dbg.start()
    out, _ = mha(x, x, x, need_weights=False)
    out.sum().backward()
    dbg.stop(); dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    tensor_dir = Path(tmp_path / "d" / "step0" / "rank" / "dump_tensor_data")
    mha_inputs = [k for k in data if k.startswith("Functional.multi_head_attention_forward.0.forward")]
    assert mha_inputs
    q, k, v = data[mha_inputs[0]]["input_args"][:3]
    # query, key and value are the same (seq, batch, embed) view of x: its values, transposed
    expected = seen["q"].transpose(0, 1).numpy()
    for rec in (q, k, v):
        loaded = torch.load(tensor_dir / rec["data_name"], weights_only=True)
        assert loaded.shape == (5, 3, 16)
        assert np.array_equal(loaded.numpy(), expected)
    records = _records(data, [])
    assert len(records) > 20
    for rec in records:  # every file against its record's statistics (float64 numpy)
        a = torch.load(tensor_dir / rec["data_name"], weights_only=True)
        if not a.is_floating_point() or a.numel() == 0:
            continue
        a64 = a.to(torch.float64).numpy()
        assert (float(a64.max()), float(a64.min())) == (rec["Max"], rec["Min"]), rec["data_name"]
        assert math.isclose(float(a64.mean()), rec["Mean"], rel_tol=1e-9, abs_tol=1e-12), rec["data_name"]
