"""Cell forward/backward hooks (levels L0 and mix) and parameter-gradient hooks.

Every subcell of the model (``cells_and_names()``, root excluded; a model without subcells
is recorded as itself under the path ``model``) gets a forward pre-hook and a forward hook
(``with_kwargs=True``). Backward entries come from ``Tensor.register_hook`` on the inputs
(pre-hook) and HookBackward identities on the outputs (forward hook; see ``backward``), not
from ``register_backward_hook``, which puts an identity on the inputs (regrouping their
gradient sums), breaks argument identity in MindSpore 2.10 and misses kwargs. Names follow spec 2.1: ``Cell.{path}.{Class}``; for a list/tuple of models
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


class CellHooks:
    """The Cell and parameter hooks of one recorder; a handle (``remove()`` is idempotent).

    ``suspend(owner)``/``resume()`` take the forward hooks off the Cells inside ``owner``
    (all hooked Cells when ``owner`` is None) while MindSpore compiles and runs a ``@jit``
    graph: its parser would try to compile the hook functions (they are Python side
    effects, which a graph cannot run).
    """

    def __init__(self, models: Sequence[nn.Cell], indexed: bool, recorder: Any) -> None:
        self._cells: dict[int, tuple[nn.Cell, Any, Any, list]] = {}
        self._params = HandleGroup()
        self._suspended: list[list[int]] = []
        for prefix, cell in cell_prefixes(models, indexed):
            if id(cell) in self._cells:  # a Cell shared under two names is recorded under the first
                continue
            pre, post = _pre(recorder, prefix), _post(recorder)
            self._cells[id(cell)] = (cell, pre, post, [])
            self._register(id(cell))
            params = [(n, p) for n, p in cell._params.items() if p is not None and p.requires_grad]
            names = tuple(n for n, _ in params)
            for pname, param in params:
                self._params.add(param.register_hook(_param_hook(recorder, prefix, pname, names)))

    def _register(self, key: int) -> None:
        cell, pre, post, handles = self._cells[key]
        handles.append(cell.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(cell.register_forward_hook(post, with_kwargs=True))

    def _unregister(self, key: int) -> None:
        handles = self._cells[key][3]
        while handles:
            handles.pop().remove()

    def suspend(self, owner: Any = None) -> None:
        """Remove the forward hooks of the hooked Cells inside ``owner`` (None = all)."""
        if owner is None:
            keys = [k for k, v in self._cells.items() if v[3]]
        else:
            keys = [id(c) for _n, c in owner.cells_and_names() if id(c) in self._cells and self._cells[id(c)][3]]
        for key in keys:
            self._unregister(key)
        self._suspended.append(keys)

    def resume(self) -> None:
        """Re-register the hooks removed by the matching :meth:`suspend`."""
        if self._suspended:
            for key in self._suspended.pop():
                if key in self._cells and not self._cells[key][3]:
                    self._register(key)

    def remove(self) -> None:
        """Remove every hook (idempotent)."""
        for key in list(self._cells):
            self._unregister(key)
        self._cells.clear()
        self._suspended.clear()
        self._params.remove()


def install_cell_hooks(models: Sequence[nn.Cell], indexed: bool, recorder: Any) -> CellHooks:
    """Hook every Cell of ``models`` (and their own parameters) for ``recorder``."""
    return CellHooks(models, indexed, recorder)


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
