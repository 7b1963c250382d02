"""Backward recording on the autograd graph as it is: hooks on nodes that exist anyway.

For one recorded call (an API or a module forward) nothing is substituted: the call runs
on the caller's own objects, and no autograd node is added. So the graph, and with it the
order in which autograd adds up the gradient of a tensor that several operations consume,
is the one of an unrecorded run. (An identity node between a tensor and *some* of its
consumers, as ``register_full_backward_hook`` or a ``view_as`` per input inserts, groups
those consumers' gradients into a partial sum first: the float sum changes in its last bits
wherever a residual branch sits next to a module that reads its input twice.)

At the call's start the recorder notes autograd's next sequence number and, for each
distinct grad-requiring tensor argument, the edge autograd reads it through (the node that
produced it and the output index, or its gradient accumulator for a leaf). At the call's
end, the nodes the call created are found by walking the graph from the outputs (and from
inputs written in place) through nodes whose sequence numbers lie in the call's range
(sequence numbers are per thread; the walk never leaves the call's own nodes). Then:

* backward ``output[i]`` (the gradient w.r.t. forward input ``i`` contributed by this call,
  spec section 9 fix 3): the sum of the gradients that the call's own nodes send along the
  input's edge, read by post-hooks on those nodes. One tensor in several argument slots
  (``attn(y, y, y)``, ``x * x``) has one edge: every such slot holds the same combined
  gradient, and the record of each later slot names the first one
  (``{"alias_of": "output.0", ...}``, :func:`msprobe.pytorch.recorder.alias_leaf`).
* backward ``input[j]`` (the gradient w.r.t. forward output ``j`` as the caller received
  it): the gradient at the node that produced the output (that node's post-hook, or a
  pre-hook of a leaf's accumulator), less what the call's own nodes that consume the
  output sent there (a module returning ``l`` and ``l.tanh()``). That difference is
  computed in the gradient's dtype after autograd's sum, so it equals the caller's part up
  to one rounding of that sum.

An input the call wrote in place (``x.add_(1)``, ``nn.ReLU(inplace=True)``) is read by the
node of the write, which the walk reaches from the input's new node: its gradient is the
one w.r.t. the value before the write. An input that is a part of a larger tensor
(``h[0:2]``) whose write rebased that tensor takes its part of the gradient the write's
node sends to the larger tensor. A call that hands an input back unchanged (dropout with
p=0, ``nn.Identity``, a write under ``torch.no_grad``) creates no node for it: its
``output`` slot then holds the gradient w.r.t. the returned tensor, the same as ``input``
(other uses of that tensor before or after the call cannot be told apart from the call's).

When one call's node is a single node that both produces the outputs and reads the inputs
(most API calls), one post-hook on it gives both sides of the entry.

An entry is complete when every input's gradient has arrived (or, with none expected,
every output's); entries left incomplete are emitted at step end with what arrived (a
consumer node autograd never ran sent no gradient: the sum of the others is the call's).

Several backward passes over one graph in a step (``backward(retain_graph=True)`` then
another loss's ``backward()``; ``torch.autograd.grad(..., create_graph=True)`` then
``backward()``, as gradient penalties do): each gradient is collected per pass (autograd's
graph task id tells the passes apart) and the entry holds the sum over the passes, what
``.grad`` would accumulate. The entry is written when its first pass completes and written
again, under the same name, when a later pass completes (or at step end): in dump.json the
later record replaces the earlier one. Summing needs the earlier passes' gradients: they
are kept (not copied) while a pass that retains the graph runs (``retain_graph`` or
``create_graph`` given to ``torch.autograd.backward``/``grad``, which msprobe's guard
sees, :func:`retaining`), until step end. A later pass over an entry whose earlier
gradients were not kept is reported once (``on_lost``) and leaves the entry as it was.
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable, Optional

import torch

from msprobe.core.values import object_items
from msprobe.pytorch.leaves import is_structseq
from msprobe.core.recorder import PendingBackward as CorePendingBackward

Path = tuple

#: autograd's next sequence number in this thread (None where torch lacks the function:
#: then no node can be attributed to a call and backward entries are not recorded)
_NEXT_SEQUENCE_NR = getattr(getattr(torch._C, "_autograd", None), "_get_sequence_nr", None)
_get_gradient_edge = getattr(torch.autograd.graph, "get_gradient_edge", None)
#: the C functions the taps compute with: not the torch.* / Tensor.* names the API hooks
#: wrap (the recorder is not busy inside autograd's hooks; a wrapped call would be recorded)
_ADD = torch._C._VariableFunctions.add
_SUB = torch._C._VariableFunctions.sub
_AS_STRIDED = torch._C.TensorBase.as_strided
_COPY = torch._C.TensorBase.copy_
_EMPTY_STRIDED = torch._C._VariableFunctions.empty_strided

_STRIDED = torch.strided
#: the type of a leaf's gradient accumulator node (None where torch._C does not name it)
_ACCUMULATE_GRAD = getattr(getattr(torch._C, "_functions", None), "AccumulateGrad", None)
#: the running graph task's id (-1 outside backward); None where torch lacks it
_GRAPH_TASK_ID = getattr(torch._C, "_current_graph_task_id", None)
#: how many backward passes that retain their graph are running (msprobe.pytorch.autograd_guard)
_RETAINING = [0]
#: the slot paths ``(i,)`` of top-level arguments, made once
_INDEX_PATHS = tuple((i,) for i in range(64))


def retaining(delta: int) -> None:
    """A backward pass that retains its graph starts (``delta`` 1) or ends (-1): while one
    runs, delivered gradients are kept for a later pass's sum."""
    _RETAINING[0] += delta


def graph_task_id() -> int:
    """The id of the backward pass (autograd graph task) running in this thread, -1 outside one."""
    return _GRAPH_TASK_ID() if _GRAPH_TASK_ID is not None else -1


#: nesting depth of argument containers whose tensors get backward slots
_MAX_DEPTH = 4
#: argument types that hold no tensor (no container walk)
_SCALARS = frozenset((int, float, bool, complex, str, type(None), torch.dtype, torch.device))


#: task kinds (:func:`_consumers`, :class:`_NodeHook`): the gradient w.r.t. a forward output
#: at its node (``out``), at a part of a rebased base (``outpart``); what a node of the call
#: sends along an input's edge (``in``), a part of it (``part``), or to an output's edge
#: (``internal``, subtracted from that output's gradient)
_OUT, _OUTPART, _IN, _PART, _INTERNAL = "out", "outpart", "in", "part", "internal"


def _is_accumulator(node: Any) -> bool:
    return type(node) is _ACCUMULATE_GRAD or (_ACCUMULATE_GRAD is None and type(node).__name__ == "AccumulateGrad")


class _Grad:
    """One gradient an entry waits for: of one distinct input tensor (``side`` ``"output"``)
    or of one distinct output edge (``side`` ``"input"``).

    ``need``: contributions still to come; ``total``: their running sum; ``internal``: for an
    output, the running sum of what the call's own nodes sent to it (subtracted);
    ``copies``: input records that take this output's gradient (inputs handed back
    unchanged). Per backward pass: ``need0`` contributions are expected, ``task`` is the
    graph task id of the pass being collected; ``cum`` the sum delivered over the passes
    so far (None: no gradient yet, or not kept), ``kept`` whether it was kept (the last
    delivering pass retained its graph), ``passes`` how many were delivered."""

    __slots__ = ("side", "paths", "need", "total", "internal", "copies", "seen", "delivered",
                 "need0", "task", "cum", "kept", "passes")

    def __init__(self, side: str, paths: list) -> None:
        self.side, self.paths = side, paths
        self.need = 0
        self.total: Optional[torch.Tensor] = None
        self.internal: Optional[torch.Tensor] = None
        self.copies: tuple = ()
        self.seen = False  # some contribution arrived (maybe None: no gradient along it)
        self.delivered = False
        self.need0 = 0
        self.task: Optional[int] = None
        self.cum: Optional[torch.Tensor] = None
        self.kept = False
        self.passes = 0


class PendingBackward(CorePendingBackward):
    """The gradients of one forward call, collected while backward runs
    (:class:`msprobe.core.recorder.PendingBackward`, same arguments).

    ``open`` holds every gradient the entry collects (:meth:`BackwardTaps.settle` delivers
    what those of the current pass have summed so far); ``expect_in``/``expect_out`` count
    the gradients expected per side and ``fired_in``/``fired_out`` those arrived in the
    pass ``task`` (a graph task id); ``keep`` holds the leaf gradient accumulators hooked
    (see ``BackwardTaps._hook_accumulator``); ``emitted``: the entry was written;
    ``dirty``: a gradient arrived since."""

    __slots__ = ("open", "expect_in", "expect_out", "fired_in", "fired_out", "keep", "task", "emitted",
                 "dirty", "__weakref__")

    def __init__(self, **fields: Any) -> None:
        super().__init__(**fields)
        self.open: tuple = ()
        self.expect_in = self.expect_out = 0
        self.fired_in = self.fired_out = 0
        self.keep: tuple = ()
        self.task: Optional[int] = None
        self.emitted = self.dirty = False

    def holds_sums(self) -> bool:
        """Whether a later backward pass can still be added to this entry (some gradient
        was kept)."""
        return any(rec.kept for rec in self.open)


class TapState:
    """What :meth:`BackwardTaps.tap_inputs` noted of one call's inputs.

    ``start``: autograd's next sequence number when the call began; ``inputs``: per
    distinct grad-requiring input tensor, ``[tensor, its node (None for a leaf), output
    index, slot paths, record]``."""

    __slots__ = ("start", "inputs")

    def __init__(self, start: int) -> None:
        self.start = start
        self.inputs: dict[int, list] = {}


class BackwardTaps:
    """Notes one call's inputs and hooks the autograd nodes of its backward.

    Args:
        on_grad: ``on_grad(pending, side, paths, grad)`` records one gradient for the
            slots ``paths``: ``side`` is ``"input"`` (w.r.t. a forward output) or
            ``"output"`` (w.r.t. a forward input).
    """

    def __init__(self, on_grad: Callable[..., None],
                 on_lost: Optional[Callable[[PendingBackward], None]] = None) -> None:
        """``on_grad(pending, side, paths, grad, count=True)``: ``count`` False for a pass's
        partial sum delivered when the next pass begins. ``on_lost(pending)``: a gradient of
        ``pending`` arrived that cannot be recorded (a later pass whose earlier sum was not
        kept, or the entry was closed: its step ended)."""
        self._on_grad = on_grad
        self._on_lost = on_lost

    @staticmethod
    def active() -> bool:
        """Whether autograd records now (grad mode on, not inference mode, no functorch)."""
        return (_NEXT_SEQUENCE_NR is not None and torch.is_grad_enabled()
                and not torch.is_inference_mode_enabled()
                and not torch._C._are_functorch_transforms_active())

    # --- the call's start ------------------------------------------------------------------
    def tap_inputs(self, pending: PendingBackward, args: tuple, kwargs: dict) -> TapState:
        """Note the backward ``output`` slots of ``args``/``kwargs`` (``input_args`` paths,
        then tensor kwargs in kwarg order) and the edge of each grad-requiring tensor;
        call before the call runs. The arguments are not changed."""
        state = TapState(_NEXT_SEQUENCE_NR())
        for i, a in enumerate(args):
            self._note_in(pending, a, _INDEX_PATHS[i] if i < 64 else (i,), state, 0)
        pos = len(args)
        for v in kwargs.values():
            if isinstance(v, torch.Tensor):
                self._note_in(pending, v, _INDEX_PATHS[pos] if pos < 64 else (pos,), state, 0)
                pos += 1
        return state

    def _note_in(self, pending: PendingBackward, value: Any, path: Path, state: TapState, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            pending.out_slots.append(path)
            if not (value.requires_grad and value.layout is _STRIDED):
                return
            known = state.inputs.get(id(value))
            if known is not None:
                known[3].append(path)
                return
            state.inputs[id(value)] = [value, value.grad_fn, value.output_nr, [path], None]
            return
        items = _items(value) if depth < _MAX_DEPTH and type(value) not in _SCALARS else None
        if items:
            for k, v in items:
                self._note_in(pending, v, path + (k,), state, depth + 1)
            return
        pending.out_slots.append(path)

    # --- the call's end --------------------------------------------------------------------
    def tap_outputs(self, pending: PendingBackward, out: Any, state: Optional[TapState],
                    shared: Optional[dict] = None) -> None:
        """Note the backward ``input`` slots of ``out`` and hook the nodes whose gradients
        make the entry; call after the call returned.

        ``shared``: ``{node: its last _NodeHook}`` of the recorded module forward running
        in this thread (kept by its outermost frame, None outside one): a node hooked
        for an entry before, inside that forward, gets no second hook; its hook runs the
        new entry's tasks after the earlier ones (one hook per node)."""
        if state is None:
            return
        end = _NEXT_SEQUENCE_NR()
        start = state.start
        outs: dict = {}  # (id(node) or leaf id, nr, geometry) -> [node or None, nr, tensor, paths, geometry]
        top = () if (isinstance(out, (list, tuple)) and not hasattr(out, "_fields")) or is_structseq(out) else _INDEX_PATHS[0]
        self._note_out(pending, out, top, outs, state, 0)

        # edge -> [(kind, record)]: a node's edge is (node, output index), a leaf's (id(leaf), -1)
        targets: dict = {}
        roots: list = []
        returned: dict = {}      # id(returned tensor) -> its output record
        out_records = []
        for node, nr, tensor, paths, geometry in outs.values():
            rec = _Grad("input", tuple(paths))
            out_records.append((node, rec, nr, tensor, geometry))
            if id(tensor) not in returned:
                returned[id(tensor)] = rec
            if node is not None and start <= node._sequence_nr() < end:
                roots.append(node)
                if geometry is None:
                    targets.setdefault((node, nr), []).append((_INTERNAL, rec))
        in_records = []
        for entry in state.inputs.values():
            t, node, nr, paths, _ = entry
            rec = entry[4] = _Grad("output", tuple(paths))
            in_records.append(rec)
            if t._is_view() and t._base is not None:
                part = _base_edge(t, start, end)  # (base's old node, nr, geometry) when rebased
                written = part is not None
            else:
                part, written = None, t.grad_fn is not node
            same = returned.get(id(t))
            if same is not None and not written:
                same.copies += (rec,)  # handed back unchanged: the returned tensor's gradient
                rec.need = 1
                continue
            targets.setdefault((id(t), -1) if node is None else (node, nr), []).append((_IN, rec))
            if not written:
                continue
            if part is None:
                roots.append(t.grad_fn)  # written in place: the write's node reads the old value
                continue
            # a view written in place rebased its base: the write's node sends the base's
            # old value its gradient, of which the view's part is the input's
            base_node, base_nr, geometry = part
            roots.append(t._base.grad_fn)
            targets.setdefault((id(t._base), -1) if base_node is None else (base_node, base_nr),
                               []).append((_PART, (rec, geometry)))

        tasks = _consumers(roots, start, end, targets) if roots else {}
        # the output side: one task per output edge, on the node that produced it
        for node, rec, nr, tensor, geometry in out_records:
            if node is None:
                self._hook_accumulator(tensor, pending, rec)
            else:
                mine = tasks.get(node)
                if mine is None:
                    mine = tasks[node] = []
                mine.append((_OUT, nr, rec) if geometry is None else (_OUTPART, nr, (rec, geometry)))
        for node, node_tasks in tasks.items():
            for kind, _, rec in node_tasks:
                if kind is _IN:
                    rec.need += 1
                elif kind is _PART:
                    rec[0].need += 1
            if len(node_tasks) == 1:
                flat = node_tasks[0]
            else:  # one flat tuple per node, the output side first (see _NodeHook)
                flat = ()
                for first in (True, False):
                    for one in node_tasks:
                        if (one[0] is _OUT or one[0] is _OUTPART) is first:
                            flat += one
            hook = _NodeHook(self, pending, flat)
            if shared is None:
                node.register_hook(hook)
                continue
            last = shared.get(node)
            if last is None:
                node.register_hook(hook)
            else:
                last.next = hook
            shared[node] = hook
        opened = []
        for rec in in_records:
            if rec.need:
                pending.expect_out += 1
                opened.append(rec)
            rec.need0 = rec.need
        for _, rec, _, _, _ in out_records:
            rec.need += 1
            rec.need0 = rec.need
            pending.expect_in += 1
            opened.append(rec)
        pending.open = tuple(opened)
        # the slots are complete: tuples of tuples of ints, which the garbage collector stops tracking
        pending.in_slots = tuple(pending.in_slots)
        pending.out_slots = tuple(pending.out_slots)

    def _note_out(self, pending: PendingBackward, value: Any, path: Path, outs: dict, state: TapState,
                  depth: int) -> None:
        if isinstance(value, torch.Tensor):
            pending.in_slots.append(path)
            if not (value.requires_grad and value.layout is _STRIDED):
                return
            geometry = None
            if id(value) in state.inputs and value._is_view():
                part = _rebased_part(value, state.start, _NEXT_SEQUENCE_NR())
                if part is not None:
                    # an input view written in place: a part of the rebased base, whose
                    # gradient (all later uses of the base) holds the part's
                    node, nr, geometry = value._base.grad_fn, value._base.output_nr, part
            if geometry is None:
                node, nr = value.grad_fn, value.output_nr
            key = (id(node), nr, geometry) if node is not None else (id(value), -1, None)
            known = outs.get(key)
            if known is not None:
                known[3].append(path)
                return
            outs[key] = [node, nr, value, [path], geometry]
            return
        items = _items(value) if depth < _MAX_DEPTH and type(value) not in _SCALARS else None
        if items:
            for k, v in items:
                self._note_out(pending, v, path + (k,), outs, state, depth + 1)
            return
        pending.in_slots.append(path)

    def _hook_accumulator(self, leaf: torch.Tensor, pending: PendingBackward, rec: _Grad) -> None:
        """The gradient w.r.t. a leaf the call returned, at the leaf's accumulator (a
        pre-hook: the accumulator has no outputs)."""
        edge = _get_gradient_edge(leaf) if _get_gradient_edge is not None else None
        node = edge.node if edge is not None else None
        if node is None:
            return
        # the accumulator lives only while a graph refers to it: the entry keeps it, and
        # its hook refers to the entry weakly (no cycle through the node that the garbage
        # collector cannot see: it would keep the leaf and the entry alive)
        pending.keep += (node,)
        node.register_prehook(_LeafHook(self, weakref.ref(pending), rec))

    # --- delivery --------------------------------------------------------------------------
    def _begin(self, pending: PendingBackward, rec: _Grad, task: int) -> None:
        """Start collecting ``rec`` for the backward pass ``task`` (its graph task id) if it
        is a new one (the previous pass's partial sum, if any, is delivered first)."""
        if rec.task == task:
            return
        if rec.task is not None and rec.seen and not rec.delivered:
            self._deliver(pending, rec, task, count=False)
        rec.task = task
        rec.need = rec.need0
        rec.total = rec.internal = None
        rec.seen = rec.delivered = False

    def _add(self, pending: PendingBackward, rec: _Grad, grad: Optional[torch.Tensor], task: int) -> None:
        """One contribution ``grad`` (None: none along that edge) to ``rec`` in the pass ``task``."""
        if rec.task != task:
            self._begin(pending, rec, task)
        if rec.delivered:
            return
        if isinstance(grad, torch.Tensor):
            rec.total = grad if rec.total is None else _sum(rec.total, grad)
        rec.seen = True
        rec.need -= 1
        if rec.need <= 0:
            self._deliver(pending, rec, task)

    def _deliver(self, pending: PendingBackward, rec: _Grad, task: int, count: bool = True) -> None:
        """Deliver ``rec``'s sum for this pass, added to the earlier passes' (``count``
        False: a partial sum delivered late, not counted towards the entry's completion);
        ``task``: the graph task id of the running pass (-1 outside backward)."""
        rec.delivered = True
        grad, rec.total = rec.total, None
        if rec.internal is not None and grad is not None:
            with torch.no_grad():
                grad = _SUB(grad, rec.internal)
        rec.internal = None
        this_pass = grad
        if rec.passes:
            if not rec.kept:  # the earlier passes' sum was not kept: cannot add this one
                if grad is not None and self._on_lost is not None:
                    self._on_lost(pending)
                return
            # a pass that sent no gradient along this edge (not needed there) adds nothing
            grad = rec.cum if grad is None else grad if rec.cum is None else _sum(rec.cum, grad)
        rec.passes += 1
        rec.kept = _RETAINING[0] > 0
        rec.cum = grad if rec.kept else None
        self._on_grad(pending, rec.side, rec.paths, grad, count)
        for copy in rec.copies:
            self._add(pending, copy, this_pass, task)

    def settle(self, pending: PendingBackward) -> None:
        """Deliver what the gradients of ``pending``'s current pass have summed so far (at
        step end: a consumer node autograd did not run contributes nothing); a gradient
        none of whose nodes ran stays missing."""
        task = graph_task_id()
        for rec in list(pending.open):
            if rec.seen and not rec.delivered and not pending.done:
                rec.need = 0
                self._deliver(pending, rec, task)


def _sum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return _ADD(a, b)


def _items(value: Any) -> Optional[list]:
    """``(path component, element)`` of a container whose tensors get slots of their own,
    keyed as the forward record keys them (``msprobe.core.values.walk``): lists and
    tuples (and PyTorch structseqs) by index, dicts by their keys, namedtuples and
    dataclasses by field name; None for anything else or an empty container."""
    if isinstance(value, (list, tuple)):
        if not value:
            return None
        fields = getattr(value, "_fields", None)
        if fields is not None and not is_structseq(value):
            return list(zip((str(f) for f in fields), value))
        return list(enumerate(value))
    if isinstance(value, dict):
        return [(text, v) for text, _, v in object_items(value)] or None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(f.name, getattr(value, f.name, None)) for f in dataclasses.fields(value)] or None
    return None


def _consumers(roots: list, start: int, end: int, targets: dict) -> dict:
    """The tasks of the call's own nodes: walk from ``roots`` through nodes whose sequence
    numbers lie in ``[start, end)``; an edge of such a node that reads a target (an input's
    edge, an output's edge, a written part's base; ``targets`` maps ``(node, output
    index)``, or ``(id(leaf), -1)`` for a leaf's accumulator, to ``(kind, record)`` pairs)
    becomes a task ``(kind, edge index, record)`` of that node. Returns ``{node: tasks}``."""
    tasks: dict = {}
    seen: set = set()
    stack = list(roots)
    accumulate = _ACCUMULATE_GRAD
    by_name = accumulate is None
    get = targets.get
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        mine = None
        j = -1
        for edge in node.next_functions:  # (node, output index): the key of a node's edge
            j += 1
            nxt = edge[0]
            if nxt is None:
                continue
            if type(nxt) is accumulate or (by_name and type(nxt).__name__ == "AccumulateGrad"):
                found = get((id(nxt.variable), -1))
            else:
                found = get(edge)
                if start <= nxt._sequence_nr() < end and nxt not in seen:
                    stack.append(nxt)
            if found:
                if mine is None:
                    mine = tasks.get(node)
                    if mine is None:
                        mine = tasks[node] = []
                for kind, rec in found:
                    mine.append((kind, j, rec))
    return tasks


def _rebased_part(t: torch.Tensor, start: int, end: int) -> Optional[tuple]:
    """The geometry ``(size, stride, offset, base size, base stride)`` of the view ``t`` in
    its base when a write in the call (sequence numbers ``[start, end)``) rebased the base
    (autograd saw it: the base's node is the call's); None otherwise (no write, or one
    under ``torch.no_grad``)."""
    base = t._base
    if base is None:
        return None
    now = base.grad_fn
    if now is None or not start <= now._sequence_nr() < end:
        return None
    return (tuple(t.shape), t.stride(), t.storage_offset() - base.storage_offset(),
            tuple(base.shape), base.stride())


def _base_edge(t: torch.Tensor, start: int, end: int) -> Optional[tuple]:
    """For an input view ``t`` whose base a write in the call rebased: ``(node, output_nr,
    geometry)`` of the edge the base had before the call (its node, None for a leaf base)
    and :func:`_rebased_part`'s geometry; None when the call did not rebase the base."""
    geometry = _rebased_part(t, start, end)
    if geometry is None:
        return None
    base = t._base
    # follow the first input of the nodes the call created on the base (the writes) down
    # to the first one older than the call
    edge = (base.grad_fn, base.output_nr)
    for _ in range(64):
        node = edge[0]
        if node is None or _is_accumulator(node) or node._sequence_nr() < start or not node.next_functions:
            break
        edge = node.next_functions[0]
    node = edge[0]
    if node is None:
        return None
    if _is_accumulator(node):
        return None, -1, geometry
    if node._sequence_nr() >= start:
        return None
    return node, edge[1], geometry


def _on_part(geometry: tuple, grad: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The part ``geometry`` (``(size, stride, offset, base size, base stride)``, see
    :func:`_rebased_part`) of the base's gradient ``grad``."""
    if grad is None:
        return None
    size, stride, offset, base_size, base_stride = geometry
    with torch.no_grad():
        if tuple(grad.shape) != base_size:
            return None
        if grad.stride() != base_stride:
            grad = _COPY(_EMPTY_STRIDED(base_size, base_stride, dtype=grad.dtype, device=grad.device), grad)
        return _AS_STRIDED(grad, size, stride, grad.storage_offset() + offset)


class _NodeHook:
    """msprobe's post-hook on one autograd node for one entry: it hands the entry every
    gradient it reads at that node in one call, then runs ``next`` (the hook of a later
    entry that reads gradients at the same node, see :meth:`BackwardTaps.tap_outputs`'s
    ``shared``), so that a node carries one registered hook however many entries read it.

    ``tasks``: a flat tuple ``(kind, index, record, kind, index, record, ...)``, the
    output side (``out``/``outpart``: ``grad_outputs[index]``) first, then what the node
    sends along its edge ``index`` (``grad_inputs[index]``), so that the entry is complete
    once its inputs' gradients are in (the call's own consumers of an output are other
    nodes, which run before it). The hook refers to no node: a cycle through the C++ node
    would be invisible to the garbage collector."""

    __slots__ = ("taps", "pending", "tasks", "next")

    def __init__(self, taps: BackwardTaps, pending: PendingBackward, tasks: tuple) -> None:
        self.taps, self.pending, self.tasks = taps, pending, tasks
        self.next: Optional[_NodeHook] = None

    def __call__(self, grad_inputs: tuple, grad_outputs: tuple) -> None:
        hook = self
        while hook is not None:
            hook.run(grad_inputs, grad_outputs)
            hook = hook.next

    def run(self, grad_inputs: tuple, grad_outputs: tuple) -> None:
        """This entry's tasks (see the class)."""
        taps, pending, tasks = self.taps, self.pending, self.tasks
        if pending.done:
            if taps._on_lost is not None and any(isinstance(g, torch.Tensor) for g in grad_outputs):
                taps._on_lost(pending)  # a later pass the entry cannot take (see on_lost)
            return
        task = graph_task_id()
        for i in range(0, len(tasks), 3):
            kind, index, rec = tasks[i], tasks[i + 1], tasks[i + 2]
            if kind is _OUT or kind is _OUTPART:
                grad = grad_outputs[index] if index < len(grad_outputs) else None
            else:
                grad = grad_inputs[index] if index < len(grad_inputs) else None
            if kind is _INTERNAL:
                if rec.task != task:
                    taps._begin(pending, rec, task)
                if not rec.delivered and isinstance(grad, torch.Tensor):
                    rec.internal = grad if rec.internal is None else _sum(rec.internal, grad)
                continue
            if kind is _OUTPART or kind is _PART:
                rec, geometry = rec
                grad = _on_part(geometry, grad)
            taps._add(pending, rec, grad, task)


class _LeafHook:
    """msprobe's pre-hook on a leaf's gradient accumulator for an entry that returned the
    leaf; refers to the entry weakly (the entry keeps the accumulator, and releases it
    once done)."""

    __slots__ = ("taps", "ref", "rec")

    def __init__(self, taps: BackwardTaps, ref: "weakref.ref[PendingBackward]", rec: _Grad) -> None:
        self.taps, self.ref, self.rec = taps, ref, rec

    def __call__(self, grad_outputs: tuple) -> None:
        pending = self.ref()
        if pending is not None and not pending.done:
            self.taps._add(pending, self.rec, grad_outputs[0] if grad_outputs else None, graph_task_id())
            if pending.done:
                pending.keep = ()
