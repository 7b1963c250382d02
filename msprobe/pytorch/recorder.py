"""The PyTorch recorder: turns intercepted calls into events for the session.

One :class:`Recorder` per ``PrecisionDebugger``. API wrappers (``api_hooks``), module hooks
(``module_hooks``) and parameter-gradient hooks (``grad_hooks``) call into it; it builds
the leaves (``leaves``), installs the backward views (``backward``) and emits
:class:`store.records.Call` events through the session.

Every entry point sets the thread's ``busy`` flag while msprobe's own code runs, so the
tensor operations msprobe performs (statistics, views) are never recorded as user API
calls (spec section 9, fixes 1–2). Internal errors are logged once and stop recording;
they never propagate into the training script.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Optional

import torch

from msprobe.core.bench import BenchSelector
from msprobe.core.handles import records_inside
from msprobe.core.filters import NameList
from msprobe.core.recorder import Frame, Plan, RecorderCore
from msprobe.core.session import Session
from msprobe.pytorch.async_dump import AsyncGatherer
from msprobe.pytorch.backward import BackwardTaps, PendingBackward, graph_task_id
from msprobe.pytorch.grad_hooks import FrozenParameters
from msprobe.pytorch.deferred import DeferredStats, HeldCall, HostCopy, PendingLeaf, host_copy, payload_copyable
from msprobe.pytorch.leaves import HoldingLeafBuilder, LeafBuilder, is_structseq
from msprobe.pytorch.mutation import WRITES_ANY, WRITES_ARGS, WriteRule
from msprobe.pytorch.payload import PayloadCapture
from msprobe.pytorch.stats import PLAIN_TYPES, has_data
from store import schema
from store.records import Call, null_leaf


logger = logging.getLogger("msprobe")

_current_graph_task_id = getattr(torch._C, "_current_graph_task_id", None)
#: True while torch.jit.trace runs the model (nothing is recorded then)
_is_tracing = getattr(torch._C, "_is_tracing", lambda: False)


def in_recompute() -> bool:
    """True while autograd's engine runs a backward in this thread: a forward call made now
    is activation-checkpointing recomputation (``is_recompute``)."""
    return _current_graph_task_id is not None and _current_graph_task_id() != -1


class _ApiPlan(Plan):
    """An API call in progress (:class:`msprobe.core.recorder.Plan`); ``tap``: its inputs'
    autograd edges (:class:`~msprobe.pytorch.backward.TapState`); ``recompute``:
    ``is_recompute``; ``held``: tensor.bench_path, the input tensors held."""

    __slots__ = ("tap", "recompute", "held")


class ModuleFrame(Frame):
    """A module forward in progress (:class:`msprobe.core.recorder.Frame`).

    ``module_id``: ``id`` of the module; ``tap``, ``recompute``, ``held``: as for an API
    call; ``scope_end``: the module is the scope's last entry, which closes when it
    finishes; ``done``: its forward returned normally; ``hooks``: the autograd nodes
    hooked for backward entries inside the outermost recorded module forward running
    (shared by its inner frames; ``shared`` of :meth:`BackwardTaps.tap_outputs`)."""

    __slots__ = ("module_id", "tap", "recompute", "scope_end", "done", "held", "hooks")


class _ScopeEnd:
    """Placeholder frame of an unrecorded module that is the scope's last entry."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class Recorder(RecorderCore):
    """Builds events from intercepted PyTorch calls (:class:`msprobe.core.recorder.RecorderCore`
    holds the filters, plans and frames).

    Args:
        session: the recording session (state, counters, filters, writer).
        bench: ``tensor.bench_path``: decides which forward calls keep their tensors
            (:mod:`msprobe.core.bench`; task tensor only); None: every call does.
    """

    RECOMPUTE = True
    #: a call starting now can have a backward: autograd records (grad mode, not inference)
    grad_active = staticmethod(BackwardTaps.active)

    def __init__(self, session: Session, bench: Optional[BenchSelector] = None) -> None:
        super().__init__(session)
        cfg = session.config
        self.capture = PayloadCapture(session.put_payload) if session.stores_tensors else None
        self.bench = bench if self.capture is not None else None
        builder = HoldingLeafBuilder if self.bench is not None else LeafBuilder
        self.leaves = builder(md5=cfg.summary_mode == "md5", with_data=cfg.task != "structure",
                              capture=self.capture, xor=cfg.summary_mode == "xor",
                              high=cfg.precision == "high",
                              tensor_list=NameList(cfg.tensor_list) if cfg.tensor_list else None)
        # the memo is sound only where intercepted calls (which clear it) separate the records:
        # at L0 and debug nothing clears it between module hooks / save() calls
        if cfg.level not in ("L1", "mix"):
            self.leaves.memo.enabled = False
        self.taps = BackwardTaps(self._on_grad, self._lost_pass)
        self._lost_warned = False  # a later backward pass could not be summed (said once)
        self._late_warned = False  # gradients arrived after their step ended (said once)
        self.modules_bwd: set[str] = set()   # module prefixes whose backward is recorded this step
        self.root_prefixes: set[str] = set()  # roots whose own parameters' gradients are recorded
        self.frozen = FrozenParameters()  # parameters of hooked modules waiting to require grad
        self.ancestors: dict[str, tuple[str, ...]] = {}  # module prefix -> prefixes of the hooked modules containing it
        self.exclusive: Optional[str] = None  # module_dump: the only module prefix recorded
        self._closing: Optional[str] = None   # name of the scope's last entry, while it starts
        self.gatherer: Optional[AsyncGatherer] = None
        if cfg.async_dump:
            self.gatherer = AsyncGatherer(session.emit, session.put_payload if session.stores_tensors else None,
                                          md5=cfg.summary_mode == "md5", with_data=cfg.task != "structure")
            self.leaves.defer = self.gatherer.tensor_leaf
        self.deferred = DeferredStats()
        self.leaves.batch = self.deferred.batch  # the leaves' device statistics, resolved by self.deferred
        self.leaves.xor_batch = self.deferred.xor_batch  # and their xor checksums
        self.leaves.crc_batch = self.deferred.crc_batch  # and their CRC-32 (md5)
        if self.capture is not None:  # task tensor: host copies stored at the flush point
            self.deferred.put_payload = session.put_payload
            self.leaves.defer_payloads = self.bench is None
        if self.bench is not None:
            # a call whose CRC-32s are on the device is selected at the flush point, its
            # tensors' values kept in their CRC-32 staging rows until then
            self.deferred.bench_decide = self._bench_decide
            self.deferred.store = self.leaves.store
            self.deferred.crc_batch.keep_rows = True
        self._write_rules: dict[str, WriteRule] = {}  # API key -> how its calls may write arguments
        session.add_flush_hook(self.flush_deferred)

    def emit(self, call: Call, held: Optional[HeldCall] = None) -> None:
        """Hand ``call`` to the session; held back until :meth:`drain` with async_dump, or
        queued while device statistics are pending (queued entries keep their order).
        ``held``: tensor.bench_path, the call's tensors waiting for its selection (only
        where :meth:`_queues` is True for its leaves)."""
        if self.gatherer is not None:
            self.gatherer.add(call)
        elif self.leaves.pending_made and (len(self.deferred) or any(isinstance(x, PendingLeaf) for x in call.leaves)):
            # (:meth:`_queues`, inlined: nothing is queued before the first PendingLeaf)
            if self.deferred.add(call, list(call.leaves), held):
                self.flush_deferred()
        else:
            self.session.emit(call)

    def _queues(self, leaves) -> bool:
        """Whether :meth:`emit` queues an entry with ``leaves`` until the flush point (the
        test :meth:`emit` makes inline; keep the two alike): some device statistics are
        pending, in it or in an entry queued before it (nothing is queued before the first
        PendingLeaf: ``pending_made`` is never reset)."""
        return (self.gatherer is None and self.leaves.pending_made
                and (len(self.deferred) > 0 or any(isinstance(x, PendingLeaf) for x in leaves)))

    def drain(self) -> None:
        """async_dump: resolve and emit the held calls (at stop()/step())."""
        if self.gatherer is None:
            return
        with self.guarded():
            self.gatherer.drain()

    # --- API calls ----------------------------------------------------------------------------
    def record_api(self, original: Any, family: str, key: str, args: tuple, kwargs: dict) -> Any:
        """Run ``original(*args, **kwargs)`` recording it as ``{key}.{n}.forward`` (and its
        backward). Exceptions of ``original`` propagate unchanged."""
        tls = self.session._tls
        memo = self.leaves.memo
        if self.exclusive is not None or _is_tracing():
            # module_dump window: no API is recorded; torch.jit.trace: the trace runs the
            # model twice and compares the graphs, which the recorder's own views would change
            memo.clear()
            return original(*args, **kwargs)
        tls.busy = True
        self._closing = None
        try:
            try:
                plan = self._api_before(family, key, args, kwargs)
            except Exception as exc:
                self.internal_error(exc)
                plan = None
            # a call that writes in place (maybe through an alias with its own version
            # counter) makes the statistics of what it may write stale (msprobe.pytorch.stats_memo)
            writes = self._writes(family, key, original, args, kwargs)
            if writes and memo.entries:
                _forget(memo, writes, args, kwargs)
            if writes and plan is not None and plan.held:  # the call may change its inputs: keep copies
                plan.held = _copies(plan.held)
            closing = self._closing
            if plan is None:
                out = original(*args, **kwargs)
                if writes and memo.entries:  # again: another thread may have recorded them meanwhile
                    _forget(memo, writes, args, kwargs)
                if closing is not None:
                    self.scope.exit(closing)
                return out
            # (an original that is no msprobe wrapper, the common case, is told without a call)
            if getattr(original, "__msprobe_original__", None) is not None and records_inside(original):
                tls.busy = False  # another debugger's wrapper that records now: let it record the call too
                try:
                    out = original(*args, **kwargs)
                finally:
                    tls.busy = True
            else:
                out = original(*args, **kwargs)
            if writes and memo.entries:  # again: another thread may have recorded them meanwhile
                _forget(memo, writes, args, kwargs)
            try:
                return self._api_after(plan, out)
            except Exception as exc:
                self.internal_error(exc)
                return out
            finally:
                if closing is not None:
                    self.scope.exit(closing)
        finally:
            tls.busy = False

    def _writes(self, family: str, key: str, original: Any, args: tuple, kwargs: dict) -> int:
        """How the call ``original(*args, **kwargs)`` of API ``key`` may write its
        arguments: READS, WRITES_ARGS or WRITES_ANY (:class:`~msprobe.pytorch.mutation.WriteRule`,
        built once per API)."""
        rule = self._write_rules.get(key)
        if rule is None:
            rule = self._write_rules[key] = WriteRule(family, key.split(".", 1)[-1], original)
        return rule.check(args, kwargs)

    def _api_before(self, family: str, key: str, args: tuple, kwargs: dict) -> Optional[_ApiPlan]:
        s = self.session
        n = s.api_counter.next(key)
        fwd = f"{key}.{n}.forward"
        bwd = f"{key}.{n}.backward"
        if fwd == self.scope.last:
            self._closing = fwd
        want_fwd, want_bwd = self.wanted(fwd, bwd)
        if not (want_fwd or want_bwd):
            return None
        plan = self.start_plan(_ApiPlan(), fwd, family, want_fwd)
        plan.recompute = in_recompute()
        leaves = plan.leaves
        self.leaves.for_entry(fwd)
        plan.held = None
        if want_fwd and self._fwd_input:
            held = self._hold() if self.bench is not None else None
            self.leaves.sequence("input_args", args, leaves)
            if kwargs:
                self.leaves.mapping("input_kwargs", kwargs, leaves)
            if held is not None:
                plan.held = self._bench_inputs(fwd, leaves, held)
        plan.tap = None
        if want_bwd:
            plan.tap = self.taps.tap_inputs(self.new_pending(plan, bwd, schema.API_BACKWARD, PendingBackward),
                                            args, kwargs)
        return plan

    def _api_after(self, plan: _ApiPlan, out: Any) -> Any:
        if plan.pending is not None:
            self.taps.tap_outputs(plan.pending, out, plan.tap, self._node_hooks())
            self._keep_pending(plan.pending)

        if plan.want_fwd:
            held = self._output_leaves(plan.name, out, plan.leaves, plan.held) if self._fwd_output else None
            self.emit(self.forward_call(plan, schema.API_FORWARD, plan.recompute), held)
        return out

    # --- module calls --------------------------------------------------------------------------
    def module_pre(self, module: torch.nn.Module, prefix: str, args: tuple, kwargs: dict):
        """Forward pre-hook body; returns ``(args, kwargs)`` to substitute, or None."""
        s = self.session
        tls = s._tls
        stack = self.session.module_stack()
        if (not s.recording or getattr(tls, "busy", False) or (self.exclusive is not None and prefix != self.exclusive)
                or _is_tracing()):
            stack.append(None)
            return None
        tls.busy = True
        pushed = False
        self._closing = None
        try:
            frame = self._module_frame(module, prefix, args, kwargs)
            if frame is None and self._closing is not None:
                frame = _ScopeEnd(self._closing)
            stack.append(frame)
            pushed = True
            if type(frame) is ModuleFrame and frame.pending is not None:
                frame.tap = self.taps.tap_inputs(frame.pending, args, kwargs)
            return None
        except Exception as exc:
            self.internal_error(exc)
            if not pushed:
                stack.append(None)
            return None
        finally:
            tls.busy = False

    def _module_frame(self, module, prefix: str, args: tuple, kwargs: dict) -> Optional[ModuleFrame]:
        n = self.session.module_counter.next(prefix)
        fwd = f"{prefix}.forward.{n}"
        bwd = f"{prefix}.backward.{n}"
        self._closing = fwd if fwd == self.scope.last else None
        want_fwd, want_bwd = self.wanted(fwd, bwd)
        if not (want_fwd or want_bwd):
            return None
        frame = self.start_frame(ModuleFrame(), prefix, fwd, bwd, prefix.split(".", 1)[0], want_fwd)
        frame.module_id = id(module)
        frame.recompute = in_recompute()
        frame.done = False
        frame.scope_end = self._closing is not None
        frame.tap = None
        outer = self._node_hooks()
        frame.hooks = {} if outer is None else outer
        leaves = frame.leaves
        self.leaves.for_entry(fwd)
        frame.held = None
        if want_fwd:
            held = self._hold() if self.bench is not None else None
            if self._fwd_input:
                self.leaves.sequence("input_args", args, leaves)
                self.leaves.mapping("input_kwargs", kwargs, leaves)
            if self._parameters:
                self.leaves.mapping("parameters", dict(module.named_parameters(recurse=False)), leaves)
            if held is not None:
                # the module may change its inputs in place (nn.ReLU(inplace=True)): copies
                held = self._bench_inputs(fwd, leaves, held)
                frame.held = None if held is None else _copies(held, keep_io="parameters")
        if want_bwd:
            self.new_pending(frame, bwd, schema.MODULE_BACKWARD, PendingBackward)
            self.modules_bwd.add(prefix)
        return frame

    def module_done(self, module: torch.nn.Module) -> None:
        """Plain forward hook body: the forward of the innermost module returned normally."""
        stack = getattr(self.session.local, "frames", None)
        if stack and type(stack[-1]) is ModuleFrame and stack[-1].module_id == id(module):
            stack[-1].done = True

    def module_post(self, module: torch.nn.Module, output: Any) -> Any:
        """Forward hook body (also runs when forward raised); returns a substitute output or None."""
        stack = getattr(self.session.local, "frames", None)
        if not stack:
            return None
        frame = stack.pop()
        if frame is None:
            return None
        if type(frame) is _ScopeEnd:
            self.scope.exit(frame.name)
            return None
        if frame.scope_end:
            self.scope.exit(frame.name)
        if not frame.done:
            return None  # the forward raised: no entry (its output is unknown)
        with self.guarded():
            if frame.pending is not None:
                self.taps.tap_outputs(frame.pending, output, frame.tap, frame.hooks)
                self._keep_pending(frame.pending)
            if frame.want_fwd:
                held = None
                if self._fwd_output:
                    held = self._output_leaves(frame.name, output, frame.leaves, frame.held)
                    frame.held = None
                self.emit(self.forward_call(frame, schema.MODULE_FORWARD, frame.recompute), held)
        return None

    # --- tensor.bench_path ---------------------------------------------------------------------
    #
    # A call whose leaves are all final when it ends is decided then (its CRC-32s were
    # computed on the host). A call with a CRC-32 still on the device (a PendingLeaf), or
    # recorded while such a call waits, is decided at the flush point, in recording order
    # (:meth:`_bench_decide`, called by DeferredStats.resolve): the values of its staged
    # tensors are those its CRC-32 staging rows hold, copied at record time (inputs before
    # the call runs, outputs after), and its other tensors are copied when the call ends
    # (HeldCall), so a later in-place change never reaches a stored file.
    def _output_leaves(self, name: str, out: Any, leaves: list, held: Optional[list]) -> Optional[HeldCall]:
        """Append the leaves of forward entry ``name``'s output ``out`` to ``leaves``.
        ``held``: tensor.bench_path, the input tensors held because the inputs matched the
        baseline or are not known yet (None otherwise); the call is then selected if an
        output differs. Returns the call's :class:`HeldCall` where the decision waits
        for the flush point, else None."""
        self.leaves.for_entry(name)
        if held is None:
            self.leaves.sequence("output", _as_list(out), leaves)
            return None
        start, held_out = len(leaves), self._hold()
        self.leaves.sequence("output", _as_list(out), leaves)
        if held_out is None:
            return None
        return self._bench_outputs(name, leaves, start, held + held_out)

    def _hold(self) -> Optional[list]:
        """tensor.bench_path (``self.bench`` is set), while calls may still be selected: a
        fresh list the leaf builder fills with ``(io, path, tensor)`` of the leaves built
        next (until :meth:`_bench_inputs` or :meth:`_bench_outputs`; a tensor staged on the
        device for its CRC-32 as None: its staging row keeps its values); None otherwise."""
        if self.bench.exhausted:
            return None
        held = self.leaves.held = []
        return held

    def _bench_inputs(self, name: str, leaves: list, held: list) -> Optional[list]:
        """``held`` (the forward entry ``name``'s input tensors) if its input leaves equal
        the baseline's or some of their CRC-32s are still on the device, else None (the
        call cannot be selected and nothing is held)."""
        self.leaves.held = None
        if any(isinstance(x, PendingLeaf) for x in leaves):
            return held  # decided at the flush point
        s = self.session
        return held if self.bench.inputs_match(s.rank or 0, s.step, name, leaves) else None

    def _bench_outputs(self, name: str, leaves: list, start: int, held: list) -> Optional[HeldCall]:
        """The outputs of the forward entry ``name`` (``leaves[start:]``) are built. Where
        the entry waits for the flush point (:meth:`_queues`), returns its
        :class:`HeldCall`. Else, if an output differs from the baseline's (the inputs
        matched), the call is selected and every tensor leaf in ``held`` gets its payload,
        in place in ``leaves``."""
        self.leaves.held = None
        if self.bench.exhausted:
            return None
        if self._queues(leaves):
            return _held_call(held)
        s = self.session
        if not self.bench.outputs_differ(s.rank or 0, s.step, name, leaves[start:]):
            return None
        tensors = {(io, tuple(path)): t for io, path, t in held}
        store = self.leaves.store
        for i, leaf in enumerate(leaves):
            t = tensors.get((leaf.io, tuple(leaf.path)))
            if t is not None and leaf.leaf_kind == schema.LEAF_TENSOR and leaf.payload is None:
                leaves[i] = leaf.replace(payload=store(t))
        self.bench.select(name)
        return None

    def _bench_decide(self, call: Call, held: HeldCall) -> bool:
        """At the flush point: True (and the call counted as selected) when the forward
        entry ``call`` (its leaves final) is selected: calls remain to select, its tensor
        inputs equal the baseline's and an output differs (:class:`BenchSelector`)."""
        if self.bench.exhausted:
            return False
        rank = self.session.rank or 0
        if not (self.bench.inputs_match(rank, call.step, call.name, call.leaves)
                and self.bench.outputs_differ(rank, call.step, call.name, call.leaves)):
            return False
        self.bench.select(call.name)
        return True

    # --- parameter gradients ----------------------------------------------------------------
    def parameter_grad(self, prefix: str, pname: str, names: tuple[str, ...], param: torch.Tensor) -> None:
        """Post-accumulate-grad hook body: record ``param.grad`` under
        ``{prefix}.parameters_grad`` (key ``pname``; ``names`` = all keys of the entry)."""
        # recorded when the module, or a module containing it, ran in this step (a module
        # inside a compiled region has no forward entry of its own)
        seen = prefix in self.modules_seen or (bool(self.modules_seen) and (
            prefix in self.root_prefixes or any(a in self.modules_seen for a in self.ancestors.get(prefix, ()))))
        name = self.parameters_grad_entry(prefix, prefix in self.modules_bwd) if seen else None
        if name is None:
            return
        with self.guarded():
            grad = param.grad
            self.leaves.for_entry(name)
            leaf = (self.leaves.tensor_leaf(pname, (0,), grad, keep=True) if grad is not None
                    else null_leaf(pname, (0,)))
            self.emit(Call(step=self.session.step, kind=schema.PARAMETERS_GRAD, name=name,
                           api_type=prefix.split(".", 1)[0], keys=names, leaves=(leaf,)))

    # --- backward ------------------------------------------------------------------------------
    def _node_hooks(self) -> Optional[dict]:
        """The nodes hooked inside this thread's innermost recorded module forward
        (:attr:`ModuleFrame.hooks`), or None outside one."""
        stack = getattr(self.session.local, "frames", None)
        if stack:
            for frame in reversed(stack):
                if type(frame) is ModuleFrame:
                    return frame.hooks
        return None

    def _keep_pending(self, pending: PendingBackward) -> None:
        if pending.expect_in or pending.expect_out:
            self.pending[id(pending)] = pending

    def _on_grad(self, pending: PendingBackward, side: str, paths: list, grad: Optional[torch.Tensor],
                 count: bool = True) -> None:
        """A gradient of ``pending`` (summed over this step's backward passes so far) for
        the slots ``paths`` of ``side``; ``count`` False: not counted towards the pass's
        completion (see :meth:`BackwardTaps._deliver`)."""
        with self.guarded():
            if not self.accepts_grad(pending):
                return
            grads = pending.grads_in if side == "input" else pending.grads_out
            if grad is not None and isinstance(grad, torch.Tensor):
                self.leaves.for_entry(pending.name)
                first = self.leaves.tensor_leaf(side, paths[0], grad)
                grads[paths[0]] = first
                for p in paths[1:]:  # slots holding the same tensor: an alias of the first
                    if self.gatherer is None:
                        grads[p] = alias_leaf(first, side, p, paths[0])
                    else:  # async placeholders are resolved by identity: one per slot
                        grads[p] = self.gatherer.replace(self.leaves.tensor_leaf(side, p, grad),
                                                         value_json=alias_text(side, paths[0]))
            pending.dirty = True
            if not count:
                return
            task = graph_task_id()
            if pending.task != task:  # a new backward pass over this entry
                pending.task = task
                pending.fired_in = pending.fired_out = 0
            if side == "output":
                pending.fired_out += 1
                complete = pending.fired_out >= pending.expect_out
            else:
                pending.fired_in += 1
                complete = pending.expect_out == 0 and pending.fired_in >= pending.expect_in
            if complete:
                self._emit_pending(pending)

    def _emit_pending(self, pending: PendingBackward, final: bool = False) -> None:
        """Write the backward entry (again, under the same name, after a later pass); it
        stays open for later passes while it keeps sums (:meth:`PendingBackward.holds_sums`)
        and the step lasts (``final`` False)."""
        first = not pending.emitted
        pending.emitted = True
        if pending.keys and (pending.dirty or (first and (pending.fired_in or pending.fired_out))):
            self.emit(pending.to_call())
        pending.dirty = False
        if final or not pending.holds_sums():
            pending.done = True
            pending.keep = ()
            self.pending.pop(id(pending), None)
        else:
            self.pending[id(pending)] = pending

    def _lost_pass(self, pending: PendingBackward) -> None:
        """A gradient of ``pending`` arrived that cannot be recorded: a later backward pass
        whose earlier sum was not kept (the entry keeps the earlier passes' gradients), or
        one after the entry's step ended. Each is said once per debugger."""
        if not self.session.open_step(pending.step):
            if not (self._late_warned or self.session.failed or self.session.disabled):
                self._late_warned = True
                logger.warning("msprobe: a backward pass reached %s after step() ended step %d; gradients "
                               "arriving after their step ended are not recorded", pending.name, pending.step)
            return
        if self._lost_warned:
            return
        self._lost_warned = True
        logger.warning("msprobe: a further backward pass in step %d reached %s after its entry was written; "
                       "its gradients are not added to it (nor to other entries in the same case): run the "
                       "earlier passes with retain_graph=True (or create_graph=True) through "
                       "torch.autograd.backward/grad to have them summed", pending.step, pending.name)

    def flush_pending(self) -> None:
        """Emit the backward entries still incomplete (some gradient never arrived)."""
        with self.guarded():
            for pending in list(self.pending.values()):
                if not pending.done and self.session.open_step(pending.step):
                    self.taps.settle(pending)
                    if not pending.done:
                        self._emit_pending(pending, final=True)
                pending.done = True
                pending.keep = ()
        self.pending.clear()
        self.leaves.memo.clear()
        self.drain()
        self.step_reset()
        self.modules_bwd.clear()

    def flush_deferred(self) -> None:
        """Resolve queued device statistics in one transfer per device and emit the entries."""
        if not len(self.deferred):
            return
        with self.guarded():
            for call in self.deferred.resolve():
                self.session.emit(call)
            if self.bench is not None and self.bench.exhausted:
                self.deferred.crc_batch.keep_rows = False  # no call is held any more


def _forget(memo: Any, writes: int, args: tuple, kwargs: dict) -> None:
    """Make ``memo`` forget what a call with ``args``/``kwargs`` may write (``writes``: a
    :meth:`Recorder._writes` result); run before and after the call."""
    if writes == WRITES_ARGS:
        memo.release(args, kwargs)
    elif writes == WRITES_ANY:
        memo.clear()


def alias_text(io: str, target: tuple) -> str:
    """The ``value_json`` of a tensor leaf that aliases the slot ``target`` of ``io``:
    ``{"alias_of": "output.0"}``."""
    return json.dumps({"alias_of": ".".join((io,) + tuple(str(p) for p in target))}, separators=(",", ":"))


def alias_leaf(first: Any, io: str, path: tuple, target: tuple) -> Any:
    """The leaf of the argument slot ``path`` that holds the same tensor as the slot
    ``target`` (whose leaf is ``first``, a :class:`Leaf` or :class:`PendingLeaf`): the same
    statistics, and ``"alias_of": "{io}.{target path}"`` in its dump.json record
    (``value_json`` of a tensor leaf holds the record's extra keys)."""
    extra = alias_text(io, target)
    if isinstance(first, PendingLeaf):
        return PendingLeaf(first.leaf.replace(path=path, value_json=extra), first.vector)
    return first.replace(path=path, value_json=extra)


def _copies(held: list, keep_io: Optional[str] = None) -> list:
    """``held`` (``(io, path, tensor)`` triples) with each tensor replaced by a detached
    copy (those of ``io == keep_io`` kept as they are): the values as they are now, for
    a call that may change them in place."""
    out = []
    with torch.no_grad():
        for io, path, t in held:
            if t is not None and io != keep_io:
                try:
                    t = t.detach().clone()
                except (RuntimeError, TypeError, NotImplementedError):  # no values to copy: kept as is
                    pass
            out.append((io, path, t))
    return out


def _held_call(held: list) -> HeldCall:
    """The :class:`HeldCall` of a call's ``held`` triples ``(io, path, tensor or None)``
    (None: staged for its CRC-32, whose row keeps its values): a host copy of every other
    tensor, queued now (:func:`~msprobe.pytorch.deferred.host_copy`; pinned and
    non-blocking on CUDA), or a detached clone where a host copy does not apply (the
    capture stores it at the flush point)."""
    copies, nbytes = {}, 0
    with torch.no_grad():
        for io, path, t in held:
            if t is None:
                continue
            try:
                if (type(t) in PLAIN_TYPES and t.layout is torch.strided and not t.is_nested
                        and payload_copyable(t) and has_data(t)):
                    host = host_copy(t)
                    value = HostCopy(host, t.device)
                    nbytes += host.numel() * host.element_size()
                else:
                    value = t.detach().clone()
            except (RuntimeError, TypeError, NotImplementedError):  # no values to copy: stored as it is then
                value = t
            copies[(io, tuple(path))] = value
    return HeldCall(frozenset((io, tuple(path)) for io, path, _ in held), copies, nbytes)


def _as_list(out: Any) -> list:
    """dump.json ``output`` is always a list: tuples, lists and structseqs give their items."""
    if isinstance(out, (list, tuple)) and (not hasattr(out, "_fields") or is_structseq(out)):
        return list(out)
    return [out]
