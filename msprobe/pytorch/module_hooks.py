"""Module forward/backward hooks (levels L0 and mix).

Every submodule of the model (``named_modules()``, root excluded; a model without
submodules is recorded as itself) gets a forward pre-hook and a forward hook
(``with_kwargs=True``, ``always_call=True`` so a forward that raises still unwinds the
module stack). Names follow spec 2.1: ``Module.{path}.{Class}``; for a list/tuple of
models the index is prepended to the path (``Module.0.linear.Linear``).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from msprobe.core.handles import HandleGroup
from msprobe.pytorch.grad_hooks import install_grad_hooks


def module_prefixes(models: Sequence[torch.nn.Module], indexed: bool) -> list[tuple[str, torch.nn.Module]]:
    """``(prefix, module)`` for every hooked module of ``models``.

    ``indexed`` is True when the user passed a list/tuple (then paths start with the index).
    A model with no submodules is hooked itself, under the path ``model`` (or its index).
    """
    out = []
    for i, model in enumerate(models):
        children = [(name, m) for name, m in model.named_modules() if name]
        if not children:
            children = [("", model)]
        for name, m in children:
            path = ".".join(p for p in ((str(i) if indexed else ""), name) if p) or "model"
            out.append((f"Module.{path}.{type(m).__name__}", m))
    return out


def root_prefixes(models: Sequence[torch.nn.Module], indexed: bool) -> list[tuple[str, torch.nn.Module]]:
    """``(prefix, model)`` for every model of ``models`` that has submodules and
    parameters of its own (ViT's ``cls_token``): the root is not recorded (spec 9), but its
    own parameters' gradients are, as ``Module.model.{Class}.parameters_grad``
    (``Module.{i}.{Class}`` for a list of models), the name a model without submodules
    has."""
    out = []
    for i, model in enumerate(models):
        if any(True for _ in model.children()) and any(
                p.requires_grad for _, p in model.named_parameters(recurse=False)):
            out.append((f"Module.{i if indexed else 'model'}.{type(model).__name__}", model))
    return out


def install_module_hooks(models: Sequence[torch.nn.Module], indexed: bool, recorder: Any) -> HandleGroup:
    """Hook every module of ``models`` for ``recorder``, and the root's own parameters
    (:func:`root_prefixes`); returns the handles."""
    group = HandleGroup()
    for prefix, module in module_prefixes(models, indexed):
        hook_module(module, prefix, recorder, group, group)
    recorder.root_prefixes.clear()
    for prefix, model in root_prefixes(models, indexed):
        recorder.root_prefixes.add(prefix)
        install_grad_hooks(model, prefix, recorder, group)
    return group


def hook_module(module: torch.nn.Module, prefix: str, recorder: Any, forward_group: HandleGroup,
                grad_group: HandleGroup) -> None:
    """Hook one module under the entry prefix ``prefix`` (``Module.{path}.{Class}``): forward
    pre/post hooks go to ``forward_group``, parameter-gradient hooks to ``grad_group``."""
    forward_group.add(module.register_forward_pre_hook(_pre(recorder, prefix), with_kwargs=True))
    # a plain hook marks a forward that returned; the always-called one (runs after it, and
    # also when forward raised) pops the module stack and records the entry
    forward_group.add(module.register_forward_hook(_done(recorder)))
    forward_group.add(module.register_forward_hook(_post(recorder), with_kwargs=True, always_call=True))
    install_grad_hooks(module, prefix, recorder, grad_group)


def _pre(recorder, prefix: str):
    def pre_hook(module, args, kwargs):
        return recorder.module_pre(module, prefix, args, kwargs)
    return pre_hook


def _done(recorder):
    def done_hook(module, args, output):
        recorder.module_done(module)
    return done_hook


def _post(recorder):
    def forward_hook(module, args, kwargs, output):
        return recorder.module_post(module, output)
    return forward_hook
