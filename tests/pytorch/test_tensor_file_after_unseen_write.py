"""A tensor file holds the tensor's values at the moment it was recorded, also where the
statistics memo cannot see a write (stats_memo's documented gap: a write through
``x.numpy()``, ``x.untyped_storage()``, or an operator on ``x.data`` outside the API list):
a memo hit must not reuse an earlier record's payload without looking at the memory."""
from __future__ import annotations

from pathlib import Path

import torch

from msprobe.pytorch import PrecisionDebugger


def _file(dump: Path, name: str) -> torch.Tensor:
    return torch.load(dump / "step0" / "rank" / "dump_tensor_data" / name, weights_only=True)


def test_numpy_write_between_records_reaches_tensor_file(tmp_path):
    dump = tmp_path / "dump"
    dbg = PrecisionDebugger(dump_path=str(dump), level="L1", task="tensor")
    dbg.start()
    x = torch.randn(5, 7)
    y = torch.mul(x, 2)          # y recorded (output): memo entry with its payload
    y.numpy()[0, 0] = 123.0      # a write no version counter sees
    expected = y.clone()
    torch.exp(y)                 # y recorded again (input)
    dbg.stop()
    dbg.close()
    saved = _file(dump, "Torch.exp.0.forward.input.0.pt")
    assert torch.equal(saved, expected), (saved[0, 0].item(), expected[0, 0].item())


def test_parameter_data_written_by_unlisted_operator(tmp_path):
    """A parameter recorded in forward (mix: module parameters, kept by the memo) and its
    memory written through an operator call on ``.data`` that is not intercepted
    (``torch.ops.aten``: not in the API list): the next record's file holds the new values."""
    dump = tmp_path / "dump"
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    dbg = PrecisionDebugger(dump_path=str(dump), level="mix", task="tensor")
    dbg.start(model=lin)
    lin(torch.randn(2, 4))
    torch.ops.aten.mul_.Scalar(lin.weight.data, 3.0)  # in-place on an alias with its own counter
    expected = lin.weight.detach().clone()
    torch.sum(lin.weight)
    dbg.stop()
    dbg.close()
    saved = _file(dump, "Torch.sum.0.forward.input.0.pt")
    assert torch.equal(saved, expected)
