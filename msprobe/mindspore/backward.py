"""Backward recording in PyNative mode with ``ops.HookBackward`` identities.

For one recorded call (an API, a Primitive, a Jit function or a Cell forward) made while
MindSpore builds a gradient graph (``_pynative_executor.requires_grad()``), every tensor
argument is passed through ``ops.HookBackward(fn)``, an identity whose ``fn`` receives the
gradient flowing through it, and so is every tensor output:

* through an output identity: the gradient w.r.t. that forward output (backward ``input``);
* through an input identity: the gradient w.r.t. that forward input *contributed by this
  very call* (backward ``output``; spec section 9 fix 3: ``output[i]`` belongs to
  ``input_args[i]``, then tensor kwargs in kwarg order; ``null`` for non-tensors and for
  arguments that receive no gradient).

A tensor passed twice gets one identity (so ``a is b`` stays true inside the call) whose
gradient fills both slots. MindSpore only runs the hooks of tensors on the path to what is
differentiated, so an entry cannot know in advance how many gradients will arrive: the
recorder emits every entry that received one when the gradient computation returns
(:mod:`msprobe.mindspore.grad_end`), in the order of their first gradient.

Identities only forward values: recording changes no result bit (tested).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from mindspore import Tensor, ops

from msprobe.core.recorder import PendingBackward as CorePendingBackward
from msprobe.core.values import restore_swaps, swap_in_place

Path = tuple


class PendingBackward(CorePendingBackward):
    """The gradients of one forward call, collected while backward runs
    (:class:`msprobe.core.recorder.PendingBackward`, same arguments); ``order``: the rank
    of its first gradient in this backward (None before one arrived)."""

    __slots__ = ("order",)

    def __init__(self, **fields: Any) -> None:
        super().__init__(**fields)
        self.order: Optional[int] = None


def _is_float(t: Any) -> bool:
    try:
        return t.is_floating_point() or t.is_complex()
    except Exception:
        return False


class BackwardTaps:
    """Installs the HookBackward identities of one call.

    Args:
        on_grad: ``on_grad(pending, side, paths, grad)`` records one gradient for the slots
            ``paths``; ``side`` is ``"input"`` (w.r.t. a forward output) or ``"output"``
            (w.r.t. a forward input).
    """

    def __init__(self, on_grad: Callable[[PendingBackward, str, list, Any], None]) -> None:
        self._on_grad = on_grad

    def _identity(self, t: Tensor, pending: PendingBackward, side: str, paths: list) -> Tensor:
        on_grad = self._on_grad

        def hook(grads):
            g = grads[0] if isinstance(grads, tuple) and grads else grads
            on_grad(pending, side, paths, g)

        return ops.HookBackward(hook)(t)

    def tap_inputs(self, pending: PendingBackward, args: tuple, kwargs: dict,
                   skip_first: bool = False, swaps: Optional[list] = None) -> tuple[tuple, dict]:
        """Replace floating tensors in ``args`` (and lists/tuples in them) and tensor
        ``kwargs`` by identities; ``skip_first`` leaves ``args[0]`` alone (in-place APIs).
        With ``swaps`` (a list), the caller's lists get the identities in place, not a copy
        (a Cell may append to a list it was given, for its caller), and ``(list, index,
        identity, caller's element)`` is appended to ``swaps`` for :meth:`restore`.

        Returns ``(args, kwargs)``; unchanged containers are returned as the same objects.
        """
        memo: dict[int, tuple[Tensor, list]] = {}
        new_args = []
        changed = False
        for i, a in enumerate(args):
            if i == 0 and skip_first:
                b = a
                pending.out_slots.append((0,))
            else:
                b = self._map_in(pending, a, (i,), memo, 0, swaps)
            changed |= b is not a
            new_args.append(b)
        pos = len(args)
        new_kwargs = kwargs
        for k, v in kwargs.items():
            if isinstance(v, Tensor):
                b = self._map_in(pending, v, (pos,), memo, 0)
                pos += 1
                if b is not v:
                    if new_kwargs is kwargs:
                        new_kwargs = dict(kwargs)
                    new_kwargs[k] = b
        return (tuple(new_args) if changed else args), new_kwargs

    @staticmethod
    def restore(swaps: Optional[list]) -> None:
        """Put the caller's elements back into the lists :meth:`tap_inputs` changed in place
        (where the call left the identity in its place); idempotent."""
        if swaps:
            restore_swaps(swaps)

    def _map_in(self, pending, value, path, memo, depth, swaps=None):
        if isinstance(value, Tensor):
            pending.out_slots.append(path)
            if not _is_float(value):
                return value
            known = memo.get(id(value))
            if known is None:
                paths = [path]
                ident = self._identity(value, pending, "output", paths)
                memo[id(value)] = (ident, paths)
                return ident
            known[1].append(path)
            return known[0]
        if depth < 4 and isinstance(value, (list, tuple)) and value and not hasattr(value, "_fields"):
            items = [self._map_in(pending, v, path + (j,), memo, depth + 1, swaps) for j, v in enumerate(value)]
            if all(x is y for x, y in zip(items, value)):
                return value
            if swaps is not None and isinstance(value, list):  # the caller's list itself
                return swap_in_place(value, items, swaps)
            return type(value)(items)
        pending.out_slots.append(path)
        return value

    def tap_outputs(self, pending: PendingBackward, out: Any, inputs: tuple = ()) -> Any:
        """Replace floating output tensors by identities; an output that *is* one of the
        call's inputs (``inputs``: the caller's objects) is returned unchanged so that
        identity is kept (``x.copy_(y) is x``). Returns the value for the caller."""
        keep = {id(a) for a in inputs if isinstance(a, Tensor)}
        top = isinstance(out, (list, tuple)) and not hasattr(out, "_fields")
        return self._map_out(pending, out, () if top else (0,), keep, 0)

    def _map_out(self, pending, value, path, keep, depth):
        if isinstance(value, Tensor):
            pending.in_slots.append(path)
            if id(value) in keep or not _is_float(value):
                return value
            return self._identity(value, pending, "input", [path])
        if depth < 4 and isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            items = [self._map_out(pending, v, path + (k,), keep, depth + 1) for k, v in enumerate(value)]
            if all(x is y for x, y in zip(items, value)):
                return value
            return type(value)(items)
        pending.in_slots.append(path)
        return value
