"""Level L2 in GRAPH_MODE: configure MindSpore's own kernel dump from config.json.

MindSpore 2.10 on CPU supports its end-to-end kernel dump in GRAPH_MODE with
``saved_data: "tensor"`` only (``"statistic"`` is GPU/Ascend-only and fails at graph
compilation). :func:`configure_kernel_dump` writes ``{dump_path}/kernel_dump_config.json``
and points ``MINDSPORE_DUMP_CONFIG`` at it; MindSpore then writes
``{dump_path}/rank_{id}/{net_name}/{graph_id}/{iteration}/*.npy`` plus
``execution_order/`` and ``graphs/`` (its documented layout, spec 1.4).

Mapping: ``list`` (exactly one kernel name at L2, spec 5.3) → ``kernels``; ``data_mode``
input/output → ``input_output`` 1/2 (else 0); ``step`` → ``iteration`` (``"all"`` when
empty, else ``"a|b|c"``); task must be ``tensor`` (statistics on CPU are unsupported).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from msprobe.core.config import Config
from msprobe.core.errors import ConfigError
from store.fileutil import atomic_write_text, make_dirs

CONFIG_FILE = "kernel_dump_config.json"
ENV = "MINDSPORE_DUMP_CONFIG"


def kernel_dump_settings(config: Config) -> dict:
    """The MindSpore dump JSON for ``config`` (see module docstring); no file is written.

    Raises:
        ConfigError: task other than ``tensor``.
    """
    if config.task != "tensor":
        raise ConfigError("task", config.task, ("tensor",),
                          detail="MindSpore's kernel dump (level L2, GRAPH_MODE) stores only tensors on CPU")
    sides = {"input", "output"} & set(config.data_mode)
    input_output = 0 if len(sides) != 1 else (1 if "input" in sides else 2)
    iteration = "all" if not config.step else "|".join(str(s) for s in config.step)
    return {
        "common_dump_settings": {
            "op_debug_mode": 0,
            "dump_mode": 1 if config.list else 0,
            "path": os.path.abspath(config.dump_path),
            "net_name": "Net",
            "iteration": iteration,
            "saved_data": "tensor",
            "input_output": input_output,
            "kernels": list(config.list),
            "support_device": [0, 1, 2, 3, 4, 5, 6, 7],
        },
        "e2e_dump_settings": {"enable": True, "trans_flag": True},
    }


def configure_kernel_dump(config: Config, graph_mode: bool) -> Path:
    """Write the kernel dump config and set ``MINDSPORE_DUMP_CONFIG`` (before the first
    graph is compiled).

    Args:
        config: level ``L2`` (or another level, which is rejected).
        graph_mode: whether MindSpore runs in GRAPH_MODE.
    Returns:
        The path of the written MindSpore dump config.
    Raises:
        ConfigError: L2 outside GRAPH_MODE, another level in GRAPH_MODE, or task not tensor.
    """
    if config.level != "L2":
        raise ConfigError("level", config.level, ("L2",),
                          detail="in GRAPH_MODE msprobe records only kernels (L2); use "
                                 "mindspore.set_context(mode=mindspore.PYNATIVE_MODE) for L0, L1, mix and debug")
    if not graph_mode:
        raise ConfigError("level", "L2", ("L0", "L1", "mix", "debug"),
                          detail="PyNative mode; for kernel dump (L2) call "
                                 "mindspore.set_context(mode=mindspore.GRAPH_MODE) before PrecisionDebugger")
    settings = kernel_dump_settings(config)
    directory = make_dirs(config.dump_path)
    target = directory / CONFIG_FILE
    atomic_write_text(target, json.dumps(settings, indent=1))
    os.environ[ENV] = str(target.resolve())
    return target
