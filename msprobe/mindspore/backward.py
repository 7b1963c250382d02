"""Backward recording in PyNative mode, adding no node that could regroup a gradient sum.

MindSpore adds up the gradients a tensor receives from its uses one by one. A node put
between a tensor and several of its uses makes MindSpore add those uses' gradients first
and the result to the tensor's other uses: float addition is not associative, so the
trained parameters would change in their last bits. So, for one recorded call made while
MindSpore builds a gradient graph (``_pynative_executor.requires_grad()``):

* API, Primitive and Jit calls: every tensor argument slot gets its own
  ``ops.HookBackward(fn)`` identity (one use each: a tensor passed twice, ``x * x``, gets
  two) whose ``fn`` receives the gradient w.r.t. that forward input *contributed by this
  very call through that slot* (backward ``output``; spec section 9 fix 3: ``output[i]``
  belongs to ``input_args[i]``, then tensor kwargs in kwarg order; ``null`` for
  non-tensors and for arguments that receive no gradient). An API call is a single
  operation whose backward sends one gradient per argument, so its identities add no
  grouping.
* Cells: a Cell may use an input several times (``q_proj(x)``, ``k_proj(x)``, ``v_proj(x)``)
  while the caller uses it too (a residual add), so an identity on a Cell input would
  regroup. Cell inputs get ``Tensor.register_hook`` instead, which adds no node: the
  backward ``output`` of a Cell is the *whole* gradient of the input tensor, the sum over
  all its uses, inside the Cell and elsewhere (equal to the Cell's own contribution
  exactly when the Cell is the tensor's only user, as in ``h = layer(h)``). A tensor in
  several slots of a Cell is hooked once and fills every slot.
* Outputs (every recorded call): each floating output tensor is replaced by an identity;
  every later use reads that identity, so it adds no grouping. Its ``fn`` receives the
  gradient w.r.t. that forward output (backward ``input``).

MindSpore only runs the hooks of tensors on the path to what is differentiated, so an
entry cannot know in advance how many gradients will arrive: the recorder emits every entry
that received one when the gradient computation returns (:mod:`msprobe.mindspore.grad_end`),
in the order of their first gradient.

Recording changes no result bit (tests/mindspore/zoo/).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from mindspore import Tensor, ops
from mindspore.common import dtype as mstype

from msprobe.core.recorder import PendingBackward as CorePendingBackward

Path = tuple


class PendingBackward(CorePendingBackward):
    """The gradients of one forward call, collected while backward runs
    (:class:`msprobe.core.recorder.PendingBackward`, same arguments); ``order``: the rank
    of its first gradient in this backward (None before one arrived)."""

    __slots__ = ("order",)

    def __init__(self, **fields: Any) -> None:
        super().__init__(**fields)
        self.order: Optional[int] = None


#: dtypes that carry gradients (floating and complex)
_GRAD_DTYPES = frozenset(mstype.float_type) | frozenset(mstype.complex_type)


def _is_float(t: Any) -> bool:
    """True for a floating or complex tensor (one ``dtype`` read: on a tensor an op has just
    made, it waits for that op's shape inference)."""
    try:
        return t.dtype in _GRAD_DTYPES
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
                   skip_first: bool = False) -> tuple[tuple, dict]:
        """Replace floating tensors in ``args`` (and lists/tuples in them) and tensor
        ``kwargs`` by identities, one per slot (a tensor passed twice gets two); ``skip_first``
        leaves ``args[0]`` alone (in-place APIs).

        Returns ``(args, kwargs)``; unchanged containers are returned as the same objects.
        """
        new_args = []
        changed = False
        for i, a in enumerate(args):
            if i == 0 and skip_first:
                b = a
                pending.out_slots.append((0,))
            else:
                b = self._map_in(pending, a, (i,), 0)
            changed |= b is not a
            new_args.append(b)
        pos = len(args)
        new_kwargs = kwargs
        for k, v in kwargs.items():
            if isinstance(v, Tensor):
                b = self._map_in(pending, v, (pos,), 0)
                pos += 1
                if b is not v:
                    if new_kwargs is kwargs:
                        new_kwargs = dict(kwargs)
                    new_kwargs[k] = b
        return (tuple(new_args) if changed else args), new_kwargs

    def _map_in(self, pending, value, path, depth):
        if isinstance(value, Tensor):
            pending.out_slots.append(path)
            if not _is_float(value):
                return value
            return self._identity(value, pending, "output", [path])
        if depth < 4 and isinstance(value, (list, tuple)) and value and not hasattr(value, "_fields"):
            items = [self._map_in(pending, v, path + (j,), depth + 1) for j, v in enumerate(value)]
            if all(x is y for x, y in zip(items, value)):
                return value
            return type(value)(items)
        pending.out_slots.append(path)
        return value

    def hook_inputs(self, pending: PendingBackward, args: tuple, kwargs: dict) -> list:
        """Note the slots of ``args``/``kwargs`` as :meth:`tap_inputs` does, but put no node
        in the graph: each floating tensor (once, however many slots it fills) gets
        ``Tensor.register_hook``, which MindSpore calls with the tensor's whole gradient
        (the sum over all its uses, this call's and any other). Returns the hook handles
        (the caller removes them when the gradient computation ends)."""
        memo: dict[int, list] = {}
        handles: list = []
        for i, a in enumerate(args):
            self._hook_in(pending, a, (i,), memo, 0, handles)
        pos = len(args)
        for v in kwargs.values():
            if isinstance(v, Tensor):
                self._hook_in(pending, v, (pos,), memo, 0, handles)
                pos += 1
        return handles

    def _hook_in(self, pending, value, path, memo, depth, handles) -> None:
        if isinstance(value, Tensor):
            pending.out_slots.append(path)
            if not _is_float(value):
                return
            paths = memo.get(id(value))
            if paths is not None:
                paths.append(path)
                return
            memo[id(value)] = paths = [path]
            on_grad = self._on_grad

            def hook(grad):
                on_grad(pending, "output", paths, grad)

            handles.append(value.register_hook(hook))
            return
        if depth < 4 and isinstance(value, (list, tuple)) and value and not hasattr(value, "_fields"):
            for j, v in enumerate(value):
                self._hook_in(pending, v, path + (j,), memo, depth + 1, handles)
            return
        pending.out_slots.append(path)

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
