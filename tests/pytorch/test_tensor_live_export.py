"""Live export of task tensor with staged files and the fast .pt writer: the files in
dump_tensor_data are byte-identical to those `msprobe export` rebuilds from the log, hold
the recorded values bit for bit (a tensor changed in place between two recordings
included), duplicates are hard links, and nothing is left in the staging directory."""
from __future__ import annotations

import ctypes
import os

import torch

from msprobe.cli import main as cli_main
from msprobe.pytorch import PrecisionDebugger
from store.payload_writer import stage_dir


def raw(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()) if t.numel() else b""


def test_live_files_equal_offline_export_and_recorded_values(tmp_path):
    dump = tmp_path / "dump"
    dbg = PrecisionDebugger(dump_path=str(dump), level="L1", task="tensor")
    x = torch.randn(64, 32)
    w = torch.randn(16, 32).to(torch.bfloat16)
    expected = {}
    for step in range(2):
        dbg.start()
        y = torch.relu(x)          # y then feeds two more calls: one payload, hard links
        z = torch.mul(y, 2.0)
        s = torch.add(y, z)
        expected[step] = {"Torch.relu.0.forward.input.0.pt": raw(x), "Torch.relu.0.forward.output.0.pt": raw(y),
                          "Torch.mul.0.forward.input.0.pt": raw(y), "Torch.mul.0.forward.output.0.pt": raw(z),
                          "Torch.add.0.forward.input.1.pt": raw(z), "Torch.add.0.forward.output.0.pt": raw(s)}
        before = raw(w)
        w.mul_(3)                  # same tensor, new values: recorded before and after
        expected[step]["Tensor.mul_.0.forward.input.0.pt"] = before
        expected[step]["Tensor.mul_.0.forward.output.0.pt"] = raw(w)
        dbg.stop()
        dbg.step()
        x.add_(1)
    dbg.close()
    assert not stage_dir(dump).exists() or list(stage_dir(dump).iterdir()) == []
    out = tmp_path / "offline"
    assert cli_main(["export", str(dump), "-o", str(out)]) == 0
    for step in range(2):
        live = dump / f"step{step}" / "rank" / "dump_tensor_data"
        offline = out / f"step{step}" / "rank" / "dump_tensor_data"
        names = sorted(p.name for p in live.iterdir())
        assert names == sorted(p.name for p in offline.iterdir())
        for name in names:
            assert (live / name).read_bytes() == (offline / name).read_bytes(), name
        for name, data in expected[step].items():
            got = torch.load(live / name, weights_only=True)
            assert raw(got) == data, (step, name)
        assert os.path.samefile(live / "Torch.relu.0.forward.output.0.pt", live / "Torch.mul.0.forward.input.0.pt")
        assert torch.load(live / "Tensor.mul_.0.forward.input.0.pt", weights_only=True).dtype == torch.bfloat16
