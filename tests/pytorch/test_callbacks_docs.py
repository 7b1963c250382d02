"""The two ``python`` blocks of docs/pytorch.md's "Training frameworks: callbacks" section
(Hugging Face Trainer, Lightning) run as written, each in a fresh directory; the blocks
assert what they recorded."""
from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "pytorch.md"
SECTION = DOC.read_text(encoding="utf-8").split("## Training frameworks: callbacks", 1)[1].split("\n## ", 1)[0]
BLOCKS = re.findall(r"```python\n(.*?)```", SECTION, flags=re.DOTALL)


def test_section_has_both_examples():
    assert len(BLOCKS) == 2
    assert "MsprobeTrainerCallback(debugger)" in BLOCKS[0] and "MsprobeLightningCallback(debugger)" in BLOCKS[1]


@pytest.mark.parametrize("index,needs", [(0, ("transformers", "accelerate")), (1, ("lightning",))])
def test_doc_example_runs(tmp_path, monkeypatch, index, needs):
    for package in needs:
        pytest.importorskip(package)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    script = tmp_path / "example.py"
    script.write_text(BLOCKS[index])
    runpy.run_path(str(script), run_name="__main__")
    assert (tmp_path / ("dump_hf" if index == 0 else "dump_pl") / "step2").is_dir()
