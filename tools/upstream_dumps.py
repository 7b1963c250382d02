"""Seeded tiny workloads recorded by whichever msprobe the running Python imports, and the
script that regenerates the committed upstream fixture dumps of
``tests/compare/data/upstream/``.

The workloads (:data:`WORKLOADS`) are a small CNN (conv2d, batch norm, ReLU, linear,
cross-entropy) and an MLP (two linear layers, tanh, MSE), each one forward and one
backward on CPU float32 from ``torch.manual_seed(0)``; :func:`record` runs one of them
under ``PrecisionDebugger`` with ``task`` statistics at a level (``L1`` or ``mix``). Only
the public API that upstream mindstudio-probe and this project share is used
(``PrecisionDebugger(config_path=...)``, ``start(model)``, ``stop()``, ``step()``), so the
same function records with ours (tests call it in-process) and with an upstream peer::

    cd /tmp && /work/wt/_peers/u122/bin/python /path/to/tools/upstream_dumps.py OUT_DIR
    # writes OUT_DIR/{cnn,mlp}_{L1,mix}/step0/... and OUT_DIR/version.txt

``--perturb`` scales the output of ``F.relu`` (CNN) / ``torch.tanh`` (MLP) by 1 + 1e-3,
installed before the debugger (so it adds no entry): a run that truly diverges there.

To refresh the fixtures: run the script under each peer into a scratch directory, then
keep only ``dump.json``, ``stack.json`` and ``construct.json`` (``--keep-json`` does it)
and copy the directories under ``tests/compare/data/upstream/{version}/``.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

WORKLOADS = ("cnn", "mlp")
LEVELS = ("L1", "mix")
#: which callable ``--perturb`` scales, per workload
PERTURBED = {"cnn": "F.relu", "mlp": "torch.tanh"}


def _models():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class CNN(nn.Module):
        """conv 1→2 (3×3) → BatchNorm2d → ReLU → flatten → linear 32→3."""

        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 3)
            self.bn = nn.BatchNorm2d(2)
            self.fc = nn.Linear(2 * 4 * 4, 3)

        def forward(self, x):
            return self.fc(torch.flatten(F.relu(self.bn(self.conv(x))), 1))

    class MLP(nn.Module):
        """linear 6→8 → tanh → linear 8→2."""

        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(6, 8)
            self.fc2 = nn.Linear(8, 2)

        def forward(self, x):
            return self.fc2(torch.tanh(self.fc1(x)))

    return CNN, MLP


def _data(workload: str):
    """(model, inputs, loss function) of ``workload``, built from ``torch.manual_seed(0)``."""
    import torch
    import torch.nn.functional as F

    CNN, MLP = _models()
    torch.manual_seed(0)
    if workload == "cnn":
        model = CNN()
        x = torch.randn(4, 1, 6, 6)
        target = torch.tensor([0, 2, 1, 2])
        return model, x, lambda out: F.cross_entropy(out, target)
    if workload == "mlp":
        model = MLP()
        x = torch.randn(5, 6)
        y = torch.randn(5, 2)
        return model, x, lambda out: F.mse_loss(out, y)
    raise ValueError(f"workload must be one of {WORKLOADS}, got {workload!r}")


def record(dump_path, workload: str, level: str, *, perturb: bool = False, summary_mode: str = "statistics"):
    """Record one forward and backward of ``workload`` at ``level`` into ``dump_path``.

    Args:
        dump_path: the debugger's ``dump_path`` (str or Path; created).
        workload: ``"cnn"`` or ``"mlp"``.
        level: ``"L1"`` or ``"mix"``.
        perturb: scale the output of :data:`PERTURBED` ``[workload]`` by 1 + 1e-3.
        summary_mode: ``"statistics"``, ``"md5"`` or ``"xor"`` (upstream 26.x and ours).
    Returns:
        the loss (float) of the recorded step.
    Raises:
        ValueError: unknown workload or level.
    """
    import torch
    import torch.nn.functional as F

    from msprobe.pytorch import PrecisionDebugger

    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    dump_path = Path(dump_path)
    dump_path.mkdir(parents=True, exist_ok=True)
    config = dump_path / "config.json"
    config.write_text(json.dumps({
        "task": "statistics", "dump_path": str(dump_path), "rank": [], "step": [], "level": level,
        "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": summary_mode}}))
    model, x, loss_fn = _data(workload)
    owner_name, attr = PERTURBED[workload].split(".")
    owner = {"F": F, "torch": torch}[owner_name]
    original = getattr(owner, attr)
    if perturb:
        setattr(owner, attr, lambda *a, **k: original(*a, **k) * (1 + 1e-3))
    try:
        debugger = PrecisionDebugger(config_path=str(config))
        debugger.start(model)
        loss = loss_fn(model(x))
        loss.backward()
        debugger.stop()
        debugger.step()
        close = getattr(debugger, "close", None)  # ours: removes every hook (upstream has none)
        if close is not None:
            close()
    finally:
        setattr(owner, attr, original)
    config.unlink()
    return float(loss.detach())


def _keep_json(root: Path) -> None:
    """Delete everything under ``root`` but dump.json, stack.json and construct.json."""
    keep = {"dump.json", "stack.json", "construct.json"}
    for p in sorted(root.rglob("*"), key=lambda q: len(q.parts), reverse=True):
        if p.is_file() and p.name not in keep:
            p.unlink()
        elif p.is_dir() and (not any(p.iterdir()) or p.name.startswith(".")):
            shutil.rmtree(p)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="output directory: OUT/{workload}_{level}[_perturbed]/")
    parser.add_argument("--workload", choices=WORKLOADS, action="append")
    parser.add_argument("--level", choices=LEVELS, action="append")
    parser.add_argument("--perturb", action="store_true")
    parser.add_argument("--summary-mode", default="statistics", choices=("statistics", "md5", "xor"))
    parser.add_argument("--keep-json", action="store_true", help="keep only dump/stack/construct.json")
    args = parser.parse_args(argv)
    out = Path(args.out)
    import msprobe

    version = getattr(msprobe, "__version__", None)
    if version is None:
        try:
            from importlib.metadata import version as dist_version
            version = dist_version("mindstudio-probe")
        except Exception:       # noqa: BLE001 - ours is not installed as a distribution
            version = "msprobe (this project)"
    combos = [(w, lv) for w in (args.workload or WORKLOADS) for lv in (args.level or LEVELS)]
    if len(combos) > 1:
        # upstream's debugger is a process-wide singleton configured once: one process per run
        import subprocess

        for workload, level in combos:
            cmd = [sys.executable, __file__, str(out), "--workload", workload, "--level", level,
                   "--summary-mode", args.summary_mode] + ["--perturb"] * args.perturb + ["--keep-json"] * args.keep_json
            subprocess.run(cmd, check=True)
        return 0
    (workload, level), = combos
    name = f"{workload}_{level}" + ("_perturbed" if args.perturb else "")
    if args.summary_mode != "statistics":
        name += f"_{args.summary_mode}"
    loss = record(out / name, workload, level, perturb=args.perturb, summary_mode=args.summary_mode)
    print(f"{name}: loss {loss!r}")
    if args.keep_json:
        _keep_json(out / name)
    (out / "version.txt").write_text(f"{version}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
