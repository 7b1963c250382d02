"""Module forward/backward hooks (levels L0 and mix).

Every submodule of the model (``named_modules()``, root excluded; a model without
submodules is recorded as itself) gets a forward pre-hook and a forward hook
(``with_kwargs=True``, ``always_call=True`` so a forward that raises still unwinds the
module stack). Names follow spec 2.1: ``Module.{path}.{Class}``; for a list/tuple of
models the index is prepended to the path (``Module.0.linear.Linear``).

``torch.compile(module)`` returns an ``OptimizedModule`` whose child ``_orig_mod`` is the
module; the ``_orig_mod`` module's own hooks would run inside the compiled region (where
they do nothing, :mod:`msprobe.pytorch.compiled`), so its hooks are put on the
``OptimizedModule``, which runs eagerly around the compiled call, and the
``OptimizedModule`` gets no entry under a name of its own: ``torch.compile(model)`` records
``Module._orig_mod.{Class}.forward.0`` with the inputs, outputs and parameters of ``model``.
"""
from __future__ import annotations

import sys
from typing import Any, Optional, Sequence

import torch

from msprobe.core.handles import HandleGroup
from msprobe.pytorch import compiled_record
from msprobe.pytorch.compiled import is_compiling
from msprobe.pytorch.grad_hooks import install_grad_hooks


def module_prefixes(models: Sequence[torch.nn.Module], indexed: bool) -> list[tuple[str, torch.nn.Module]]:
    """``(prefix, module)`` for every hooked module of ``models``.

    ``indexed`` is True when the user passed a list/tuple (then paths start with the index).
    A model with no submodules is hooked itself, under the path ``model`` (or its index).
    An ``OptimizedModule`` (``torch.compile``) is left out: its ``_orig_mod`` stands for
    it (:func:`compiled_wrappers`).
    """
    out = []
    for i, model in enumerate(models):
        children = [(name, m) for name, m in model.named_modules()
                    if name and not is_optimized(m)]
        if not children:
            children = [("", model)]
        for name, m in children:
            path = ".".join(p for p in ((str(i) if indexed else ""), name) if p) or "model"
            out.append((f"Module.{path}.{type(m).__name__}", m))
    return out


def is_optimized(module: torch.nn.Module) -> bool:
    """Whether ``module`` is an ``OptimizedModule`` (what ``torch.compile(m)`` returns)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # not imported: nothing is compiled
    optimized = getattr(eval_frame, "OptimizedModule", None)
    return optimized is not None and isinstance(module, optimized)


def compiled_wrappers(models: Sequence[torch.nn.Module]) -> dict[int, torch.nn.Module]:
    """``id(m._orig_mod) -> m`` for every ``OptimizedModule`` ``m`` in the trees of
    ``models`` (the models themselves included)."""
    return {id(m._orig_mod): m for model in models for m in model.modules() if is_optimized(m)}


def ancestors(prefixes: Sequence[tuple[str, torch.nn.Module]]) -> dict[str, tuple[str, ...]]:
    """For each prefix of :func:`module_prefixes`, the prefixes of the hooked modules that
    contain it (by module path: ``Module.a.B`` contains ``Module.a.b.C``)."""
    by_path = {p[len("Module."):p.rindex(".")]: p for p, _ in prefixes}
    out = {}
    for path, prefix in by_path.items():
        parts = path.split(".")
        out[prefix] = tuple(by_path[q] for q in (".".join(parts[:k]) for k in range(1, len(parts)))
                            if q in by_path)
    return out


def root_prefixes(models: Sequence[torch.nn.Module], indexed: bool) -> list[tuple[str, torch.nn.Module]]:
    """``(prefix, model)`` for every model of ``models`` that has submodules and
    parameters of its own (ViT's ``cls_token``): the root is not recorded (spec 9), but its
    own parameters' gradients are, as ``Module.model.{Class}.parameters_grad``
    (``Module.{i}.{Class}`` for a list of models), the name a model without submodules
    has. An ``OptimizedModule`` root has no parameters of its own (its ``_orig_mod``'s are
    recorded under that child's name). Parameters that do not require grad yet are
    included (:class:`msprobe.pytorch.grad_hooks.FrozenParameters`)."""
    out = []
    for i, model in enumerate(models):
        if any(True for _ in model.children()) and any(True for _ in model.named_parameters(recurse=False)):
            out.append((f"Module.{i if indexed else 'model'}.{type(model).__name__}", model))
    return out


def install_module_hooks(models: Sequence[torch.nn.Module], indexed: bool, recorder: Any) -> HandleGroup:
    """Hook every module of ``models`` for ``recorder``, and the root's own parameters
    (:func:`root_prefixes`); returns the handles."""
    group = HandleGroup()
    prefixes = module_prefixes(models, indexed)
    wrappers = compiled_wrappers(models)
    # compiled_regions "inside": hooks traced by torch.compile record (msprobe.pytorch.compiled_record)
    rid = compiled_record.enable(recorder, group) if compiled_record.inside(recorder) else None
    for prefix, module in prefixes:
        hook_module(module, prefix, recorder, group, group, on=wrappers.get(id(module)), rid=rid)
    recorder.ancestors = ancestors(prefixes)
    recorder.root_prefixes.clear()
    for prefix, model in root_prefixes(models, indexed):
        recorder.root_prefixes.add(prefix)
        install_grad_hooks(model, prefix, recorder, group)
    return group


def hook_module(module: torch.nn.Module, prefix: str, recorder: Any, forward_group: HandleGroup,
                grad_group: Optional[HandleGroup], on: Optional[torch.nn.Module] = None,
                rid: Optional[int] = None) -> None:
    """Hook one module under the entry prefix ``prefix`` (``Module.{path}.{Class}``): forward
    pre/post hooks go to ``forward_group``, parameter-gradient hooks to ``grad_group``
    (None: no parameter-gradient hooks, the module has them already).
    ``on``: the module whose calls stand for ``module``'s (the ``OptimizedModule`` that
    wraps it); the forward hooks are registered there, the entries are ``module``'s.
    ``rid``: the recorder's id where forwards traced by torch.compile are recorded
    (:mod:`msprobe.pytorch.compiled_record`), else None."""
    on = module if on is None else on
    forward_group.add(on.register_forward_pre_hook(_pre(recorder, prefix, module, rid), with_kwargs=True))
    # a plain hook marks a forward that returned; the always-called one (runs after it, and
    # also when forward raised) pops the module stack and records the entry
    forward_group.add(on.register_forward_hook(_done(recorder, module)))
    forward_group.add(on.register_forward_hook(_post(recorder, module, prefix, rid), with_kwargs=True,
                                               always_call=True))
    if grad_group is not None:
        install_grad_hooks(module, prefix, recorder, grad_group)


# each hook tests is_compiling() first: a module inside a compiled region is traced
# without msprobe's code (msprobe.pytorch.compiled)
def _pre(recorder, prefix: str, owner: torch.nn.Module, rid: Optional[int] = None):
    def pre_hook(module, args, kwargs):
        if is_compiling():
            if rid is not None:  # compiled_regions "inside"
                compiled_record.module_pre(rid, prefix, owner, args, kwargs)
            return None
        return recorder.module_pre(owner, prefix, args, kwargs)
    return pre_hook


def _done(recorder, owner: torch.nn.Module):
    def done_hook(module, args, output):
        if is_compiling():
            return
        recorder.module_done(owner)
    return done_hook


def _post(recorder, owner: torch.nn.Module, prefix: str = "", rid: Optional[int] = None):
    def forward_hook(module, args, kwargs, output):
        if is_compiling():
            if rid is not None:  # compiled_regions "inside"
                compiled_record.module_post(rid, prefix, output)
            return None
        return recorder.module_post(owner, output)
    return forward_hook
