"""summary_mode ``xor``: each tensor record's ``md5`` is the 64-bit XOR fold of the tensor's
C-order bytes in its own dtype, ``0x%016x``, and the record has no statistics keys (upstream
26.x's layout). Values are checked against a word-by-word computation in pure Python and
against what upstream mindstudio-probe 26.2.0 wrote for the same tensors."""
from __future__ import annotations

import json

import numpy as np
import torch
import torch.nn.functional as F

from msprobe.pytorch import PrecisionDebugger
from store import export_log
from store.entries import _tensor_record


def _xor_words(t: torch.Tensor) -> str:
    data = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    data += bytes(-len(data) % 8)
    value = 0
    for i in range(0, len(data), 8):
        value ^= int.from_bytes(data[i:i + 8], "little")
    return "0x%016x" % value


def _record(tmp_path, fn, *tensors, task="statistics", **keys):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": task, "dump_path": str(tmp_path / "d"), "level": "L1",
                               task: {"summary_mode": "xor"}, **keys}))
    dbg = PrecisionDebugger(config_path=str(cfg))
    dbg.start()
    out = fn(*tensors)
    dbg.stop()
    dbg.step()
    dbg.close()
    return json.loads((tmp_path / "d" / "step0" / "rank" / "dump.json").read_text())["data"], out


def test_xor_matches_upstream_26_2_0_values(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(4, 5)
    y = torch.arange(7, dtype=torch.int8)
    z = torch.randn(3, 3).to(torch.bfloat16)
    data, _ = _record(tmp_path, lambda a, b, c: (F.relu(a), torch.neg(b), torch.neg(c)), x, y, z)
    # written by mindstudio-probe 26.2.0 for the same script (statistics task, level L1)
    assert data["Functional.relu.0.forward"]["input_args"][0] == {
        "type": "torch.Tensor", "dtype": "torch.float32", "shape": [4, 5], "md5": "0x83af0502fe5df36a",
        "requires_grad": False}
    assert data["Functional.relu.0.forward"]["output"][0]["md5"] == "0x3c5329e241e365f3"
    assert data["Torch.neg.0.forward"]["input_args"][0]["md5"] == "0x0006050403020100"
    assert data["Torch.neg.0.forward"]["output"][0]["md5"] == "0x00fafbfcfdfeff00"
    assert data["Torch.neg.1.forward"]["input_args"][0]["md5"] == "0x001800fa80873fb0"  # bf16 bytes, not widened
    assert data["Torch.neg.1.forward"]["output"][0]["md5"] == "0x001800fa8087bfb0"


def test_xor_of_every_dtype_and_layout_equals_reference(tmp_path):
    torch.manual_seed(1)
    cases = {
        "f32 transposed": torch.randn(5, 3).t(),
        "f64": torch.randn(9, dtype=torch.float64),
        "f16 odd bytes": torch.randn(3).half(),
        "int64": torch.arange(-4, 5),
        "bool": torch.tensor([True, False, True]),
        "zero-dim": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "complex": torch.randn(4, dtype=torch.complex64),
        "grad": torch.randn(6, requires_grad=True),
    }
    data, _ = _record(tmp_path, lambda *ts: [torch.flatten(t) for t in ts], *cases.values())
    records = [data[f"Torch.flatten.{i}.forward"] for i in range(len(cases))]
    for (name, t), entry in zip(cases.items(), records):
        rec = entry["input_args"][0]
        assert rec["md5"] == _xor_words(t), name
        assert set(rec) == {"type", "dtype", "shape", "md5", "requires_grad"}, name
        assert rec["shape"] == list(t.shape) and rec["dtype"] == str(t.dtype)
        assert entry["output"][0]["md5"] == _xor_words(t), name  # flatten: the same C-order bytes
    assert records[-1]["input_args"][0]["requires_grad"] is True
    assert records[list(cases).index("empty")]["input_args"][0]["md5"] == "0x" + "0" * 16


def test_xor_offline_export_and_python_encoder_write_the_same_record(tmp_path):
    torch.manual_seed(2)
    x = torch.randn(3, 4)
    data, _ = _record(tmp_path, lambda t: torch.neg(t), x)
    live = (tmp_path / "d" / "step0" / "rank" / "dump.json").read_text()
    export_log(tmp_path / "d", tmp_path / "again")
    assert (tmp_path / "again" / "step0" / "rank" / "dump.json").read_text() == live
    # the record dict of the Python path: no statistics keys, upstream key order
    rec = _tensor_record("torch.Tensor", "torch.float32", (3, 4), None, None, None, None, False, None, None,
                         _xor_words(x), None)
    assert list(rec) == ["type", "dtype", "shape", "md5", "requires_grad"]
    assert rec == data["Torch.neg.0.forward"]["input_args"][0]


def test_xor_with_task_tensor_keeps_the_tensor_files(tmp_path):
    torch.manual_seed(3)
    x = torch.randn(2, 5)
    data, out = _record(tmp_path, lambda t: torch.neg(t), x, task="tensor")
    rec = data["Torch.neg.0.forward"]["output"][0]
    assert rec["md5"] == _xor_words(out)
    saved = torch.load(tmp_path / "d" / "step0" / "rank" / "dump_tensor_data" / rec["data_name"], weights_only=True)
    assert torch.equal(saved, out)


def test_xor_of_numpy_argument(tmp_path):
    a = np.array([[1, -7, 3], [300, 5, 9]], dtype=np.int16)  # 12 bytes: one padded word
    own = tmp_path / "ops.yaml"
    own.write_text("torch:\n  - from_numpy\n")
    data, _ = _record(tmp_path, lambda arr: torch.from_numpy(arr), a, api_list=str(own))
    rec = data["Torch.from_numpy.0.forward"]["input_args"][0]
    assert rec["type"] == "numpy.ndarray" and rec["md5"] == _xor_words(torch.from_numpy(a))
    assert "Max" not in rec
