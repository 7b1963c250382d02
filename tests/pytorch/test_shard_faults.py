"""Task tensor, a payload shard that cannot be written (disk full on the shard thread, in
the O_DIRECT path or the buffered one): training finishes with bit-identical results,
msprobe logs exactly one clear error and stops recording, and the steps before stay
readable (``msprobe export`` rebuilds their tensor files byte for byte)."""
from __future__ import annotations

import errno
import logging
import os

import pytest
import torch
import torch.nn as nn

import store.direct_io as dio
from store.export import export_log
from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch.payload import write_pt
from pt_helpers import train_steps

STEPS = 4


class _Disk:
    """``os`` for store.direct_io whose ``write`` fails with ENOSPC once ``full`` is set."""

    def __init__(self) -> None:
        self.full = False

    def __getattr__(self, name):
        return getattr(os, name)

    def write(self, fd, data):
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, data)


def train(dump_path=None, disk=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 1))  # 2 MiB weight: a direct shard
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dbg = PrecisionDebugger(dump_path=str(dump_path), level="L0", task="tensor") if dump_path else None

    def fill_disk(step):
        if disk is not None and step == 2:
            disk.full = True

    losses = train_steps(model, opt, dbg, STEPS, lambda: torch.randn(4, 1024), fill_disk)
    return losses + [p.detach().clone() for p in model.parameters()]


def test_shard_write_fault_logs_one_error_and_keeps_earlier_steps(tmp_path, monkeypatch, caplog):
    reference = train()
    caplog.set_level(logging.WARNING, logger="msprobe")
    disk = _Disk()
    monkeypatch.setattr(dio, "os", disk)
    real_buffered = dio.write_buffered

    def buffered(path, pieces):  # where the file system refuses O_DIRECT
        if disk.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_buffered(path, pieces)

    monkeypatch.setattr(dio, "write_buffered", buffered)
    dump = tmp_path / "d"
    got = train(dump, disk)
    assert all(torch.equal(a, b) for a, b in zip(got, reference))
    logged = [r.getMessage() for r in caplog.records if r.name == "msprobe" and r.levelno >= logging.ERROR]
    assert len(logged) == 1, logged
    assert "recording stopped" in logged[0] and "No space left on device" in logged[0] and str(dump) in logged[0]
    assert not (dump / "step3").exists()
    assert not (dump / ".msprobe" / "stage").exists()
    disk.full = False  # room again for the offline export (large .pt files go through store.direct_io too)
    out = tmp_path / "offline"
    export_log(dump, out, tensor_writers={"pytorch": write_pt})
    for step in (0, 1):
        live = dump / f"step{step}" / "rank" / "dump_tensor_data"
        names = sorted(p.name for p in live.iterdir())
        assert "Module.0.Linear.forward.0.output.0.pt" in names, names
        for name in names:
            assert (out / f"step{step}" / "rank" / "dump_tensor_data" / name).read_bytes() == (live / name).read_bytes()


@pytest.mark.parametrize("at", ["stop", "step"])
def test_shards_are_on_disk_when_stop_and_step_return(tmp_path, monkeypatch, at):
    """The shard thread is slow (a busy disk): stop() and step() still return only once the
    step's shards are written, so an offline export right after them (no close()) rebuilds
    every tensor file byte for byte."""
    import time

    from store.payload_writer import PayloadWriter

    real = PayloadWriter._write_shard

    def slow(self, index, items):
        time.sleep(0.3)
        real(self, index, items)

    monkeypatch.setattr(PayloadWriter, "_write_shard", slow)
    dump = tmp_path / "d"
    dbg = PrecisionDebugger(dump_path=str(dump), level="L1", task="tensor")
    x = torch.randn(512, 1024)
    for step in range(2):
        dbg.start()
        y = torch.relu(x)
        torch.mul(y, float(step + 2))
        dbg.stop()
        if at == "step":
            dbg.step()
        out = tmp_path / f"offline{step}"
        export_log(dump, out, tensor_writers={"pytorch": write_pt})
        live = dump / f"step{step}" / "rank" / "dump_tensor_data"
        names = sorted(p.name for p in live.iterdir())
        assert len(names) == 4, names
        for name in names:
            assert (out / f"step{step}" / "rank" / "dump_tensor_data" / name).read_bytes() == (live / name).read_bytes()
        if at == "stop":
            dbg.step()
        x = x + 1
    dbg.close()
