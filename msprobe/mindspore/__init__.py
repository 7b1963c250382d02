"""msprobe for MindSpore (PyNative; GRAPH_MODE L2 through MindSpore's kernel dump):
``PrecisionDebugger`` and ``seed_all``."""
from msprobe.core.arrow_pool import prefer_system_pool

prefer_system_pool()  # before anything imports pyarrow (msprobe/core/arrow_pool.py)

from msprobe.mindspore.debugger import PrecisionDebugger
from msprobe.mindspore.seed import seed_all

__all__ = ["PrecisionDebugger", "seed_all"]
