"""Runs graph_train.py (a 2-step GRAPH_MODE ``TrainOneStepCell`` training) in a child
process: MindSpore's execution mode is per process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("graph_train.py")


def train_in_graph_mode(tmp: Path, name: str, config: dict, *flags: str, stderr: bool = False) -> tuple[Path, str]:
    """Train with the msprobe config ``config`` (its ``dump_path`` is ``tmp / name``) and
    graph_train.py's ``flags``; returns (dump path, the script's stdout, followed by its
    stderr when ``stderr``).

    Raises:
        AssertionError: the script failed (the end of its stderr in the message).
    """
    dump = tmp / name
    cfg = tmp / f"{name}.json"
    cfg.write_text(json.dumps({"dump_path": str(dump), **config}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(SCRIPT.parent)])}
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    res = subprocess.run([sys.executable, str(SCRIPT), str(cfg), *flags], cwd=tmp, capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return dump, res.stdout + (res.stderr if stderr else "")
