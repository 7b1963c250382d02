"""msprobe for PyTorch: ``PrecisionDebugger``, ``module_dump``/``module_dump_end`` and
``seed_all``. Importing this package changes no framework behaviour: hooks are installed by
``PrecisionDebugger.start()`` and ``module_dump()``, seeds and dropout by ``seed_all()``."""
import importlib.util

if importlib.util.find_spec("torch") is None:   # found without importing it
    raise ModuleNotFoundError("msprobe.pytorch needs PyTorch, which is not installed: "
                              "pip install 'msprobe-recorder[torch]' (or pip install torch)", name="torch")

from msprobe.pytorch.debugger import PrecisionDebugger, module_dump, module_dump_end
from msprobe.pytorch.seed import seed_all

__all__ = ["PrecisionDebugger", "module_dump", "module_dump_end", "seed_all"]
