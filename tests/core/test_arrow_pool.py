"""msprobe.core.arrow_pool: a process that writes the log uses the system allocator for
Arrow, unless the user chose (pyarrow imported first, or ARROW_DEFAULT_MEMORY_POOL set); the
variable does not leak into the environment; a training process that hands its records to
the writer process loads no pyarrow at all. Each case runs in a fresh interpreter (Arrow chooses its
default pool once per process)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    environ.update(env)
    environ["PYTHONPATH"] = str(ROOT) + os.pathsep + environ.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True)
    return out.stdout.strip()


REPORT = ("import os, pyarrow as pa; "
          "print(pa.default_memory_pool().backend_name, 'ARROW_DEFAULT_MEMORY_POOL' in os.environ, made)")


def test_recording_process_gets_the_system_pool():
    code = "from msprobe.core.arrow_pool import prefer_system_pool; made = prefer_system_pool(); " + REPORT
    assert run(code) == "system False True"


def test_user_choices_are_kept():
    code = "from msprobe.core.arrow_pool import prefer_system_pool; made = prefer_system_pool(); " + REPORT
    assert run(code, ARROW_DEFAULT_MEMORY_POOL="jemalloc") == "jemalloc True False"
    first = "import pyarrow; " + code
    default = run("import pyarrow as pa; print(pa.default_memory_pool().backend_name)")
    assert run(first) == f"{default} False False"


RECORD = """
import sys, torch
from msprobe.pytorch import PrecisionDebugger
model = torch.nn.Linear(4, 2)
dbg = PrecisionDebugger(dump_path=sys.argv[1], level="L1")
dbg.start(model); model(torch.ones(3, 4)).sum().backward(); dbg.stop(); dbg.step(); dbg.wait_files()
loaded = "pyarrow" in sys.modules
import pyarrow as pa
print(loaded, pa.default_memory_pool().backend_name if loaded else "-")
dbg.close()
"""


def test_a_recording_process_loads_no_pyarrow(tmp_path):
    """The training process hands its records to the writer process: no pyarrow there."""
    pytest.importorskip("torch")
    out = subprocess.run([sys.executable, "-c", RECORD, str(tmp_path / "d")], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "False -"


def test_logging_in_the_training_process_chooses_the_system_pool(tmp_path):
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    out = subprocess.run([sys.executable, "-c", RECORD, str(tmp_path / "d")], capture_output=True, text=True,
                         check=True, env={**env, "PYTHONPATH": str(ROOT), "MSPROBE_WRITER": "inprocess"})
    assert out.stdout.strip() == "True system"
