"""msprobe for PyTorch: ``PrecisionDebugger`` and ``seed_all``."""
from msprobe.pytorch.debugger import PrecisionDebugger

__all__ = ["PrecisionDebugger"]
