"""Cell forward/backward hooks (levels L0 and mix) and parameter-gradient hooks.

Every subcell of the model (``cells_and_names()``, root excluded; a model without subcells
is recorded as itself under the path ``model``) gets a forward pre-hook and a forward hook
(``with_kwargs=True``). Backward entries come from HookBackward identities that the
pre-hook puts on the inputs and the forward hook on the outputs (see ``backward``), not
from ``register_backward_hook``, which breaks argument identity in MindSpore 2.10 and
misses kwargs. Names follow spec 2.1: ``Cell.{path}.{Class}``; for a list/tuple of models
the index is prepended to the path (``Cell.0.0.Dense``).

Each direct Parameter of a hooked Cell that requires grad gets ``Parameter.register_hook``;
MindSpore calls it once per backward with the accumulated gradient
(``{prefix}.parameters_grad``).
"""
from __future__ import annotations

from typing import Any, Sequence

from mindspore import nn

from msprobe.core.handles import HandleGroup


def cell_prefixes(models: Sequence[nn.Cell], indexed: bool) -> list[tuple[str, nn.Cell]]:
    """``(prefix, cell)`` for every hooked Cell of ``models``.

    ``indexed`` is True when the user passed a list/tuple (paths then start with the index).

    >>> # nn.SequentialCell([nn.Dense(2, 2)]) → [("Cell.0.Dense", <Dense>)]
    """
    out = []
    for i, model in enumerate(models):
        children = [(name, c) for name, c in model.cells_and_names() if name]
        if not children:
            children = [("", model)]
        for name, c in children:
            path = ".".join(p for p in ((str(i) if indexed else ""), name) if p) or "model"
            out.append((f"Cell.{path}.{type(c).__name__}", c))
    return out


def install_cell_hooks(models: Sequence[nn.Cell], indexed: bool, recorder: Any) -> HandleGroup:
    """Hook every Cell of ``models`` (and their own parameters) for ``recorder``."""
    group = HandleGroup()
    seen: set[int] = set()
    for prefix, cell in cell_prefixes(models, indexed):
        if id(cell) in seen:  # a Cell shared under two names is recorded under the first
            continue
        seen.add(id(cell))
        group.add(cell.register_forward_pre_hook(_pre(recorder, prefix), with_kwargs=True))
        group.add(cell.register_forward_hook(_post(recorder), with_kwargs=True))
        params = [(n, p) for n, p in cell._params.items() if p is not None and p.requires_grad]
        names = tuple(n for n, _ in params)
        for pname, param in params:
            group.add(param.register_hook(_param_hook(recorder, prefix, pname, names)))
    return group


def _pre(recorder, prefix: str):
    def pre_hook(cell, args, kwargs):
        return recorder.cell_pre(cell, prefix, args, kwargs)
    return pre_hook


def _post(recorder):
    def forward_hook(cell, args, kwargs, output):
        return recorder.cell_post(cell, output)
    return forward_hook


def _param_hook(recorder, prefix: str, pname: str, names: tuple[str, ...]):
    def hook(grad):
        recorder.parameter_grad(prefix, pname, names, grad)
        return None
    return hook
