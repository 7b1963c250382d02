"""Backward recording without custom autograd Functions.

For one recorded call (an API or a module forward), every tensor argument that requires
grad is replaced by ``t.view_as(t)``, a differentiable view. A pre-hook on each view's
autograd node receives exactly the gradient that flows through that view: the gradient
w.r.t. that forward input *contributed by this very call* (backward ``output``; spec
section 9 fix 3: ``output[i]`` is the gradient w.r.t. ``input_args[i]``, then tensor
kwargs in kwarg order, ``null`` where there is none). Outputs are not substituted: a
pre-hook on the node that produced each output receives the gradient w.r.t. it
(backward ``input``), and stays in the graph when later code modifies the output in place.

Views are identities for autograd and for values, so recording changes no result bit;
in-place ops on them rebase their base as usual (no custom-Function view restrictions).
A call whose output *is* one of its inputs (in-place ops, and identities such as dropout
with p=0 or ``nn.Identity``) returns the caller's original object. A write autograd does
not see (under ``torch.no_grad``) leaves the caller's tensor on its node: handed back, the
input counts as unchanged (hooked where later uses read it: for a caller's view, the node
autograd rebuilds for it after the write); otherwise as written (a leaf's gradient
accumulator then takes the place of the node). An input the call
modified in place takes its gradient from the node that produced it (the view's own node
has left the graph); an input that is a part of a larger tensor (``h[0:2]``, ``x.t()[1]``),
whose write rebases that whole tensor, takes its part of the whole tensor's gradient, at
the node that produced the whole tensor (``output``) and at the write's node (``input``).
An input handed back unchanged takes, in both slots, the gradient w.r.t. the returned
tensor, hooked on the edge the view read from: the node that produced
the caller's tensor (the caller's own view node for a user view such as ``x.view_as(x)``
or ``x.t()``), or the gradient accumulator of a leaf. When that node is itself the view
node of an enclosing call that hands the tensor back unchanged too (``nn.Dropout(0.0)``
around ``F.dropout``), the enclosing call moves the nested call's hooks along with its own
(``Node.metadata`` carries them), at any depth; so does an enclosing call that writes the
view in place (``y = self.drop(x); y.mul_(2)``: the hooks go where the written input's
gradient is taken), and one that hands back a view written in place by a call nested in it
(that call's output hook goes to the caller's tensor's new node). A moved hook's old
copy is disabled: the view's node may stay in the graph (the call used the view besides
handing it back, or before writing it) and then sees only that use's part of the gradient.

Deliberate approximations of an identity: since the caller's tensor *is* the returned
one, other uses of it (before or after the call) cannot be told apart, and both slots
hold its whole gradient. ``torch.autograd.grad(..., inputs=[t])`` stops at ``t`` without
running the node that produced it: an identity of ``t`` misses that pass (a later pass
through the node, such as a double backward's, then supplies its entry). A recomputed
identity (non-reentrant ``torch.utils.checkpoint``) hooks nodes of the original graph, so
it gets a backward entry as well as the original call.

An entry is complete when every input view has seen its gradient (or, with no input
views, every output view); entries left incomplete are emitted at step end.
"""
from __future__ import annotations

import weakref
from functools import partial
from typing import Any, Callable, Optional

import torch

from msprobe.core.values import object_items, restore_swaps, swap_in_place
from msprobe.pytorch.leaves import is_structseq
from msprobe.pytorch.stats import PLAIN_TYPES
from store.records import Call, Leaf, null_leaf

Path = tuple


class PendingBackward:
    """The gradients of one forward call, collected while backward runs."""

    __slots__ = ("step", "name", "kind", "api_type", "parent", "stack_id", "keys",
                 "in_slots", "out_slots", "grads_in", "grads_out",
                 "expect_in", "expect_out", "fired_in", "fired_out", "done", "keep", "__weakref__")

    def __init__(self, *, step: int, name: str, kind: str, api_type: str,
                 parent: Optional[str], stack_id: Optional[int], keys: tuple[str, ...]) -> None:
        self.step, self.name, self.kind, self.api_type = step, name, kind, api_type
        self.parent, self.stack_id, self.keys = parent, stack_id, keys
        self.in_slots: list[tuple[Path, bool]] = []   # backward "input": forward outputs
        self.out_slots: list[tuple[Path, bool]] = []  # backward "output": forward inputs
        self.grads_in: dict[Path, Leaf] = {}
        self.grads_out: dict[Path, Leaf] = {}
        self.expect_in = self.expect_out = 0
        self.fired_in = self.fired_out = 0
        self.done = False
        self.keep: tuple = ()  # leaf gradient accumulators hooked (see BackwardTaps._place)

    def to_call(self) -> Call:
        leaves: list[Leaf] = []
        if "input" in self.keys:
            _fill(leaves, "input", self.in_slots, self.grads_in)
        if "output" in self.keys:
            _fill(leaves, "output", self.out_slots, self.grads_out)
        return Call(step=self.step, kind=self.kind, name=self.name, api_type=self.api_type,
                    parent=self.parent, stack_id=self.stack_id, keys=self.keys, leaves=tuple(leaves))


def _fill(out: list[Leaf], io: str, slots: list[tuple[Path, bool]], grads: dict[Path, Leaf]) -> None:
    for path, _ in slots:
        leaf = grads.get(path)
        out.append(leaf if leaf is not None else null_leaf(io, path))


def _producer(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose autograd node an in-place change of ``t`` leaves in the graph:
    ``t`` itself, or its base when ``t`` is a same-shape view of it (the views msprobe
    itself inserts); a view of part of a larger base has no such node (gradients of the
    base are not the input's)."""
    if t._is_view():
        base = t._base
        if base is not None and base.shape == t.shape and base.stride() == t.stride():
            return base
        return t
    return t


def _edge(vnode) -> tuple:
    """``(node, output_nr)`` of the tensor that the view whose node is ``vnode`` (one of our
    ``t.view_as(t)``) reads from: ``t``'s own node, or its gradient accumulator when ``t``
    is a leaf."""
    return vnode.next_functions[0]


def _rebased(orig: torch.Tensor, node) -> bool:
    """Whether a write to the view of ``orig`` (its version changed) moved ``orig`` to a
    new autograd node: False when ``node``, the one that produced it before the call, still
    does (the write ran under ``torch.no_grad``: for autograd the call handed ``orig`` back
    unchanged) or ``orig`` is a leaf (autograd refuses in-place writes to a leaf that
    requires grad, so only a no_grad write can have changed it). A part of a larger base
    (``h[1:3]``) written under no_grad gives True (autograd rebuilt its own view node);
    :meth:`BackwardTaps.tap_outputs` tells it apart by its base's node, left unchanged."""
    return node is not None and _producer(orig).grad_fn is not node


#: the C method behind ``Tensor.view_as``: for plain tensors the recorder calls it directly,
#: not through the API wrapper that ``support_wrap_ops.yaml`` puts on ``torch.Tensor.view_as``
#: (which would only see the busy flag and pass the call on; ~1.7 µs per view saved)
_VIEW_AS = torch._C.TensorBase.view_as
#: the C functions that cut a part out of a base's gradient (:func:`_on_part`)
_AS_STRIDED = torch._C.TensorBase.as_strided
_COPY = torch._C.TensorBase.copy_
_EMPTY_STRIDED = torch._C._VariableFunctions.empty_strided

_STRIDED = torch.strided
#: the type of a leaf's gradient accumulator node (None where torch._C does not name it)
_ACCUMULATE_GRAD = getattr(getattr(torch._C, "_functions", None), "AccumulateGrad", None)
_MOVABLE = "msprobe.movable"  # Node.metadata key: hooks to move when the node leaves the graph


def _wants_grad(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad and t.layout == torch.strided


class TapState:
    """What :meth:`BackwardTaps.tap_inputs` substituted for one call."""

    __slots__ = ("views", "originals", "swaps")

    def __init__(self) -> None:
        # (list, index, view put there, caller's element) of the caller's lists changed in
        # place (tap_inputs with in_place): BackwardTaps.restore puts the elements back
        self.swaps: list[tuple] = []
        # (view, view's node, node producing the caller's tensor (or its same-shape base),
        #  its output_nr, version before the call, slot paths)
        self.views: list[tuple] = []
        self.originals: dict[int, torch.Tensor] = {}  # id(view) -> caller's tensor


class BackwardTaps:
    """Installs the views and node hooks of one call.

    Args:
        on_grad: ``on_grad(pending, side, paths, grad)`` records one gradient for the
            slots ``paths``: ``side`` is ``"input"`` (w.r.t. a forward output) or
            ``"output"`` (w.r.t. a forward input).
    """

    def __init__(self, on_grad: Callable[[PendingBackward, str, list, Optional[torch.Tensor]], None]) -> None:
        self._on_grad = on_grad

    @staticmethod
    def active() -> bool:
        """Whether autograd records now (grad mode on, not inference mode, no functorch)."""
        return (torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
                and not torch._C._are_functorch_transforms_active())

    def tap_inputs(self, pending: PendingBackward, args: tuple, kwargs: dict, *,
                   share: bool, in_place: bool = False) -> tuple[tuple, dict, TapState]:
        """Replace grad-requiring tensors in ``args``/``kwargs`` by views.

        Args:
            share: one view per distinct tensor, so ``a is b`` inside the call stays true
                (``F.multi_head_attention_forward(h, h, h)`` takes its self-attention path
                only when query is key); a tensor passed twice then reports its combined
                gradient in both slots (``x * x``: ``2·x·g`` in each). False gives every
                slot its own view and gradient, for calls known not to test identity.

            in_place: lists (the caller's own objects, which the call may change, such as
                a module appending to a list it was given) get the views in place, not a
                copy; :meth:`restore` puts the caller's elements back after the call.

        Returns ``(args, kwargs, state)``; containers without substituted tensors are
        returned as the same objects.
        """
        state = TapState()
        state_swaps = state.swaps if in_place else None
        memo: Optional[dict] = {} if share else None
        new_args = []
        changed = False
        for i, a in enumerate(args):
            b = self._map_in(pending, a, (i,), memo, state, 0, state_swaps)
            changed |= b is not a
            new_args.append(b)
        pos = len(args)
        new_kwargs = kwargs
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                b = self._map_in(pending, v, (pos,), memo, state, 0, state_swaps)
                pos += 1
                if b is not v:
                    if new_kwargs is kwargs:
                        new_kwargs = dict(kwargs)
                    new_kwargs[k] = b
        return (tuple(new_args) if changed else args), new_kwargs, state

    def _map_in(self, pending, value, path, memo, state, depth, swaps=None):
        if isinstance(value, torch.Tensor):
            pending.out_slots.append((path, True))
            if not (value.requires_grad and value.layout is _STRIDED):  # _wants_grad, inlined
                return value
            known = memo.get(id(value)) if memo is not None else None
            if known is not None:
                known[5].append(path)
                return known[0]
            view = _VIEW_AS(value, value) if type(value) in PLAIN_TYPES else value.view_as(value)
            paths = [path]
            src = _producer(value)
            vnode = view.grad_fn
            entry = (view, vnode, src.grad_fn, src.output_nr, view._version, paths)
            if memo is not None:
                memo[id(value)] = entry
            state.views.append(entry)
            state.originals[id(view)] = value
            self._hook(vnode, 0, pending, "output", paths)
            return view
        if depth < 4 and isinstance(value, (list, tuple)) and value and not hasattr(value, "_fields"):
            items = [self._map_in(pending, v, path + (j,), memo, state, depth + 1, swaps)
                     for j, v in enumerate(value)]
            if all(x is y for x, y in zip(items, value)):
                return value
            if swaps is not None and isinstance(value, list):  # the caller's list itself
                return swap_in_place(value, items, swaps)
            return type(value)(items) if isinstance(value, list) or type(value) is tuple else value
        if depth < 4 and isinstance(value, dict) and value:
            # paths as the forward record has them (object_items)
            entries = object_items(value)
            new = {k: self._map_in(pending, v, path + (text,), memo, state, depth + 1, swaps)
                   for text, k, v in entries}
            if all(new[k] is v for _, k, v in entries):
                return value
            if swaps is not None:  # the caller's dict itself, its values back after the call
                return swap_in_place(value, new, swaps)
            try:
                return type(value)(new)
            except Exception:  # noqa: BLE001 - a dict type that cannot be built from a dict
                return new
        pending.out_slots.append((path, False))
        return value

    @staticmethod
    def restore(state: Optional[TapState]) -> None:
        """Put the caller's elements back into the lists :meth:`tap_inputs` changed in place
        (where the call left the view in its place); idempotent."""
        if state is not None and state.swaps:
            restore_swaps(state.swaps)

    def tap_outputs(self, pending: PendingBackward, out: Any, state: Optional[TapState]) -> Any:
        """Hook the autograd nodes that produced the grad-requiring outputs (the outputs
        themselves are handed back unchanged; a call that returned our input view, in
        place or unchanged, hands back the caller's tensor). Inputs the call modified in
        place are re-hooked on the node that produced them, whose gradient is theirs; an
        input handed back unchanged takes the gradient w.r.t. the returned tensor."""
        state = state or TapState()
        # id(view) -> (view's node, slot paths, the view if written under no_grad) of views
        # not written where autograd sees it
        unchanged: dict = {}
        quiet: Optional[list] = None  # views written where autograd does not see it (no_grad)
        parts: Optional[dict] = None  # id(view) -> (base, part) of parts whose base a write rebased
        for view, vnode, node, nr, version, paths in state.views:
            if view._version == version:
                unchanged[id(view)] = (vnode, paths, None)
            elif not _rebased(state.originals[id(view)], node):
                # handed back, the call is an identity for autograd (the view's node leaves
                # the graph); otherwise its node may be gone too (a use after the write
                # reads a new node over the base's): as a written input below
                unchanged[id(view)] = (vnode, paths, view)
                quiet = quiet or []
                quiet.append((view, vnode, node, nr, paths, None))
            else:  # the view's node left the graph when it was modified
                # with the hooks of calls nested in this one that handed it back unchanged
                orig = state.originals[id(view)]
                part = _part_edge(orig, node, vnode)
                if part is not None:  # a part of a larger base: its slice of the base's gradient
                    node, nr, part = part
                    if orig._base.grad_fn is None or orig._base.grad_fn is node:
                        # the base was not rebased: a write under no_grad (which only
                        # rebuilt the part's own view node). Handed back, an identity for
                        # autograd like a whole tensor's; otherwise the part of the base's
                        # gradient (below)
                        unchanged[id(view)] = (vnode, paths, view)
                        quiet = quiet or []
                        quiet.append((view, vnode, node, nr, paths, part))
                        continue
                    parts = parts or {}
                    parts[id(view)] = (orig._base, part)
                self._adopt(vnode, node, nr, part)
                self._move(node, nr, pending, "output", paths, True, part)
        top = () if (isinstance(out, (list, tuple)) and not hasattr(out, "_fields")) or is_structseq(out) else (0,)
        returned: dict = {}
        result = self._map_out(pending, out, top, state.originals, 0, unchanged, returned, parts)
        for view, vnode, node, nr, paths, part in quiet or ():
            if id(view) not in returned:
                if node is None:  # a leaf: its gradient accumulator
                    node, nr = _edge(vnode)
                self._adopt(vnode, node, nr, part)
                self._move(node, nr, pending, "output", paths, True, part)
        for vnode, paths, written, node, nr in returned.values():
            # returned unchanged (dropout with p=0, nn.Identity): the caller gets its own
            # tensor back and the view's node leaves the graph, so the gradient w.r.t. this
            # input is the one w.r.t. that tensor, taken where the output's is taken
            # calls nested in this one that handed the view back unchanged hooked the
            # view's node: their hooks move with this call's to where the tensor was produced
            self._adopt(vnode, node, nr)
            if written is not None and written.grad_fn is not vnode:
                # written under no_grad: autograd rebuilt the view's node, where calls
                # nested in this one that handed the view back hooked
                self._adopt(written.grad_fn, node, nr)
            self._move(node, nr, pending, "output", paths, movable=True)
        return result

    def _map_out(self, pending, value, path, originals, depth, unchanged, returned, parts):
        if isinstance(value, torch.Tensor):
            orig = originals.get(id(value))
            if orig is not None:  # the call returned our input view (in place or unchanged)
                same = unchanged.get(id(value))
                if same is not None:
                    # handed back unchanged: hook the edge the view reads from, i.e. the
                    # node that produced the caller's tensor (an accumulator for a leaf);
                    # a caller's view written under no_grad: the node autograd rebuilds
                    # for it, which its later uses read
                    vnode, paths, written = same
                    if written is not None and orig._is_view():
                        node, nr = orig.grad_fn, orig.output_nr
                    else:
                        node, nr = _edge(vnode)
                    returned[id(value)] = (vnode, paths, written, node, nr)
                    pending.in_slots.append((path, True))
                    self._hook(node, nr, pending, "input", [path], movable=True)
                    return orig
                # written in place: the caller's tensor now ends in the write's node; hooks
                # that nested calls (the write itself) placed on the view's node move there.
                # A part of a larger base: its part of the base's gradient, taken at the
                # base's node after the write (the part's own node sees only its own uses)
                node, nr, part = orig.grad_fn, orig.output_nr, None
                written = parts.get(id(value)) if parts else None
                if written is not None:  # autograd saw the write (tap_outputs): the base's node after it
                    node, nr, part = written[0].grad_fn, written[0].output_nr, written[1]
                if value.grad_fn is not None and node is not None:
                    self._adopt(value.grad_fn, node, nr, part)
                self._hook_written(pending, orig, path, node, nr, part)
                return orig
            pending.in_slots.append((path, True))
            if _wants_grad(value) and value.grad_fn is not None:
                self._hook(value.grad_fn, value.output_nr, pending, "input", [path])
            return value
        if depth < 4 and isinstance(value, (list, tuple, dict)):
            if isinstance(value, dict):
                entries = object_items(value)
                keys = [text for text, _, _ in entries]
                vals = [v for _, _, v in entries]
            else:
                fields = None if is_structseq(value) else getattr(value, "_fields", None)
                keys = [str(f) for f in fields] if fields is not None else list(range(len(value)))
                vals = list(value)
            items = [self._map_out(pending, v, path + (k,), originals, depth + 1, unchanged, returned, parts)
                     for k, v in zip(keys, vals)]
            if all(x is y for x, y in zip(items, vals)):
                return value
            if isinstance(value, dict):
                try:
                    return type(value)(zip((k for _, k, _ in entries), items))
                except Exception:
                    return dict(zip((k for _, k, _ in entries), items))
            if isinstance(value, list):
                return items
            if hasattr(value, "_fields") and not is_structseq(value):
                return type(value)(*items)
            return type(value)(items)
        pending.in_slots.append((path, False))
        return value

    def _hook_written(self, pending: PendingBackward, orig: torch.Tensor, path: Path, node, nr: int,
                      part: Optional[tuple]) -> None:
        """The backward ``input`` slot of an output that is an input written in place,
        hooked at output ``nr`` of ``node`` (``part``: see :func:`_part_edge`)."""
        pending.in_slots.append((path, True))
        if _wants_grad(orig) and node is not None:
            self._hook(node, nr, pending, "input", [path], movable=True, part=part)

    def _hook(self, node, index: int, pending: PendingBackward, side: str, paths: list,
              movable: bool = False, part: Optional[tuple] = None) -> None:
        if node is None:
            return
        if side == "output":
            pending.expect_out += 1
        else:
            pending.expect_in += 1
        self._place(node, index, pending, side, paths, movable, part)

    def _adopt(self, left, node, index: int, part: Optional[tuple] = None) -> None:
        """Move the movable hooks (see :meth:`_place`) placed on ``left``, a view's node that
        left the graph, to output ``index`` of ``node`` (``part``: see :func:`_part_edge`;
        a hook that has its own keeps it)."""
        for pending, side, paths, movable, own in left.metadata.pop(_MOVABLE, ()):
            self._move(node, index, pending, side, paths, movable, own if own is not None else part)

    def _move(self, node, index: int, pending: PendingBackward, side: str, paths: list,
              movable: bool = False, part: Optional[tuple] = None) -> None:
        """Move a hook placed on a view's node to ``node``. The view's node may stay in the
        graph (the call used the view before writing it, or besides handing it back): the
        old hook's ``paths`` list is emptied, so it neither records nor counts when it fires;
        the new hook counts in its place, with the whole gradient of the tensor."""
        moved = list(paths)
        paths.clear()
        self._place(node, index, pending, side, moved, movable, part)

    def _place(self, node, index: int, pending: PendingBackward, side: str, paths: list,
               movable: bool = False, part: Optional[tuple] = None) -> None:
        on_grad = self._on_grad if part is None else partial(_on_part, self._on_grad, part)
        if type(node) is _ACCUMULATE_GRAD or (_ACCUMULATE_GRAD is None and type(node).__name__ == "AccumulateGrad"):
            # a leaf's gradient accumulator (an input handed back unchanged) lives only while
            # a graph refers to it: the entry keeps it, so that later uses of the leaf reach
            # it, and its hook refers to the entry weakly: no cycle through the node that
            # the garbage collector cannot see (it would keep the leaf and the entry alive)
            pending.keep += (node,)
            node.register_prehook(partial(_weak_prehook, on_grad, weakref.ref(pending),
                                          side, paths, index))
            return
        # a partial, not a closure: 2 objects for the garbage collector to track instead
        # of 7 (function, closure tuple, 5 cells), alive from the forward to the backward
        node.register_prehook(partial(_prehook, on_grad, pending, side, paths, index))
        if movable:
            # a hook on the caller's tensor of an input handed back or written: should
            # ``node`` be an enclosing call's view node, that call moves it when the view
            # leaves the graph (handed back unchanged or written in place there too)
            node.metadata.setdefault(_MOVABLE, []).append((pending, side, paths, True, part))


def _part_edge(orig: torch.Tensor, node, vnode) -> Optional[tuple]:
    """Where the gradient w.r.t. ``orig`` before a call wrote it in place is found when
    ``orig`` is a part of a larger base (a view of another shape, such as ``h[0:2]``): its
    own node ``node`` left the graph (the write rebased the base), so the gradient is the
    part of the base's gradient at the node that produced the base before the call (found
    by following, from the base's node, the first input of the nodes created since the
    call's view node ``vnode``: the writes), or at the base's accumulator for a leaf.

    Returns ``(node, output_nr, part)``, ``part`` being ``(size, stride, offset, base size,
    base stride)`` of ``orig`` in the base (:func:`_on_part`), or None for any other tensor.
    """
    if node is None or not orig._is_view() or _producer(orig) is not orig:
        return None
    base = orig._base
    if base is None:
        return None
    part = (tuple(orig.shape), orig.stride(), orig.storage_offset() - base.storage_offset(),
            tuple(base.shape), base.stride())
    if base.grad_fn is None:  # a leaf (written under no_grad): its accumulator, below orig's views
        edge = (node, 0)
        for _ in range(64):
            if edge[0] is None or type(edge[0]).__name__ == "AccumulateGrad":
                break
            if not edge[0].next_functions:
                return None
            edge = edge[0].next_functions[0]
    else:
        seq = vnode._sequence_nr()
        edge = (base.grad_fn, base.output_nr)
        for _ in range(64):
            if edge[0] is None or edge[0]._sequence_nr() < seq or not edge[0].next_functions:
                break
            edge = edge[0].next_functions[0]
    if edge[0] is None or (edge[0]._sequence_nr() >= vnode._sequence_nr()
                           and type(edge[0]).__name__ != "AccumulateGrad"):
        return None
    return edge[0], edge[1], part


def _on_part(on_grad, part: tuple, pending: PendingBackward, side: str, paths: list,
             grad: Optional[torch.Tensor]) -> None:
    """``on_grad`` with the part ``part`` (see :func:`_part_edge`) of the base's gradient."""
    if grad is not None:
        size, stride, offset, base_size, base_stride = part
        # the C functions, not the torch.* / Tensor.* names the API hooks wrap: the recorder
        # is not busy here, a wrapped call would be recorded as the user's
        with torch.no_grad():
            if tuple(grad.shape) != base_size:
                grad = None
            else:
                if grad.stride() != base_stride:
                    grad = _COPY(_EMPTY_STRIDED(base_size, base_stride, dtype=grad.dtype, device=grad.device),
                                 grad)
                grad = _AS_STRIDED(grad, size, stride, grad.storage_offset() + offset)
    on_grad(pending, side, paths, grad)



def _weak_prehook(on_grad, ref: "weakref.ref[PendingBackward]", side: str, paths: list, index: int,
                  grad_outputs: tuple) -> None:
    """:func:`_prehook` for an entry held weakly; the entry releases its kept nodes once done."""
    pending = ref()
    if pending is not None:
        _prehook(on_grad, pending, side, paths, index, grad_outputs)
        if pending.done:
            pending.keep = ()


def _prehook(on_grad, pending: PendingBackward, side: str, paths: list, index: int,
             grad_outputs: tuple) -> None:
    """Node pre-hook body: hand ``grad_outputs[index]`` (None when absent) to ``on_grad``;
    a hook whose ``paths`` were emptied (moved elsewhere, :meth:`BackwardTaps._move`) does nothing."""
    if paths:
        on_grad(pending, side, paths, grad_outputs[index] if index < len(grad_outputs) else None)

