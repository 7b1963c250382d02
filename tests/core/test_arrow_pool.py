"""msprobe.core.arrow_pool: a recording process uses the system allocator for Arrow, unless
the user chose (pyarrow imported first, or ARROW_DEFAULT_MEMORY_POOL set); the variable does
not leak into the environment. Each case runs in a fresh interpreter (Arrow chooses its
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


@pytest.mark.parametrize("module", ["msprobe.pytorch"])
def test_adapter_import_chooses_it(module):
    pytest.importorskip("torch")
    assert run(f"import {module}; made = None; " + REPORT) == "system False None"
