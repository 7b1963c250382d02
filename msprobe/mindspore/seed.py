"""``seed_all`` for MindSpore (spec 6.2 with section 9 fixes 25 and 33).

Sets ``PYTHONHASHSEED``, Python's ``random``, numpy's and MindSpore's global seed;
``mode=True`` asks MindSpore for deterministic kernels (``deterministic="ON"``) and sets
``HCCL_DETERMINISTIC``. With ``rm_dropout`` the dropout classes and functions the seeds
list are rebound to versions that drop nothing, affecting objects created afterwards:
``mindspore.ops.Dropout/Dropout2D/Dropout3D`` (also under ``mindspore.ops.operations``) keep
every element (``keep_prob=1``), ``mindspore.mint.nn.Dropout`` uses ``p=0`` and
``mindspore.mint.nn.functional.dropout`` returns its input. Nothing else is touched, and
nothing happens to dropout unless ``seed_all`` is called (fix 33).
"""
from __future__ import annotations

import logging
import os
import random

import numpy as np

from msprobe.core.errors import ConfigError

logger = logging.getLogger("msprobe")

_MAX_SEED = 2**32 - 1


def seed_all(seed: int = 1234, mode: bool = False, rm_dropout: bool = True) -> None:
    """Seed every random source and optionally make MindSpore deterministic.

    Args:
        seed: int in ``[0, 2**32 - 1]``.
        mode: True = deterministic computation (``mindspore.set_context(deterministic="ON")``).
        rm_dropout: True = dropout created after this call drops nothing.

    Raises:
        ConfigError: ``seed`` not an int in range, ``mode`` or ``rm_dropout`` not a bool.
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= _MAX_SEED:
        raise ConfigError("seed", seed, f"an integer in [0, {_MAX_SEED}]")
    if not isinstance(mode, bool):
        raise ConfigError("mode", mode, "true, false")
    if not isinstance(rm_dropout, bool):
        raise ConfigError("rm_dropout", rm_dropout, "true, false")
    import mindspore as ms

    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed)
    ms.set_seed(seed)
    ms.set_context(deterministic="ON" if mode else "OFF")
    os.environ["HCCL_DETERMINISTIC"] = str(mode)
    if rm_dropout:
        remove_dropout()


def remove_dropout() -> None:
    """Rebind the dropout classes and function (see module docstring) to no-op versions.

    Idempotent: already replaced names are left as they are.
    """
    from mindspore import mint, ops
    from mindspore.mint.nn import functional as mint_f
    from mindspore.ops import operations as P

    for owner in (ops, P):
        for name in ("Dropout", "Dropout2D", "Dropout3D"):
            cls = getattr(owner, name, None)
            if cls is None or getattr(cls, "__msprobe_no_dropout__", False):
                continue
            setattr(owner, name, _keep_all(cls))
    cls = mint.nn.Dropout
    if not getattr(cls, "__msprobe_no_dropout__", False):
        mint.nn.Dropout = _p_zero(cls)
    if not getattr(mint_f.dropout, "__msprobe_no_dropout__", False):
        def dropout(input, p=0.5, training=True, inplace=False):  # noqa: A002 - MindSpore's name
            """Identity: dropout removed by msprobe ``seed_all(rm_dropout=True)``."""
            return input
        dropout.__msprobe_no_dropout__ = True
        mint_f.dropout = dropout


def _keep_all(cls):
    def __init__(self, keep_prob=0.5, *args, **kwargs):
        cls.__init__(self, 1.0, *args, **kwargs)
    return type(cls.__name__, (cls,), {"__init__": __init__, "__msprobe_no_dropout__": True,
                                       "__module__": cls.__module__})


def _p_zero(cls):
    def __init__(self, p=0.5, *args, **kwargs):
        cls.__init__(self, 0.0, *args, **kwargs)
    return type(cls.__name__, (cls,), {"__init__": __init__, "__msprobe_no_dropout__": True,
                                       "__module__": cls.__module__})
