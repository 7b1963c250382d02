"""Keep autograd's implicit seed gradient out of the dump (spec section 9, fix 2).

``loss.backward()`` creates its seed gradient with ``torch.ones_like``, which upstream
records as a user call (``Torch.ones_like.0.forward``). The guard wraps
``torch.autograd.backward`` and ``torch.autograd.grad``: when no gradient is given for a
scalar output, the guard creates it itself, as msprobe's own (unrecorded) operation, and
passes it explicitly. Values are identical to autograd's own seed.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch

from msprobe.core.handles import CallbackHandle, HandleGroup, finish_wrapper
from msprobe.core.handles import restore_attribute
from msprobe.pytorch.api_hooks import with_script_original
from msprobe.pytorch.backward import retaining
from msprobe.pytorch.jit_compat import prepare_builtin_table


def _seed(outputs: Any, grads: Any) -> Any:
    if grads is not None:
        return grads
    if isinstance(outputs, torch.Tensor):
        outs = (outputs,)
    elif isinstance(outputs, (list, tuple)) and all(isinstance(o, torch.Tensor) for o in outputs):
        outs = tuple(outputs)
    else:
        return grads
    if not all(o.requires_grad and o.numel() == 1 and o.layout == torch.strided for o in outs):
        return grads
    return tuple(torch.ones_like(o, memory_format=torch.preserve_format) for o in outs)


def install_autograd_guard(session: Any, after: Optional[Callable[[], None]] = None,
                           before: Optional[Callable[[], None]] = None) -> HandleGroup:
    """Wrap ``torch.autograd.backward``/``grad`` for ``session``; returns restoring handles.

    ``after``: called when a backward pass returns (or raises), e.g. to forget statistics of
    gradients that code outside Python may have written during it (DDP's bucket allreduce).
    ``before``: called (also between ``stop()`` and ``step()``) before a pass starts, e.g.
    to hook parameters that require grad since the hooks were installed; must not raise."""
    group = HandleGroup()
    prepare_builtin_table()  # before any wrapper is in place (see msprobe.pytorch.jit_compat)
    for name, grads_pos, grads_kw, outputs_kw in (("backward", 1, "grad_tensors", "tensors"),
                                                  ("grad", 2, "grad_outputs", "outputs")):
        original = getattr(torch.autograd, name)
        wrapper = _make_guard(session, original, grads_pos, grads_kw, outputs_kw, after, before,
                              grads_pos + 1)
        setattr(torch.autograd, name, wrapper)
        restore = functools.partial(restore_attribute, torch.autograd, name, wrapper, original)
        group.add(CallbackHandle(with_script_original(restore, wrapper, original)))
    return group


def _make_guard(session: Any, original: Any, grads_pos: int, grads_kw: str, outputs_kw: str,
                after: Optional[Callable[[], None]], before: Optional[Callable[[], None]], retain_pos: int) -> Any:
    tls = session._tls

    def wrapper(*args, **kwargs):
        if wrapper.__msprobe_disabled__:
            return original(*args, **kwargs)
        if before is not None:
            before()
        # retain_graph (default: create_graph) at retain_pos / retain_pos + 1 of both signatures
        retain = args[retain_pos] if len(args) > retain_pos else kwargs.get("retain_graph")
        if retain is None:
            retain = args[retain_pos + 1] if len(args) > retain_pos + 1 else kwargs.get("create_graph", False)
        if retain:
            retaining(1)
            try:
                return _guarded_call(wrapper, args, kwargs)
            finally:
                retaining(-1)
        return _guarded_call(wrapper, args, kwargs)

    def _guarded_call(wrapper, args, kwargs):
        if (not wrapper.__msprobe_disabled__ and session.recording and not getattr(tls, "busy", False)
                and len(args) <= grads_pos and kwargs.get(grads_kw) is None):
            outputs = args[0] if args else kwargs.get(outputs_kw)
            tls.busy = True
            try:
                seed = _seed(outputs, None)
            except Exception:
                seed = None
            finally:
                tls.busy = False
            if seed is not None:
                kwargs[grads_kw] = seed
        if after is None:
            return original(*args, **kwargs)
        try:
            return original(*args, **kwargs)
        finally:
            after()

    return finish_wrapper(wrapper, original)
