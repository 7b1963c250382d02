"""A training script that records a few calls and then stalls (as on a collective that never
returns), for the flush-timer kill test in ``tests/test_crash_recovery.py`` (not collected by
pytest: no ``test_`` prefix).

Usage: ``python tests/stall_child.py DUMP_PATH``

It runs one forward of a small model with msprobe recording at level ``mix`` and the
log writer's default ``flush_rows`` (512) and ``flush_interval_s`` (0.5 s), so that nothing
but the flush timer can write the entries after ``start()``. Then it prints one line
``READY {json}`` on stdout and sleeps, waiting to be killed; the JSON holds the tensors of
the forward as nested lists (``x``, ``weight``, ``bias``, ``y``: the Linear's output, ``z``:
the relu's).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from msprobe.pytorch import PrecisionDebugger  # noqa: E402


def main() -> None:
    dump_path = sys.argv[1]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    dbg = PrecisionDebugger(dump_path=dump_path, level="mix")
    x = torch.randn(2, 4)
    dbg.start(model)
    with torch.no_grad():
        y = model[0](x)
        z = model[1](y)
    values = {"x": x.tolist(), "weight": model[0].weight.tolist(),
              "bias": model[0].bias.tolist(), "y": y.tolist(), "z": z.tolist()}
    print("READY " + json.dumps(values), flush=True)
    time.sleep(120)  # the stall: no further append, stop() or step()
    sys.exit(3)  # not killed: the test failed to kill us


if __name__ == "__main__":
    main()
