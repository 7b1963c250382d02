"""Every ``python`` block of docs/pytorch-features.md runs as written (each in a fresh
directory; the blocks carry their own assertions)."""
from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

from msprobe.pytorch import PrecisionDebugger
from test_seed import global_state  # noqa: F401

DOC = Path(__file__).resolve().parents[2] / "docs" / "pytorch-features.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.DOTALL)


def test_doc_has_examples():
    assert len(BLOCKS) >= 6


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_example_runs(tmp_path, monkeypatch, global_state, index):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "example.py"
    script.write_text(BLOCKS[index])
    ns = runpy.run_path(str(script), run_name="__main__")
    for value in ns.values():
        if isinstance(value, PrecisionDebugger):
            value.close()
