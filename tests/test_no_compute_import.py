"""The recording process never imports pyarrow.compute (8 MB of resident memory).

Each framework records in a fresh subprocess (every task and level); the child reports
whether ``pyarrow.compute`` got imported, and the parent checks that the live files equal
what the offline export (:func:`store.export.export_log`) rebuilds from the log.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from store.export import export_log

ROOT = Path(__file__).resolve().parents[1]

# (task, level, summary_mode)
CASES = [
    ("statistics", "L1", "statistics"),
    ("statistics", "mix", "statistics"),
    ("statistics", "L0", "statistics"),
    ("statistics", "L1", "md5"),
    ("tensor", "L1", "statistics"),
    ("statistics", "debug", "statistics"),
    ("tensor", "debug", "statistics"),
]

_CONFIG = """
def config(dump, task, level, summary):
    path = dump + ".json"
    with open(path, "w") as f:
        json.dump({"task": task, "dump_path": dump, "level": level, "rank": [], "step": [],
                   "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": summary},
                   "tensor": {"scope": [], "list": [], "data_mode": ["all"], "file_format": "npy"}}, f)
    return path
"""

TORCH_CHILD = _CONFIG + """
import torch
from msprobe.pytorch import PrecisionDebugger

for i, (task, level, summary) in enumerate(CASES):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = PrecisionDebugger(config_path=config(f"{OUT}/case{i}", task, level, summary))
    x = torch.randn(5, 4)
    for _ in range(2):
        dbg.start(model)
        y = model(x)
        if level == "debug":
            PrecisionDebugger.save(y, "y")
        y.pow(2).sum().backward()
        opt.step()
        dbg.stop()
        dbg.step()
    dbg.close()
"""

MS_CHILD = _CONFIG + """
sys.path.insert(0, str(ROOT / "tests" / "mindspore"))
from ms_helpers import make_input, make_net, train_loop
from msprobe.mindspore import PrecisionDebugger

for i, (task, level, summary) in enumerate(CASES):
    if level == "debug":
        continue  # MindSpore debug saves run inside the forward: covered by the torch child
    dbg = PrecisionDebugger(config_path=config(f"{OUT}/case{i}", task, level, summary))
    train_loop(make_net(), make_input(), dbg, steps=2)
    dbg.close()
"""


def _run_child(body: str, out: Path) -> None:
    script = "import json, sys\nfrom pathlib import Path\n" + textwrap.dedent(f"""
        ROOT = Path({str(ROOT)!r})
        OUT = {str(out)!r}
        CASES = {CASES!r}
        sys.path.insert(0, str(ROOT))
    """) + body + textwrap.dedent("""
        print("COMPUTE_IMPORTED=" + json.dumps("pyarrow.compute" in sys.modules))
        print("PYARROW_IMPORTED=" + json.dumps("pyarrow" in sys.modules))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=str(ROOT), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "PYARROW_IMPORTED=true" in done.stdout  # the store was really used
    assert "COMPUTE_IMPORTED=false" in done.stdout, done.stdout


def _check_live_equals_offline(out: Path, tmp_path: Path, skip_debug: bool = False) -> int:
    """Compare every live JSON file with the offline export; returns the number compared."""
    compared = 0
    for i, (_task, level, _summary) in enumerate(CASES):
        if skip_debug and level == "debug":
            continue
        live = out / f"case{i}"
        rebuilt = tmp_path / f"offline{i}"
        export_log(live, rebuilt)
        names = ["rank/debug.json"] if level == "debug" else [
            f"step{s}/rank/{f}" for s in range(2) for f in ("dump.json", "stack.json", "construct.json")]
        for name in names:
            live_text = (live / name).read_bytes()
            assert live_text == (rebuilt / name).read_bytes(), (i, name)
            doc = json.loads(live_text)
            if name.endswith(("dump.json", "debug.json")):
                assert doc["data"], (i, name)  # something was recorded
            compared += 1
    return compared


def test_torch_recording_never_imports_pyarrow_compute(tmp_path):
    out = tmp_path / "torch"
    out.mkdir()
    _run_child(TORCH_CHILD, out)
    assert _check_live_equals_offline(out, tmp_path) == 5 * 6 + 2


@pytest.mark.skipif(importlib.util.find_spec("mindspore") is None, reason="MindSpore is not installed")
def test_mindspore_recording_never_imports_pyarrow_compute(tmp_path):
    out = tmp_path / "ms"
    out.mkdir()
    _run_child(MS_CHILD, out)
    assert _check_live_equals_offline(out, tmp_path, skip_debug=True) == 5 * 6
