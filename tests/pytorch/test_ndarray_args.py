"""numpy.ndarray arguments (spec 3.3, 1.1, section 9): record with numpy's dtype name and
float64 statistics (recomputed here by hand / numpy), null statistics when empty, and with
task tensor a .pt file holding torch.tensor(ndarray)."""
from __future__ import annotations

import json
import math

import numpy as np
import torch

from pt_helpers import load_dump
from msprobe.pytorch import PrecisionDebugger


def _run(tmp_path, task, arrays):
    own = tmp_path / "ops.yaml"
    own.write_text("torch:\n  - from_numpy\n")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": task, "dump_path": str(tmp_path / "dump"), "level": "L1",
                               "api_list": str(own)}))
    dbg = PrecisionDebugger(config_path=str(cfg))
    dbg.start()
    for a in arrays:
        torch.from_numpy(a)
    dbg.stop()
    dbg.close()
    return load_dump(tmp_path / "dump")[0]


def test_ndarray_statistics(tmp_path):
    ints = np.array([0, 1, 2, 3], dtype=np.int16)
    floats = np.array([[1.5, -2.0, 0.25], [4.0, 0.0, -0.75]], dtype=np.float32)
    empty = np.zeros((0, 3), dtype=np.float64)
    data = _run(tmp_path, "statistics", [ints, floats, empty])["data"]
    assert set(data) == {"Torch.from_numpy.0.forward", "Torch.from_numpy.1.forward", "Torch.from_numpy.2.forward"}
    rec = data["Torch.from_numpy.0.forward"]["input_args"][0]
    # spec 3.3's own example: int16 [0,1,2,3] -> Max 3, Min 0, Mean 1.5, Norm sqrt(14)
    assert rec == {"type": "numpy.ndarray", "dtype": "int16", "shape": [4], "Max": 3.0, "Min": 0.0,
                   "Mean": 1.5, "Norm": math.sqrt(14.0)}
    rec = data["Torch.from_numpy.1.forward"]["input_args"][0]
    f = floats.astype(np.float64)
    assert rec == {"type": "numpy.ndarray", "dtype": "float32", "shape": [2, 3], "Max": 4.0, "Min": -2.0,
                   "Mean": float(f.sum() / 6), "Norm": float(np.sqrt((f * f).sum()))}
    # the output is the tensor sharing the array's memory
    assert data["Torch.from_numpy.1.forward"]["output"][0]["type"] == "torch.Tensor"
    rec = data["Torch.from_numpy.2.forward"]["input_args"][0]
    assert rec == {"type": "numpy.ndarray", "dtype": "float64", "shape": [0, 3],
                   "Max": None, "Min": None, "Mean": None, "Norm": None}


def test_ndarray_tensor_task_file(tmp_path):
    arr = np.array([[1, -7], [300, 5]], dtype=np.int32)
    halfs = np.array([0.1, 65504.0, -2.5], dtype=np.float16)
    dump = _run(tmp_path, "tensor", [arr, halfs])
    tdir = tmp_path / "dump" / "step0" / "rank" / "dump_tensor_data"
    for i, src in enumerate((arr, halfs)):
        rec = dump["data"][f"Torch.from_numpy.{i}.forward"]["input_args"][0]
        assert rec["type"] == "numpy.ndarray" and rec["dtype"] == str(src.dtype)
        assert rec["data_name"] == f"Torch.from_numpy.{i}.forward.input.0.pt"
        t = torch.load(tdir / rec["data_name"], weights_only=True)
        assert t.dtype == torch.tensor(src).dtype
        np.testing.assert_array_equal(t.numpy(), src)   # bit for bit, in the array's own dtype
        assert rec["Max"] == float(src.astype(np.float64).max())
