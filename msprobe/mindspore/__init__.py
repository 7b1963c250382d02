"""msprobe for MindSpore (PyNative; GRAPH_MODE L2 through MindSpore's kernel dump):
``PrecisionDebugger`` and ``seed_all``."""
import importlib.util

if importlib.util.find_spec("mindspore") is None:   # found without importing it
    raise ModuleNotFoundError("msprobe.mindspore needs MindSpore, which is not installed: "
                              "pip install 'msprobe-recorder[mindspore]' (or pip install -r requirements-mindspore.txt)",
                              name="mindspore")

from msprobe.mindspore.debugger import PrecisionDebugger
from msprobe.mindspore.seed import seed_all

__all__ = ["PrecisionDebugger", "seed_all"]
