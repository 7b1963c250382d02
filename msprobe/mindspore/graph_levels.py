"""Which levels msprobe records in MindSpore's GRAPH_MODE, and the errors for the others.

In GRAPH_MODE the network runs as one compiled graph: API calls are graph nodes, not Python
calls, and a hook registered with ``Cell.register_forward_hook`` is compiled into the graph
like ``construct``: with MindSpore 2.10 its tensor operations run (a hook returning
``output + 100`` changes the Cell's output), while a Python function it calls to append the
output to a list does not run when the graph executes.

What GRAPH_MODE records:

* level L2 (every backend): MindSpore's kernel dump (:mod:`msprobe.mindspore.graph_dump`);
* level L0 on the CPU backend: Cell records through ``ops.Custom(..., func_type="pyfunc")``
  identities in each Cell's forward hook, whose Python functions MindSpore runs at every
  execution (:mod:`msprobe.mindspore.graph_cells`; pyfunc kernels exist on CPU only).

On GPU/Ascend, Cell-level records inside a graph would need MindSpore's ``TensorDump`` op
(``DumpGradient``, for gradients, is lowered to it) in each Cell's hook; msprobe does not
build that route. :func:`tensor_dump_missing` asks MindSpore whether a backend has the op by
compiling a one-op graph in a child process (the CPU backend of MindSpore 2.10 fails kernel
selection with "Unsupported op [TensorDump] on CPU"), and :func:`check_graph_mode_level`
names it in the :class:`ConfigError` for L0 there. Level ``mix`` adds API calls, which a
graph does not make as Python calls: a ConfigError on every backend (L0 records the Cells).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Optional

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn, ops

from msprobe.core.errors import ConfigError

__all__ = ["GRAPH_LEVELS", "graph_levels", "tensor_dump_missing", "check_graph_mode_level", "CELL_APIS",
           "missing_cell_apis"]

#: levels msprobe records in GRAPH_MODE on every backend
GRAPH_LEVELS = ("L2",)
#: backends on which level L0 records Cells in GRAPH_MODE (pyfunc ops, graph_cells)
CELL_BACKENDS = ("CPU",)


def graph_levels(device_target: str) -> tuple[str, ...]:
    """The levels msprobe records in GRAPH_MODE on ``device_target`` (``"CPU"``, ``"GPU"``,
    ``"Ascend"``): ``("L0", "L2")`` on CPU, ``("L2",)`` elsewhere."""
    return ("L0",) + GRAPH_LEVELS if device_target in CELL_BACKENDS else GRAPH_LEVELS
#: the MindSpore APIs (private ones of MindSpore 2.10 included) that level L0 in GRAPH_MODE
#: uses (msprobe.mindspore.graph_cells): (module, attribute path)
CELL_APIS = (("mindspore.graph.api", "_pynative_executor"),
             ("mindspore.graph.api", "_set_parameter_forward_hook_enabled"),
             ("mindspore.common.parameter", "Parameter._register_forward_hook"),
             ("mindspore.nn", "Cell.register_forward_hook"),
             ("mindspore.ops", "Custom"))


def missing_cell_apis() -> list[str]:
    """The entries of :data:`CELL_APIS` this MindSpore lacks, as ``module.attribute`` names."""
    import importlib

    missing = []
    for module, path in CELL_APIS:
        try:
            obj = importlib.import_module(module)
            for part in path.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            missing.append(f"{module}.{path}")
    return missing


_PYNATIVE = "mindspore.set_context(mode=mindspore.PYNATIVE_MODE)"
_MARK = "msprobe-tensordump-probe:"
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds msprobe/


class _TensorDumpProbe(nn.Cell):
    """A graph holding one ``TensorDump`` (compiled by :func:`tensor_dump_missing`)."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        self.dump = ops.TensorDump()

    def construct(self, x):
        self.dump(self.prefix, x)
        return x


def _probe() -> Optional[str]:
    """Compile and run the one-op TensorDump graph in this process (GRAPH_MODE)."""
    with tempfile.TemporaryDirectory(prefix="msprobe_tensordump_") as tmp:
        try:
            _TensorDumpProbe(f"{tmp}/probe")(Tensor(np.zeros((1,), np.float32))).asnumpy()
        except (RuntimeError, TypeError, ValueError) as exc:
            text = str(exc)
            lines = [line.strip().split(", Please")[0] for line in text.splitlines() if "TensorDump" in line]
            return lines[0] if lines else text.strip() or type(exc).__name__
    return None


def tensor_dump_missing(device_target: str) -> Optional[str]:
    """None when MindSpore runs a ``TensorDump`` op in GRAPH_MODE on ``device_target``,
    else MindSpore's error message (its first line naming the op).

    The probe runs in a child Python process: compiling any graph in this process would
    make MindSpore read ``MINDSPORE_DUMP_CONFIG`` before a later level-L2 debugger sets it.

    Raises:
        RuntimeError: the child process failed in another way (its stderr's tail).
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([_ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    res = subprocess.run([sys.executable, "-m", __name__, device_target], capture_output=True, text=True, env=env,
                         timeout=600)
    lines = [line for line in res.stdout.splitlines() if line.startswith(_MARK)]
    if res.returncode != 0 or not lines:
        raise RuntimeError(f"TensorDump probe failed (exit {res.returncode}): {res.stderr[-1000:]}")
    return json.loads(lines[-1][len(_MARK):])


def check_graph_mode_level(level: str, device_target: Optional[str] = None) -> None:
    """Raise the ConfigError for a level msprobe does not record in GRAPH_MODE.

    Args:
        level: the config's level.
        device_target: the backend (default: ``mindspore.get_context("device_target")``).
    Raises:
        ConfigError: ``L0`` on a backend other than CPU, naming the missing ``TensorDump``
            op where the backend lacks it, or saying Cell-level graph records are not
            implemented there where it has it; ``mix`` (API calls are not Python calls in a
            graph; L0 on CPU); ``L1``/``debug`` (no Python calls inside a graph); ``L0`` on
            CPU when this MindSpore lacks an API of :data:`CELL_APIS` (naming the version and
            the API). Nothing for ``L2``, nor for ``L0`` on CPU with those APIs.
    """
    device = device_target or ms.get_context("device_target")
    allowed = graph_levels(device)
    if level == "L0" and level in allowed:
        missing = missing_cell_apis()
        if missing:
            raise ConfigError("level", level, [x for x in allowed if x != "L0"],
                              detail=f"level L0 in GRAPH_MODE on {device} uses MindSpore APIs that MindSpore "
                                     f"{ms.__version__} lacks ({', '.join(missing)}; present in MindSpore 2.10); use "
                                     f"level L2 (kernels) in GRAPH_MODE, or {_PYNATIVE} for level L0")
    if level in allowed:
        return
    if level == "L0":
        missing = tensor_dump_missing(device)
        if missing is not None:
            detail = (f"Cell-level records in GRAPH_MODE on {device} need MindSpore's TensorDump op, which the "
                      f"{device} backend lacks ({missing}); use level L2 (kernels) in GRAPH_MODE, or {_PYNATIVE} "
                      f"for level {level}")
        else:
            detail = (f"Cell-level records in GRAPH_MODE on {device} (TensorDump in each Cell) are not implemented "
                      f"by msprobe (on CPU they are recorded through pyfunc ops); use level L2 (kernels) in "
                      f"GRAPH_MODE, or {_PYNATIVE} for level {level}")
    elif level == "mix":
        cells = "level L0 for the Cells (CPU), " if "L0" in allowed else ""
        detail = (f"level mix adds API calls, and in GRAPH_MODE the network runs as one compiled graph with no "
                  f"Python calls; use {cells}level L2 (kernels) in GRAPH_MODE, or {_PYNATIVE} for level mix")
    else:
        detail = (f"level {level} records Python calls, and in GRAPH_MODE the network runs as one compiled graph; "
                  f"use level L2 (kernels) in GRAPH_MODE, or {_PYNATIVE} for level {level}")
    raise ConfigError("level", level, allowed, detail=detail)


if __name__ == "__main__":   # the child of tensor_dump_missing: python -m msprobe.mindspore.graph_levels DEVICE
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device(sys.argv[1])
    print(_MARK + json.dumps(_probe()), flush=True)
