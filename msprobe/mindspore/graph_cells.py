"""Cell-level records in MindSpore's GRAPH_MODE on the CPU backend (level L0).

In GRAPH_MODE a hook registered with ``Cell.register_forward_hook`` is compiled into the
graph: its tensor operations run, its Python calls do not. What hands a tensor out of a
running graph on CPU is ``ops.Custom(fn, ..., func_type="pyfunc")``: MindSpore calls the
Python function ``fn`` with the op's inputs as numpy arrays each time the op executes
(MindSpore 2.10; pyfunc kernels exist for the CPU backend only). :class:`GraphCellHooks`
puts such ops into the graph:

* in each Cell's forward hook, a record op on ``stop_gradient(t)`` for each tensor input
  (and each Parameter that does not require grad). The results are tied to the Cell's
  output with ``ops.depend``, so they run before the output is recorded and are not
  removed as unused; ``stop_gradient`` keeps them out of the gradient graph;
* in the same hook, an identity on each output tensor whose ``bprop`` passes the gradient
  on unchanged through another pyfunc identity that hands it out (the gradient w.r.t. that
  output). Each output gets one identity and every later use reads it, so no gradient sum
  is regrouped;
* for each Parameter that requires grad and is held by one hooked Cell only, a graph-mode
  Parameter forward hook (``Parameter._register_forward_hook``, enabled per Cell with
  ``mindspore.graph.api._set_parameter_forward_hook_enabled``): every read of the
  Parameter goes through an identity that hands out its value and, in backward, the
  gradient of that read. MindSpore compiles no such hook on a Parameter shared by several
  Cells (tied weights): each holder records it through its forward hook, as above; so is a
  Parameter that a ``construct`` reads through a sub-Cell (``self.emb.embedding_table``,
  found in the source: such a read would bypass the hook and give a partial gradient). A
  Parameter that already holds a forward hook is a ConfigError (one hook per Parameter);
  :meth:`GraphCellHooks.remove` restores the previous state.

Each op gets a small int64 tag ``[cell, role, slot, count, tensor inputs]`` built from
constants in the hook (``ops.tuple_to_array``), so a few ops of fixed arity serve every
Cell; each op has its own Python function (MindSpore tells pyfunc ops, and their
``bprop``, apart by it). Recording changes no bit of the training (tests/mindspore/test_ms_graph_cells.py).
:class:`GraphCellRecorder` assembles the arriving arrays into the entries of PyNative's
level L0 (:mod:`msprobe.mindspore.recorder`):

* ``Cell.{path}.{Class}.forward.{N}``: ``input_args``, ``input_kwargs`` (empty: a
  GRAPH_MODE forward hook sees positional inputs only), ``parameters`` (the Cell's own
  ``_params``) and ``output``, emitted when the last output tensor arrives; ``N`` counts
  the Cell's recorded forwards in the step and restarts at 0 each step. A non-tensor
  positional input, or a non-tensor element of a tuple output, is a ``none`` leaf; a Cell
  whose output is neither a tensor nor a tuple holding one gets no entry.
* ``Cell.{path}.{Class}.backward.{N}``: ``input`` only (the gradient w.r.t. each output
  tensor). The gradient w.r.t. the Cell's inputs is not recorded: it would need a node on
  the inputs, which can regroup gradient sums. A gradient of output slot ``k`` belongs to
  the latest forward ``N`` of that Cell whose slot ``k`` has none yet (backward runs in
  reverse order).
* ``Cell.{path}.{Class}.parameters_grad``: the gradient of each Parameter with a Parameter
  hook that the step's graph read exactly once; a Parameter read more than once (a Cell
  the graph calls twice: one warning) has no entry, as its gradient is a sum formed inside
  the graph, nor has a Parameter shared by several Cells. The gradient ops are marked
  ``side_effect_hidden`` so that the graph's common-subexpression pass cannot merge two
  equal gradient contributions into one callback.
* backward and ``parameters_grad`` entries are emitted when the step's files are exported
  (``stop()``, ``step()``, ``close()``), in the order of their first gradient.
* ``parent`` (construct.json): the forward (backward) of the nearest hooked enclosing Cell
  that is running, by its next ``N``; no stack (the Python stack of a running graph is
  MindSpore's).

Statistics are those of :mod:`msprobe.mindspore.leaves` over the numpy arrays MindSpore
hands over (float64, spec 3.4); dtype names are MindSpore's (``Float32``).
"""
from __future__ import annotations

import inspect
import logging
import re
import threading
from collections import Counter, deque
from typing import Any, Optional, Sequence

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn, ops
from mindspore.graph.api import _pynative_executor, _set_parameter_forward_hook_enabled

from msprobe.core.errors import ConfigError
from msprobe.core.naming import to_backward
from msprobe.core.recorder import RecorderCore
from msprobe.kernel_dump.statistic_csv import ms_dtype_name
from msprobe.mindspore.backward import PendingBackward
from msprobe.mindspore.cell_hooks import cell_prefixes
from msprobe.mindspore.leaves import LeafBuilder
from store import schema
from store.records import Call, Leaf, null_leaf

__all__ = ["GraphCellHooks", "GraphCellRecorder", "ROLE_INPUT", "ROLE_PARAMETER", "ROLE_OUTPUT",
           "ROLE_PARAMETER_GRAD"]

ROLE_INPUT, ROLE_PARAMETER, ROLE_OUTPUT, ROLE_PARAMETER_GRAD = 0, 1, 2, 3
_UNSET = object()
logger = logging.getLogger("msprobe")


def _second(_tag, x):
    """``out_shape``/``out_dtype`` of the identities: those of the tensor argument."""
    return x


class _CellInfo:
    """What the recorder knows of one hooked Cell: dump prefix, parent prefix, the names and
    ``requires_grad`` flags of its ``_params`` (None values included, as ``none`` leaves)."""

    __slots__ = ("prefix", "parent", "param_names", "param_grad", "queues", "pending", "last_params", "copies",
                 "latest", "grad_names", "param_grads", "n_args")

    def __init__(self, prefix: str, parent: Optional[str], params: Sequence[tuple[str, Any]],
                 grad_slots: Sequence[int]) -> None:
        self.prefix = prefix
        self.parent = parent
        self.param_names = tuple(name for name, _p in params)
        self.param_grad = tuple(None if p is None else bool(p.requires_grad) for _n, p in params)
        # (role, slot) -> arrays waiting for the forward's output; output slots of the forward
        # being assembled
        self.queues: dict[tuple[int, int], deque] = {}
        # this step's backward entries, in forward order; the latest of them
        self.pending: list[_GraphPending] = []
        self.latest: Optional[_GraphPending] = None
        # the parameters of the latest forward (a Cell called again in the graph reads the
        # same Parameters: their records are merged into one)
        self.last_params: list[Optional[np.ndarray]] = [None] * len(self.param_names)
        # output slot -> copies seen of the latest forward's output (on_record)
        self.copies: dict[int, int] = {}
        # the keys of the parameters_grad entry (the Parameters with a Parameter hook) and, per
        # _params slot, the step's gradient contributions as (arrival rank, leaf)
        self.grad_names = tuple(params[slot][0] for slot in grad_slots)
        self.param_grads: dict[int, list[tuple[int, Leaf]]] = {}
        # the number of positional inputs of the call being assembled (tag of its input records)
        self.n_args: Optional[int] = None


class _GraphPending(PendingBackward):
    """A GRAPH_MODE backward entry: ``copies`` (how many identities MindSpore chained on
    each output: each gradient arrives that many times) and ``received`` (path -> arrivals)."""

    __slots__ = ("copies", "received")

    def __init__(self, **fields: Any) -> None:
        super().__init__(**fields)
        self.copies = 1
        self.received: dict[tuple, int] = {}


class GraphCellRecorder(RecorderCore):
    """Builds level-L0 entries from the arrays the pyfunc ops of :class:`GraphCellHooks`
    hand over while a GRAPH_MODE graph runs (:class:`msprobe.core.recorder.RecorderCore`
    holds the filters).

    Args:
        session: the recording session (:class:`msprobe.core.session.Session`).

    The pyfunc callbacks (:meth:`on_record`, :meth:`on_grad`) may run on a MindSpore
    runtime thread: the recorder's state is guarded by a lock. An internal error stops
    recording (``Session.internal_error``); it is never raised into the graph.
    """

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        cfg = session.config
        self.leaves = LeafBuilder(md5=cfg.summary_mode == "md5", with_data=cfg.task != "structure",
                                  capture=self._capture if session.stores_tensors else None)
        self.cells: list[_CellInfo] = []
        self._lock = threading.RLock()
        self._fired = 0
        self._warned_reads: set[str] = set()
        #: callbacks that arrived in this step (recorded or not; the debugger warns when a
        #: recorded step had none: a graph compiled before start(model))
        self.arrivals = 0
        # a graph-mode backward entry holds the gradients w.r.t. the outputs only
        self.graph_bwd_keys = tuple(k for k in self.bwd_keys if k == "input")
        session.add_flush_hook(self.flush)

    def grad_active(self) -> bool:
        """Always True: whether a gradient arrives is known only when the graph runs (an
        entry that receives none is never emitted)."""
        return True

    def _capture(self, a: np.ndarray) -> Optional[str]:
        from msprobe.core.npy_payload import array_bytes
        return self.session.put_payload(*array_bytes(a))

    def add_cell(self, prefix: str, parent: Optional[str], params: Sequence[tuple[str, Any]],
                 grad_slots: Sequence[int] = ()) -> int:
        """Register one hooked Cell; returns its index (the first element of its tags).

        Args:
            prefix: its dump prefix (``Cell.{path}.{Class}``); parent: the enclosing hooked Cell's.
            params: its ``_params`` items (name, Parameter or None).
            grad_slots: the ``params`` positions whose reads go through a Parameter hook
                (their gradients make the ``parameters_grad`` entry).
        """
        with self._lock:
            self.cells.append(_CellInfo(prefix, parent, params, grad_slots))
            return len(self.cells) - 1

    def drop_cells(self) -> None:
        """Forget every registered Cell (hooks removed or re-installed): the ops of a graph
        compiled with the old hooks still run and are ignored (their indices stay unused)."""
        with self._lock:
            self.cells = [None] * len(self.cells)
            self._warned_reads.clear()

    # --- pyfunc callbacks ---------------------------------------------------------------------
    def on_record(self, tag: np.ndarray, a: np.ndarray) -> None:
        """A forward input, parameter or output ``a`` of the Cell call described by ``tag``
        (``[cell, role, slot, count, inputs]``: ``count`` slots of that role, ``inputs``
        tensor inputs) arrived.

        A hook of a Cell that the graph calls ``m`` times is applied ``m`` times to each
        call's output by MindSpore 2.10 (a chain of ``m`` identities); the copies of the
        input and parameter records are merged by the graph's common-subexpression pass,
        the output copies are not. An output arriving while the Cell has no output
        pending and fewer queued inputs than ``inputs`` is such a copy: it counts to the
        Cell's latest forward (its backward then receives ``m`` copies of each gradient)
        and is not recorded again. A Cell without tensor inputs cannot tell copies apart.
        """
        self.arrivals += 1
        s = self.session
        if not s.recording or s.failed or s.disabled:
            return
        with self._lock, self.guarded():
            cid, role, slot, count, n_inputs = (int(v) for v in tag)
            info = self.cells[cid]
            if info is None:
                return
            if role == ROLE_OUTPUT and n_inputs and not any(
                    q for (r, _k), q in info.queues.items() if r == ROLE_OUTPUT) and sum(
                    1 for (r, _k), q in info.queues.items() if r == ROLE_INPUT and q) < n_inputs:
                info.copies[slot] = info.copies.get(slot, 1) + 1
                if info.latest is not None:
                    info.latest.copies = max(info.latest.copies, info.copies[slot])
                return
            info.queues.setdefault((role, slot), deque()).append(a)
            if role == ROLE_INPUT:
                info.n_args = count
            if role == ROLE_OUTPUT:
                ready = [k for (r, k), q in info.queues.items() if r == ROLE_OUTPUT and q]
                if len(ready) >= count:
                    outs: list[Optional[np.ndarray]] = [None] * (max(ready) + 1)
                    for k in ready:
                        outs[k] = info.queues[(ROLE_OUTPUT, k)].popleft()
                    info.copies = {}
                    self._forward(info, outs)

    def _forward(self, info: _CellInfo, outs: list[Optional[np.ndarray]]) -> None:
        s = self.session
        prefix = info.prefix
        n = s.module_counter.next(prefix)
        fwd, bwd = f"{prefix}.forward.{n}", f"{prefix}.backward.{n}"
        ins = self._take(info, ROLE_INPUT, info.n_args)
        info.n_args = None
        params = self._take(info, ROLE_PARAMETER, len(info.param_names))
        params = [a if a is not None else last for a, last in zip(params, info.last_params)]
        info.last_params = params
        want_fwd, want_bwd = self.wanted(fwd, bwd)
        parent = None
        if info.parent is not None:
            parent = f"{info.parent}.forward.{s.module_counter.peek(info.parent)}"
        if want_fwd:
            leaves: list[Leaf] = []
            if self._fwd_input:
                for i, a in enumerate(ins):
                    leaves.append(self._leaf("input_args", (i,), a))
            if self._parameters:
                for (name, a), rg in zip(zip(info.param_names, params), info.param_grad):
                    leaves.append(self._leaf("parameters", (name,), a, rg))
            if self._fwd_output:
                for k, a in enumerate(outs):
                    leaves.append(self._leaf("output", (k,), a))
            s.emit(Call(step=s.step, kind=schema.MODULE_FORWARD, name=fwd, api_type="Cell", parent=parent,
                        stack_id=None, keys=self.module_keys, leaves=tuple(leaves)))
        if want_bwd and self.graph_bwd_keys:
            pending = _GraphPending(step=s.step, name=bwd, kind=schema.MODULE_BACKWARD, api_type="Cell",
                                      parent=to_backward(parent), stack_id=None, keys=self.graph_bwd_keys)
            pending.in_slots = [(k,) for k in range(len(outs))]  # a non-tensor slot stays a none leaf
            info.pending.append(pending)
            info.latest = pending
        else:
            info.latest = None

    @staticmethod
    def _take(info: _CellInfo, role: int, count: Optional[int] = None) -> list[Optional[np.ndarray]]:
        """The first queued array of each slot of ``role`` (None for a slot with none):
        slots 0..count-1, or up to the highest queued slot when ``count`` is None."""
        if count is None:
            slots = [k for r, k in info.queues if r == role]
            count = max(slots) + 1 if slots else 0
        out = []
        for k in range(count):
            q = info.queues.get((role, k))
            out.append(q.popleft() if q else None)
        return out

    def _leaf(self, io: str, path: tuple, a: Optional[np.ndarray], requires_grad: Optional[bool] = None) -> Leaf:
        if a is None:
            return null_leaf(io, path)
        leaf = self.leaves.tensor_leaf(io, path, a)
        return leaf.replace(type="mindspore.Tensor", dtype=_ms_dtype(a), requires_grad=requires_grad)

    def on_grad(self, tag: np.ndarray, g: np.ndarray) -> None:
        """The gradient ``g`` w.r.t. output slot ``tag[2]`` of Cell ``tag[0]`` arrived: it
        belongs to the latest forward of the Cell in this step whose slot has none yet."""
        s = self.session
        if s.failed or s.disabled:
            return
        with self._lock, self.guarded():
            info = self.cells[int(tag[0])]
            if info is None:
                return
            path = (int(tag[2]),)
            for pending in reversed(info.pending):
                seen = pending.received.get(path, 0)
                if not pending.done and seen < pending.copies and pending.step == s.step:
                    pending.received[path] = seen + 1
                    if seen:   # a copy through MindSpore's chained identities (on_record)
                        return
                    if pending.order is None:
                        self._fired += 1
                        pending.order = self._fired
                    pending.grads_in[path] = self._leaf("input", path, g)
                    return

    def on_param_grad(self, tag: np.ndarray, g: np.ndarray) -> None:
        """A gradient contribution ``g`` for Parameter slot ``tag[2]`` of Cell ``tag[0]``
        arrived (one per read of the Parameter in the graph)."""
        s = self.session
        if s.failed or s.disabled or not s.open_step(s.step):
            return
        with self._lock, self.guarded():
            info = self.cells[int(tag[0])]
            if info is None:
                return
            slot = int(tag[2])
            if self.parameters_grad_entry(info.prefix) is None or not s.module_counter.peek(info.prefix):
                return
            self._fired += 1
            leaf = self._leaf(info.param_names[slot], (0,), g)
            info.param_grads.setdefault(slot, []).append((self._fired, leaf))

    def sync(self) -> None:
        """Wait until the work MindSpore has queued has run (``_pynative_executor.sync()``;
        a GRAPH_MODE call on the CPU backend returns after its graph ran): the pyfunc ops
        have then handed over every tensor. The debugger calls it before recording is
        turned off (``stop()``, ``step()``, ``close()``)."""
        try:
            _pynative_executor.sync()
        except Exception as exc:  # noqa: BLE001 - a failed graph is the training script's to report
            self.session.internal_error(exc)

    def flush(self) -> None:
        """Emit the backward entries that received a gradient and are not emitted yet, and the
        ``parameters_grad`` of the Parameters that received exactly one gradient, in the order
        of their first gradient (after :meth:`sync`). The session's flush hook (before each
        export and at close)."""
        self.sync()
        s = self.session
        with self._lock, self.guarded():
            calls: list[tuple[int, Call]] = []
            for info in self.cells:
                if info is None:
                    continue
                for pending in info.pending:
                    if pending.order is not None and not pending.done:
                        pending.done = True
                        calls.append((pending.order, pending.to_call()))
                name = self.parameters_grad_entry(info.prefix)
                for slot, got in sorted(info.param_grads.items()):
                    # a Parameter read more than once: its gradient is a sum formed inside the graph
                    if len(got) > 1 and name is not None and name not in self._warned_reads:
                        self._warned_reads.add(name)
                        logger.warning("msprobe: %s not recorded: GRAPH_MODE read the Cell's Parameters %d times "
                                       "in step %d (a Cell called more than once); the gradient is a sum formed "
                                       "inside the graph", name, len(got), s.step)
                    if len(got) == 1 and name is not None:
                        calls.append((got[0][0], Call(step=s.step, kind=schema.PARAMETERS_GRAD, name=name,
                                                      api_type="Cell", keys=info.grad_names, leaves=(got[0][1],))))
                info.param_grads.clear()
            for _order, call in sorted(calls, key=lambda c: c[0]):
                if s.open_step(call.step):
                    s.emit(call)

    def flush_pending(self) -> None:
        """Step end (``Session.end_step``'s ``before_export``): :meth:`flush`, then forget the
        step's queued arrays and backward entries."""
        self.flush()
        self.step_reset()

    def step_reset(self) -> None:
        """Step end: forget the step's queued arrays and backward entries."""
        super().step_reset()
        with self._lock:
            for info in self.cells:
                if info is None:
                    continue
                info.queues.clear()
                info.pending.clear()
                info.latest = None
                info.copies = {}
                info.param_grads.clear()
                info.n_args = None
            self._fired = 0
            self.arrivals = 0


def _ms_dtype(a: np.ndarray) -> str:
    """MindSpore's name of the dtype of ``a`` (``Float32``; a numpy dtype MindSpore has no
    name for keeps numpy's). A table, not ``mstype.pytype_to_dtype``, which MindSpore
    2.10 reports as deprecated in a log line per call."""
    return ms_dtype_name(a.dtype.name)


class GraphCellHooks:
    """The GRAPH_MODE forward hooks of one recorder on every Cell of ``models``
    (``cell_prefixes``: the same Cells and names as PyNative's level L0); a handle
    (``remove()`` is idempotent). Register before the graph is compiled (the first call
    of the network or of a ``TrainOneStepCell`` around it): a graph compiled earlier runs
    without them.

    Args:
        models: the Cells passed to ``start(model)``.
        indexed: the user passed a list/tuple (paths start with the index).
        recorder: the :class:`GraphCellRecorder` the ops report to.
    """

    def __init__(self, models: Sequence[nn.Cell], indexed: bool, recorder: GraphCellRecorder) -> None:
        rec = recorder
        self._recorder = recorder

        def on_record(tag, a):
            rec.on_record(tag, a)
            return a

        def on_grad(tag, g):
            rec.on_grad(tag, g)
            return g

        grad_op = _unmerged(ops.Custom(on_grad, out_shape=_second, out_dtype=_second, func_type="pyfunc"))

        def bprop(tag, x, out, dout):
            return ops.zeros_like(tag), grad_op(tag, dout)

        def on_param_grad(tag, g):
            rec.on_param_grad(tag, g)
            return g

        param_grad_op = _unmerged(ops.Custom(on_param_grad, out_shape=_second, out_dtype=_second,
                                             func_type="pyfunc"))

        def param_bprop(tag, x, out, dout):
            return ops.zeros_like(tag), param_grad_op(tag, dout)

        def on_param(tag, a):   # its own function: MindSpore tells pyfunc ops (and their bprops) apart by it
            rec.on_record(tag, a)
            return a

        param_op = ops.Custom(on_param, out_shape=_second, out_dtype=_second, func_type="pyfunc", bprop=param_bprop)
        def on_input(tag, a):   # not output_op's function: that would give this op output_op's bprop
            rec.on_record(tag, a)
            return a

        record_op = ops.Custom(on_input, out_shape=_second, out_dtype=_second, func_type="pyfunc")
        output_op = ops.Custom(on_record, out_shape=_second, out_dtype=_second, func_type="pyfunc", bprop=bprop)
        self._handles: list = []
        # (cell, its previous __no_parameter_forward_hook__) and (Parameter, its previous hook)
        self._param_cells: list[tuple[nn.Cell, Any]] = []
        self._param_hooks: list[tuple[Any, Any]] = []
        prefixes = cell_prefixes(models, indexed)
        cells_of = {id(c): p for p, c in reversed(prefixes)}   # a Cell shared under two names: the first
        cells: list[tuple[str, nn.Cell]] = [(p, c) for p, c in prefixes if cells_of[id(c)] == p]
        # Parameters held by more than one Cell (tied weights): MindSpore refuses to compile a
        # Parameter forward hook on them; each holder records them through its forward hook
        owners = Counter(id(p) for _prefix, c in cells for p in {id(p): p for p in c._params.values()
                                                                  if p is not None}.values())
        # Parameters a construct reads through another Cell (self.emb.embedding_table): that read
        # would bypass the Parameter hook (partial gradient), so they are treated as shared
        for p_id in _foreign_reads([c for _p, c in cells] + [m for m in models if id(m) not in cells_of]):
            owners[p_id] += 2
        taps_of = {}
        for _prefix, cell in cells:
            for _n, p in cell._params.items():
                if p is not None and p.requires_grad and owners[id(p)] == 1:
                    previous = getattr(p, "__parameter_forward_hook__", None)
                    if previous is not None:
                        raise ConfigError("model", type(models[0]).__name__,
                                          "Cells whose Parameters hold no forward hook",
                                          detail=f"Parameter {p.name} already has a forward hook ({previous!r}); "
                                                 "level L0 in GRAPH_MODE puts its own on each Parameter of a Cell "
                                                 "(one per Parameter in MindSpore): remove the other hook, or close "
                                                 "the other PrecisionDebugger, before start(model)")
                    taps_of[id(p)] = p
        parents = _ParentFinder(models, cells_of)
        try:
            for prefix, cell in cells:
                params = list(cell._params.items())
                taps = [(slot, p) for slot, (_n, p) in enumerate(params) if p is not None and id(p) in taps_of]
                rest = [(slot, p) for slot, (_n, p) in enumerate(params) if p is not None and id(p) not in taps_of]
                cid = recorder.add_cell(prefix, parents.parent(cell, prefix), params,
                                        grad_slots=tuple(slot for slot, _p in taps))
                hook = _forward_hook(cid, tuple(p for _s, p in rest), tuple(slot for slot, _p in rest), len(params),
                                     record_op, output_op)
                self._handles.append(cell.register_forward_hook(hook))
                for slot, p in taps:
                    self._param_hooks.append((p, getattr(p, "__parameter_forward_hook__", None)))
                    p._register_forward_hook(_parameter_hook(cid, slot, len(params), param_op))
                if taps:
                    self._param_cells.append((cell, getattr(cell, "__no_parameter_forward_hook__", _UNSET)))
                    _set_parameter_forward_hook_enabled(cell, True)
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        """Remove every hook (idempotent) and restore each Parameter's previous forward hook
        and each Cell's previous Parameter-hook switch. A graph compiled with them keeps them."""
        self._recorder.drop_cells()
        while self._handles:
            self._handles.pop().remove()
        while self._param_hooks:
            p, previous = self._param_hooks.pop()
            p._register_forward_hook(previous)
        while self._param_cells:
            cell, previous = self._param_cells.pop()
            if previous is _UNSET:
                _set_parameter_forward_hook_enabled(cell, False)
            else:
                setattr(cell, "__no_parameter_forward_hook__", previous)

    # the JIT guard of PyNative (debugger._JitGuard) has nothing to suspend here
    def suspend(self, owner: Any = None) -> None:  # pragma: no cover - GRAPH_MODE has no @jit calls to guard
        return None

    def resume(self) -> None:  # pragma: no cover
        return None


def _unmerged(op):
    """``op`` marked ``side_effect_hidden`` (as MindSpore marks its random ops): the graph's
    common-subexpression pass keeps two such ops on equal inputs apart. Two gradient
    contributions of equal value (``fc(h) * fc(h)``) then arrive as two callbacks."""
    op.add_prim_attr("side_effect_hidden", True)
    return op


def _parameter_hook(cid: int, slot: int, n_params: int, param_op):
    """The graph-mode Parameter forward hook of ``_params`` slot ``slot`` of Cell ``cid``:
    each read of the Parameter goes through ``param_op``, which hands its value to
    :meth:`GraphCellRecorder.on_record` and, in backward, the gradient of that read to
    :meth:`GraphCellRecorder.on_param_grad`."""

    def hook(param):
        return param_op(ops.tuple_to_array((cid, ROLE_PARAMETER, slot, n_params, 0)), param)

    return hook


_SELF_PATH = re.compile(r"\bself((?:\.\w+)+)")


def _foreign_reads(cells: Sequence[nn.Cell]) -> set[int]:
    """``id`` of each Parameter that the source of a Cell's ``construct`` in ``cells`` reads
    as ``self.<sub>.<name>`` where ``<sub>`` is another Cell (a tied output projection
    ``ops.matmul(h, self.emb.embedding_table.T)``). A heuristic on the source text: a read
    through a local alias or ``getattr`` is not seen; a construct without source is skipped."""
    found: set[int] = set()
    paths_of: dict[type, list[str]] = {}   # the self.<path> texts of each Cell class's construct
    for cell in cells:
        paths = paths_of.get(type(cell))
        if paths is None:
            try:
                src = inspect.getsource(type(cell).construct)
            except (OSError, TypeError):
                src = ""
            paths = sorted({m.group(1) for m in _SELF_PATH.finditer(src) if m.group(1).count(".") > 1})
            paths_of[type(cell)] = paths
        for path in paths:
            obj: Any = cell
            for i, part in enumerate(path.split(".")[1:]):
                obj = getattr(obj, part, None)
                if obj is None or not isinstance(obj, (nn.Cell, ms.Parameter)):
                    break
                if isinstance(obj, ms.Parameter):
                    if i:   # reached through a sub-Cell
                        found.add(id(obj))
                    break
    return found


class _ParentFinder:
    """The dump prefix of the nearest hooked Cell that holds a Cell, from each model's
    ``cells_and_names()`` (read once per model: linear in the number of Cells).

    Args:
        models: the Cells passed to ``start(model)``.
        cells_of: ``id(cell) -> dump prefix`` of every hooked Cell.
    """

    def __init__(self, models: Sequence[nn.Cell], cells_of: dict) -> None:
        self._cells_of = cells_of
        self._maps = []
        for model in models:
            by_name = dict(model.cells_and_names())
            names: dict[int, str] = {}
            for n, c in by_name.items():
                names.setdefault(id(c), n)
            self._maps.append((names, by_name))

    def parent(self, cell: nn.Cell, prefix: str) -> Optional[str]:
        """The prefix of the nearest hooked Cell holding ``cell`` (dump prefix ``prefix``), or None."""
        for names, by_name in self._maps:
            name = names.get(id(cell))
            if name is None:
                continue
            parts = name.split(".") if name else []
            while parts:
                parts.pop()
                holder = by_name.get(".".join(parts))
                if holder is not None and id(holder) in self._cells_of and self._cells_of[id(holder)] != prefix:
                    return self._cells_of[id(holder)]
            return None
        return None


def _forward_hook(cid: int, params: tuple, param_slots: tuple, n_params: int, record_op, output_op):
    """The compiled forward hook of Cell ``cid`` (see the module docstring). ``params``: its
    non-None Parameters, ``param_slots`` their positions in ``_params`` (of ``n_params``)."""

    def hook(cell, inputs, output):
        n_in = 0
        for i in range(len(inputs)):
            if isinstance(inputs[i], Tensor):
                n_in = n_in + 1
        deps = ()
        for i in range(len(inputs)):
            if isinstance(inputs[i], Tensor):
                deps = deps + (record_op(ops.tuple_to_array((cid, ROLE_INPUT, i, len(inputs), n_in)),
                                         ops.stop_gradient(inputs[i])),)
        for j in range(len(params)):
            deps = deps + (record_op(ops.tuple_to_array((cid, ROLE_PARAMETER, param_slots[j], n_params, n_in)),
                                     ops.stop_gradient(params[j])),)
        if isinstance(output, Tensor):
            if deps:
                output = ops.depend(output, deps)
            return output_op(ops.tuple_to_array((cid, ROLE_OUTPUT, 0, 1, n_in)), output)
        if isinstance(output, tuple):
            n_out = 0
            for k in range(len(output)):
                if isinstance(output[k], Tensor):
                    n_out = n_out + 1
            outs = ()
            for k in range(len(output)):
                o = output[k]
                if isinstance(o, Tensor):
                    if deps:
                        o = ops.depend(o, deps)
                    o = output_op(ops.tuple_to_array((cid, ROLE_OUTPUT, k, n_out, n_in)), o)
                outs = outs + (o,)
            return outs
        return output

    return hook
