"""Recorded dumps of the report tests (session scope: recorded once per test run).

``nan_dump``: one process, 3 steps, ``torch.log(-1)`` in step 1 (``record_worker.py``).
``two_rank_dump``: two gloo ranks, 2 steps, the NaN on rank 1 in step 1; the all-reduce
carries it to rank 0. ``example_dump``: ``examples/char_lm.py --steps 3``.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("record_worker.py")
TIMEOUT_S = 300


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _record(out: Path, world: int, steps: int, nan_step: int) -> Path:
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(out), str(rank), str(world), str(steps), str(nan_step)],
                              cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(world)]
    for proc in procs:
        text, _ = proc.communicate(timeout=TIMEOUT_S)
        assert proc.returncode == 0, text[-4000:]
    return out / "dump"


@pytest.fixture(scope="session")
def nan_dump(tmp_path_factory) -> Path:
    return _record(tmp_path_factory.mktemp("nan"), 1, 3, 1)


@pytest.fixture(scope="session")
def two_rank_dump(tmp_path_factory) -> Path:
    return _record(tmp_path_factory.mktemp("ranks"), 2, 2, 1)


@pytest.fixture(scope="session")
def example_dump(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("example") / "dump_path"
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "char_lm.py"), "--steps", "3", "--dump-path", str(out)],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    return out
