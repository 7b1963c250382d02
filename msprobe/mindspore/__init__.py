"""msprobe for MindSpore (PyNative; GRAPH_MODE L2 through MindSpore's kernel dump):
``PrecisionDebugger`` and ``seed_all``."""
from msprobe.mindspore.debugger import PrecisionDebugger
from msprobe.mindspore.seed import seed_all

__all__ = ["PrecisionDebugger", "seed_all"]
