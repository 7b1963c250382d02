"""The two ``python`` blocks of docs/pytorch.md's "Training frameworks: callbacks" section
(Hugging Face Trainer, Lightning) run as written, each in a fresh directory; the blocks
assert what they recorded. README.md's block (Lightning) runs too; its recording is checked
here against the steps Lightning ran."""
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


README = DOC.parents[1] / "README.md"


def test_readme_example_runs(tmp_path, monkeypatch):
    pytest.importorskip("lightning")
    section = README.read_text(encoding="utf-8").split("### With the Hugging Face Trainer or Lightning", 1)[1]
    (block,) = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], flags=re.DOTALL)
    assert "MsprobeLightningCallback(debugger)" in block
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "example.py"
    script.write_text(block)
    runpy.run_path(str(script), run_name="__main__")
    from store.query import query

    steps = query(str(tmp_path / "dump_path"), "SELECT step, count(*) AS n FROM calls "
                  "WHERE name = 'Module.fc.Linear.forward.0' GROUP BY step ORDER BY step").to_pylist()
    assert steps == [{"step": s, "n": 1} for s in range(3)]   # 3 optimizer steps, one forward each
