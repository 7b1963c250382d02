"""Level L2 in GRAPH_MODE: configure MindSpore's own kernel dump from config.json.

:func:`configure_kernel_dump` writes ``{dump_path}/kernel_dump_config.json`` and points
``MINDSPORE_DUMP_CONFIG`` at it (before the first graph is compiled); MindSpore then writes
``{dump_path}/rank_{id}/{net_name}/{graph_id}/{iteration}/`` (``.npy`` files or
``statistic.csv``) plus ``execution_order/`` and ``graphs/`` (its documented layout, spec 1.4),
which :mod:`msprobe.kernel_dump.ingest` reads into the event log.

Mapping:

- ``list`` → ``kernels``: empty = every kernel (``dump_mode`` 0), else the named kernels
  (``dump_mode`` 1; a name is a kernel type such as ``MatMul`` or a full scope name);
- ``data_mode`` input/output → ``input_output`` 1/2 (else 0; forward/backward are applied
  by the reader: MindSpore scopes backward kernels ``Gradients/``);
- ``step`` → ``iteration`` (``"all"`` when empty, else ``"a|b|c"``);
- ``rank`` → applied by the reader (ranks not listed are not read into the log);
- task ``tensor`` → ``saved_data: "tensor"``; task ``statistics`` → ``"statistic"`` with
  :data:`msprobe.kernel_dump.statistic_csv.STATISTIC_CATEGORIES` on GPU and Ascend, and
  ``"tensor"`` on CPU, where MindSpore refuses statistic dumps ("only supported on GPU and
  Ascend") and the reader reduces the ``.npy`` files itself.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from msprobe.core.config import Config
from msprobe.core.errors import ConfigError
from msprobe.kernel_dump.ingest import KernelSettings, write_settings
from msprobe.kernel_dump.statistic_csv import STATISTIC_CATEGORIES
from store.fileutil import atomic_write_text, make_dirs

CONFIG_FILE = "kernel_dump_config.json"
ENV = "MINDSPORE_DUMP_CONFIG"
#: device targets on which MindSpore writes statistic dumps (statistic.csv)
STATISTIC_DEVICES = ("GPU", "Ascend")


def kernel_dump_settings(config: Config, device_target: str = "CPU") -> dict:
    """The MindSpore dump JSON for ``config`` on ``device_target`` (``"CPU"``, ``"GPU"``,
    ``"Ascend"``; see the module docstring); no file is written.

    Raises:
        ConfigError: task ``structure`` (MindSpore's kernel dump has no structure-only mode).
    """
    if config.task not in ("statistics", "tensor"):
        raise ConfigError("task", config.task, ("statistics", "tensor"),
                          detail="level L2 records MindSpore's kernel dump, which has no structure-only mode")
    sides = {"input", "output"} & set(config.data_mode)
    input_output = 0 if len(sides) != 1 else (1 if "input" in sides else 2)
    iteration = "all" if not config.step else "|".join(str(s) for s in config.step)
    statistic = config.task == "statistics" and device_target in STATISTIC_DEVICES
    common = {
        "op_debug_mode": 0,
        "dump_mode": 1 if config.list else 0,
        "path": os.path.abspath(config.dump_path),
        "net_name": "Net",
        "iteration": iteration,
        "saved_data": "statistic" if statistic else "tensor",
        "input_output": input_output,
        "kernels": list(config.list),
        "support_device": [0, 1, 2, 3, 4, 5, 6, 7],
    }
    if statistic:
        common["statistic_category"] = list(STATISTIC_CATEGORIES)
    return {"common_dump_settings": common, "e2e_dump_settings": {"enable": True, "trans_flag": True}}


def configure_kernel_dump(config: Config, device_target: str = "CPU") -> Path:
    """Write the kernel dump config, set ``MINDSPORE_DUMP_CONFIG`` (before the first graph
    is compiled) and store the reader's settings (:func:`msprobe.kernel_dump.ingest.write_settings`).

    Args:
        config: a level ``L2`` config.
        device_target: MindSpore's device target.
    Returns:
        The path of the written MindSpore dump config.
    Raises:
        ConfigError: task ``structure``.
    """
    settings = kernel_dump_settings(config, device_target)
    directory = make_dirs(config.dump_path)
    target = directory / CONFIG_FILE
    atomic_write_text(target, json.dumps(settings, indent=1))
    write_settings(directory, KernelSettings(task=config.task, summary_mode=config.summary_mode,
                                             ranks=tuple(config.rank), data_mode=tuple(config.data_mode)))
    os.environ[ENV] = str(target.resolve())
    return target
