"""A small training script that the crash-recovery tests kill with SIGKILL (not collected by
pytest: no ``test_`` prefix).

Usage: ``python tests/crash_child.py DUMP_PATH POINT FLUSH_ROWS``

It trains 3 steps of a small model with msprobe recording at level ``mix``. At ``POINT`` it
prints one line ``READY {json}`` on stdout and sleeps, waiting to be killed; the JSON holds
the dump.json names the recorder emitted in the current step so far. Points:

* ``after_step1``: after ``step()`` of step 1;
* ``after_stop2``: after ``stop()`` of step 2, before ``step()``;
* ``mid_forward2``: in step 2, between two module forwards;
* ``during_write2``: in step 2, inside the log file's ``write`` call, after writing half
  of the bytes handed to it (the test seam of :class:`store.log_writer.LogWriter`).

``FLUSH_ROWS`` is the writer's ``flush_rows``; the flush interval is one hour, so only the
row count and start/stop/step flush.
"""
from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import msprobe.core.session as session_module  # noqa: E402
import store.log_writer as log_writer_module  # noqa: E402
from msprobe.pytorch import PrecisionDebugger  # noqa: E402
from store.log_writer import LogWriter, _open_private  # noqa: E402


class TrapFile:
    """Delegates to a real file; once armed, the next write writes half and stalls."""

    def __init__(self, raw) -> None:
        self.raw = raw
        self.armed = False
        self.on_trap = None

    def write(self, data) -> int:
        if self.armed:
            data = bytes(data)
            self.raw.write(data[: len(data) // 2])
            self.raw.flush()
            self.on_trap()
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def tell(self) -> int:
        return self.raw.tell()

    def close(self) -> None:
        self.raw.close()

    @property
    def closed(self) -> bool:
        return self.raw.closed


def main() -> None:
    dump_path, point, flush_rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
    files: list[TrapFile] = []

    def trap_open(path: str) -> TrapFile:
        files.append(TrapFile(_open_private(path)))
        return files[-1]

    os.environ["MSPROBE_WRITER"] = "inprocess"  # the kill points are in this process's log writer
    log_writer_module.LogWriter = functools.partial(LogWriter, flush_rows=flush_rows, flush_interval_s=3600.0,
                                                 _open=trap_open)
    emitted: list[str] = []
    original_emit = session_module.Session.emit

    def emit(self, call):
        if self.open_step(call.step):
            emitted.append(call.name)
        original_emit(self, call)

    session_module.Session.emit = emit

    def ready() -> None:
        print("READY " + json.dumps(emitted), flush=True)
        time.sleep(120)
        sys.exit(3)  # not killed: the test failed to kill us

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    dbg = PrecisionDebugger(dump_path=dump_path, level="mix")
    for step in range(3):
        emitted.clear()
        x = torch.randn(5, 6)
        dbg.start(model)
        if point == "during_write2" and step == 2:
            files[-1].on_trap = ready
            files[-1].armed = True
        h = model[0](x)
        if point == "mid_forward2" and step == 2:
            ready()
        loss = model[2](model[1](h)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        dbg.stop()
        if point == "after_stop2" and step == 2:
            ready()
        dbg.step()
        if point == "after_step1" and step == 1:
            ready()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
