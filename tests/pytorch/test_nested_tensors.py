"""Nested tensors (torch.nested) as recorded arguments. Before: the first one (for example
inside nn.TransformerEncoder's fast path with a padding mask) stopped recording with an
internal error (NestedTensorImpl has no sizes)."""
from __future__ import annotations

import json
import warnings
import zlib

import numpy as np
import pytest
import torch
import torch.nn as nn

from pt_helpers import load_dump
from msprobe.pytorch import PrecisionDebugger


def _components(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, generator=g), torch.randn(4, 3, generator=g) * 5]


def _expected(parts):
    a = np.concatenate([p.numpy().reshape(-1).astype(np.float64) for p in parts])
    return {"Max": float(a.max()), "Min": float(a.min()), "Mean": float(a.mean()), "Norm": float(np.sqrt((a * a).sum()))}


@pytest.mark.parametrize("layout", [torch.strided, torch.jagged], ids=["strided", "jagged"])
@pytest.mark.parametrize("summary_mode", ["statistics", "md5"])
def test_nested_argument_statistics(tmp_path, layout, summary_mode):
    parts = _components()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors are a prototype: construction warns
        nt = torch.nested.nested_tensor(parts, layout=layout)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "d"), "level": "L1",
                               "statistics": {"summary_mode": summary_mode}}))
    dbg = PrecisionDebugger(config_path=str(cfg))
    dbg.start()
    torch.nn.functional.relu(nt)
    after = torch.ones(2) * 3  # recording goes on
    dbg.stop()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    rec = data["Functional.relu.0.forward"]["input_args"][0]
    assert rec["type"] == "torch.Tensor" and rec["dtype"] == "torch.float32"
    assert rec["shape"] is None  # ragged: no one shape
    exp = _expected(parts)
    assert rec["Max"] == exp["Max"] and rec["Min"] == exp["Min"]
    assert rec["Mean"] == pytest.approx(exp["Mean"], rel=1e-12)
    assert rec["Norm"] == pytest.approx(exp["Norm"], rel=1e-12)
    if summary_mode == "md5":
        raw = b"".join(p.numpy().tobytes() for p in parts)
        assert rec["md5"] == format(zlib.crc32(raw) & 0xFFFFFFFF, "08x")
    out = data["Functional.relu.0.forward"]["output"][0]
    relu_parts = [p.clamp(min=0) for p in parts]
    assert out["Max"] == _expected(relu_parts)["Max"] and out["Min"] == 0.0
    assert data["Tensor.__mul__.0.forward"]["output"][0]["Max"] == float(after.max())


def test_transformer_encoder_fast_path_with_padding_mask(tmp_path):
    """nn.TransformerEncoder in eval mode with a padding mask turns its input into a nested
    tensor internally (enable_nested_tensor): recorded at mix without stopping; the
    output equals the unrecorded run's bit for bit."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=True).eval()
    x = torch.randn(3, 5, 8)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 2 + [True] * 3])
    with torch.no_grad():
        ref = model(x, src_key_padding_mask=mask)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    dbg.start(model)
    with torch.no_grad():
        out = model(x, src_key_padding_mask=mask)
    dbg.stop()
    dbg.close()
    assert torch.equal(out, ref)
    data = load_dump(tmp_path / "d")[0]["data"]
    assert not dbg.session.failed
    # inside: the layers ran on a nested tensor (ragged: no shape) ...
    layer_out = data["Module.layers.1.TransformerEncoderLayer.forward.0"]["output"][0]
    assert layer_out["shape"] is None
    # ... whose values are the unpadded positions of the final output
    valid = torch.cat([ref[i, :n].reshape(-1) for i, n in enumerate((5, 3, 2))]).double()
    assert layer_out["Max"] == float(valid.max()) and layer_out["Min"] == float(valid.min())
    assert layer_out["Mean"] == pytest.approx(float(valid.mean()), rel=1e-9)
    padded = data["Tensor.to_padded_tensor.0.forward"]["output"][0]
    assert padded["shape"] == [3, 5, 8] and padded["Max"] == float(ref.max())


def test_nested_tensor_task_writes_no_file(tmp_path):
    parts = _components(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nt = torch.nested.nested_tensor(parts)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1", task="tensor")
    dbg.start()
    torch.nn.functional.relu(nt)
    dbg.stop()
    dbg.close()
    rec = load_dump(tmp_path / "d")[0]["data"]["Functional.relu.0.forward"]["input_args"][0]
    assert "data_name" not in rec or rec["data_name"] is None
    assert rec["Max"] == _expected(parts)["Max"]
