"""Parameter-gradient hooks: ``{Module}.{path}.{Class}.parameters_grad`` entries.

Each direct parameter of a hooked module that requires grad gets a post-accumulate-grad
hook; when autograd has accumulated its gradient, the recorder records ``param.grad``
(so gradient accumulation over micro-batches records the accumulated value).
"""
from __future__ import annotations

from typing import Any

import torch

from msprobe.core.handles import HandleGroup
from msprobe.pytorch.compiled import is_compiling


def install_grad_hooks(module: torch.nn.Module, prefix: str, recorder: Any, group: HandleGroup) -> None:
    """Register a post-accumulate-grad hook on each of ``module``'s own parameters."""
    params = [(n, p) for n, p in module.named_parameters(recurse=False) if p.requires_grad]
    names = tuple(n for n, _ in params)
    for pname, param in params:
        def hook(p, _pname=pname):
            if is_compiling():  # compiled autograd traces it: nothing of msprobe's in the graph
                return
            recorder.parameter_grad(prefix, _pname, names, p)
        group.add(param.register_post_accumulate_grad_hook(hook))
