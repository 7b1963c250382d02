"""Parameter-gradient hooks: ``{Module}.{path}.{Class}.parameters_grad`` entries.

Each direct parameter of a hooked module gets a post-accumulate-grad hook once it requires
grad; when autograd has accumulated its gradient, the recorder records ``param.grad`` (so
gradient accumulation over micro-batches records the accumulated value).

A parameter frozen when the hooks are installed (``requires_grad`` False: a GAN's other
network, a layer unfrozen later) cannot carry a hook (PyTorch refuses hooks on tensors
that do not require grad). It waits in :class:`FrozenParameters`, which is swept at every
``start()`` and at the start of every backward pass (``torch.autograd.backward``, through
:mod:`msprobe.pytorch.autograd_guard`): a waiting parameter that requires grad by then
gets its hook. ``AccumulateGrad`` accumulates only into parameters that require grad when
the pass runs, so every parameter that receives a gradient in a pass is hooked before
the pass starts. The hook only reads ``param.grad``: the training is not changed.
"""
from __future__ import annotations

import weakref
from typing import Any, Optional

import torch

from msprobe.core.handles import CallbackHandle, HandleGroup
from msprobe.pytorch.compiled import is_compiling


class _Owner:
    """One hooked module: its entry prefix, the keys of its ``parameters_grad`` entry (its
    hooked parameters' names, in ``named_parameters`` order) and its parameter names."""

    __slots__ = ("prefix", "keys", "order")

    def __init__(self, prefix: str, order: tuple[str, ...]) -> None:
        self.prefix, self.order = prefix, order
        self.keys: tuple[str, ...] = ()

    def add_key(self, pname: str) -> None:
        hooked = set(self.keys) | {pname}
        self.keys = tuple(n for n in self.order if n in hooked)


class FrozenParameters:
    """Parameters of hooked modules that do not require grad yet, per recorder.

    Each waiting parameter is held weakly with its :class:`_Owner`, the recorder and the
    :class:`HandleGroup` its hook goes to; removing that group forgets it."""

    def __init__(self) -> None:
        self._waiting: dict[int, tuple] = {}  # id(param) -> (weakref(param), owner, pname, recorder, group)

    def __len__(self) -> int:
        return len(self._waiting)

    def wait(self, param: torch.Tensor, owner: _Owner, pname: str, recorder: Any, group: HandleGroup) -> None:
        """Hold ``param`` (a parameter of ``owner``'s module named ``pname`` that does not
        require grad now) until :meth:`sweep` finds it requiring grad; removing ``group``
        forgets it."""
        key = id(param)
        self._waiting[key] = (weakref.ref(param), owner, pname, recorder, group)
        group.add(CallbackHandle(lambda: self._waiting.pop(key, None)))

    def sweep(self) -> None:
        """Hook every waiting parameter that requires grad now (and forget the dead ones)."""
        if not self._waiting:
            return
        for key, (ref, owner, pname, recorder, group) in list(self._waiting.items()):
            param = ref()
            if param is None:
                del self._waiting[key]
            elif param.requires_grad and param.is_leaf:
                del self._waiting[key]
                _hook(param, owner, pname, recorder, group)


def install_grad_hooks(module: torch.nn.Module, prefix: str, recorder: Any, group: HandleGroup,
                       frozen: Optional[FrozenParameters] = None) -> None:
    """Register a post-accumulate-grad hook on each of ``module``'s own parameters that
    requires grad; those that do not wait in ``frozen`` (default: ``recorder.frozen``)."""
    frozen = recorder.frozen if frozen is None else frozen
    params = list(module.named_parameters(recurse=False))
    owner = _Owner(prefix, tuple(n for n, _ in params))
    for pname, param in params:
        if param.requires_grad:
            _hook(param, owner, pname, recorder, group)
        else:
            frozen.wait(param, owner, pname, recorder, group)


def _hook(param: torch.Tensor, owner: _Owner, pname: str, recorder: Any, group: HandleGroup) -> None:
    owner.add_key(pname)

    def hook(p):
        if is_compiling():  # compiled autograd traces it: nothing of msprobe's in the graph
            return
        recorder.parameter_grad(owner.prefix, pname, owner.keys, p)
    group.add(param.register_post_accumulate_grad_hook(hook))
