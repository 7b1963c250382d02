"""``seed_all``: fix every source of randomness the seeds' table lists (seeds "seed_all";
spec section 6.1 with section 9 fix 25).

Effects of ``seed_all(seed, mode, rm_dropout)``:

==========================================  ============================================
``os.environ["PYTHONHASHSEED"] = str(seed)``  hash seed of Python subprocesses
``os.environ["HCCL_DETERMINISTIC"]``          ``"True"``/``"False"`` (= ``str(mode)``)
``random.seed(seed)``                         Python's random
``numpy.random.seed(seed)``                   numpy's global generator
``torch.manual_seed(seed)``                   CPU (and every device's default generator)
``torch.cuda.manual_seed_all(seed)``          CUDA, when CUDA is available
``torch.npu.manual_seed_all(seed)``           NPU, when ``torch_npu`` is importable
``torch.use_deterministic_algorithms(True)``  only with ``mode=True``; also sets
                                              ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` on CUDA
``torch.backends.cudnn.enabled = False``      cuDNN off (the seeds' ``cudnn.enable``)
``torch.backends.cudnn.benchmark = False``    deterministic algorithm choice
``torch.backends.cudnn.deterministic = True`` deterministic convolutions only
rm_dropout=True                               ``F.dropout``, ``F.dropout2d``,
                                              ``F.dropout3d`` run with ``p=0``; ``nn.Dropout``,
                                              ``nn.Dropout2d``, ``nn.Dropout3d`` created after
                                              the call get ``p=0``
==========================================  ============================================

Importing msprobe changes none of these; only calling ``seed_all`` does.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import os
import random
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from msprobe.core.errors import ConfigError

logger = logging.getLogger("msprobe")

MAX_SEED = 2**32 - 1
DROPOUT_FUNCTIONS = ("dropout", "dropout2d", "dropout3d")
DROPOUT_MODULES = (nn.Dropout, nn.Dropout2d, nn.Dropout3d)


def seed_all(seed: int = 1234, mode: bool = False, rm_dropout: bool = True) -> None:
    """Fix the random seeds and, optionally, deterministic computation and dropout.

    Args:
        seed: the seed, an int in ``[0, 2**32 - 1]``.
        mode: True: deterministic algorithms only (slower; use when runs differ).
        rm_dropout: True: dropout probability forced to 0 (see the module docstring).

    Raises:
        ConfigError: a value of the wrong type or out of range, before anything changes.

    Example: after ``seed_all(7)``, ``torch.rand(1)`` equals ``torch.rand(1)`` after
    ``torch.manual_seed(7)``, and ``F.dropout(x, 0.5)`` returns ``x`` unchanged.
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise ConfigError("seed", seed, f"an int in [0, {MAX_SEED}]")
    if not isinstance(mode, bool):
        raise ConfigError("mode", mode, "True, False")
    if not isinstance(rm_dropout, bool):
        raise ConfigError("rm_dropout", rm_dropout, "True, False")
    os.environ["PYTHONHASHSEED"] = str(seed)
    os.environ["HCCL_DETERMINISTIC"] = str(mode)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed(seed)
        torch.cuda.manual_seed_all(seed)
    npu = _npu_module()
    if npu is not None:
        try:
            npu.manual_seed(seed)
            npu.manual_seed_all(seed)
        except Exception as exc:  # an NPU runtime problem must not stop the script
            logger.warning("msprobe: seeding the NPU failed: %s", exc)
    if mode:
        if torch.version.cuda is not None:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.enabled = False
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    if rm_dropout:
        remove_dropout()


def _npu_module() -> Any:
    """``torch.npu`` when ``torch_npu`` is importable (importing it registers ``torch.npu``)."""
    if getattr(torch, "npu", None) is None:
        if importlib.util.find_spec("torch_npu") is None:
            return None
        try:
            import torch_npu  # noqa: F401  (registers torch.npu)
        except Exception as exc:
            logger.warning("msprobe: torch_npu is installed but cannot be imported: %s", exc)
            return None
    return getattr(torch, "npu", None)


def _zero_p_function(original: Any) -> Any:
    @functools.wraps(original)
    def dropout(input, p=0.5, training=True, inplace=False):
        return original(input, 0.0, training, inplace)

    dropout.__msprobe_rm_dropout__ = original
    return dropout


def _zero_p_init(original: Any, inherited: bool) -> Any:
    @functools.wraps(original)
    def __init__(self, p=0.5, inplace=False):
        original(self, 0.0, inplace)

    __init__.__msprobe_rm_dropout__ = original
    __init__.__msprobe_inherited__ = inherited
    return __init__


def remove_dropout() -> None:
    """Force ``p=0`` in ``F.dropout/dropout2d/dropout3d`` and in ``nn.Dropout/2d/3d``
    instances created from now on (idempotent; :func:`restore_dropout` undoes it)."""
    for name in DROPOUT_FUNCTIONS:
        fn = getattr(F, name)
        if not hasattr(fn, "__msprobe_rm_dropout__"):
            setattr(F, name, _zero_p_function(fn))
    for cls in DROPOUT_MODULES:
        own = cls.__dict__.get("__init__")
        init = own if own is not None else cls.__init__
        if not hasattr(init, "__msprobe_rm_dropout__"):
            cls.__init__ = _zero_p_init(init, inherited=own is None)


def restore_dropout() -> None:
    """Undo :func:`remove_dropout` (dropout instances created meanwhile keep ``p=0``)."""
    for name in DROPOUT_FUNCTIONS:
        fn = getattr(F, name)
        original = getattr(fn, "__msprobe_rm_dropout__", None)
        if original is not None:
            setattr(F, name, original)
    for cls in DROPOUT_MODULES:
        init = cls.__dict__.get("__init__")
        original = getattr(init, "__msprobe_rm_dropout__", None)
        if original is not None:
            if init.__msprobe_inherited__:
                del cls.__init__
            else:
                cls.__init__ = original
