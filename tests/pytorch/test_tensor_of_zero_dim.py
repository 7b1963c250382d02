"""``torch.tensor`` of a list of 0-d tensors works while recording and after ``close()``:
wrapping ``Tensor.__getitem__`` leaves tensors no sequence for C code
(``msprobe.pytorch.seqslot``), and indexing is still recorded."""
from __future__ import annotations

import ctypes
import json

import torch

from msprobe.pytorch import PrecisionDebugger

_is_sequence = ctypes.pythonapi.PySequence_Check
_is_sequence.argtypes = [ctypes.py_object]


def _build():
    flags = torch.tensor([torch.tensor(False), torch.tensor(True)])
    values = torch.tensor([torch.tensor(1.5), torch.tensor(-2.0, dtype=torch.float64)])
    return flags, values


def test_tensor_of_zero_dim_tensors(tmp_path):
    ref_flags, ref_values = _build()
    for level in ("L1", "mix"):
        path = tmp_path / level
        dbg = PrecisionDebugger(dump_path=str(path), level=level, task="statistics", model=torch.nn.Identity())
        dbg.start()
        assert _is_sequence(torch.tensor(1.0)) == 0
        flags, values = _build()
        picked = values[1]
        neg = torch.logical_not(flags)
        dbg.stop()
        dbg.step()
        assert not dbg.session.failed
        dbg.close()
        assert torch.equal(flags, ref_flags) and flags.dtype == torch.bool
        assert torch.equal(values, ref_values) and values.dtype == ref_values.dtype
        assert torch.equal(neg, torch.tensor([True, False])) and float(picked) == -2.0
        data = json.loads((path / "step0" / "rank" / "dump.json").read_text())["data"]
        rec = data["Torch.logical_not.0.forward"]["input_args"][0]
        assert (rec["dtype"], rec["shape"], rec["Max"], rec["Min"]) == ("torch.bool", [2], True, False)
        item = data["Tensor.__getitem__.0.forward"]
        assert item["input_args"][0]["shape"] == [2] and item["input_args"][1] == {"type": "int", "value": 1}
        assert item["output"][0]["Max"] == -2.0 and item["output"][0]["shape"] == []
    # after close() as well
    assert _is_sequence(torch.tensor(1.0)) == 0
    assert all(torch.equal(a, b) for a, b in zip(_build(), (ref_flags, ref_values)))
