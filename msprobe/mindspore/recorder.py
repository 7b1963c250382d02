"""The MindSpore recorder: turns intercepted PyNative calls into events for the session.

One :class:`Recorder` per ``PrecisionDebugger``. API wrappers (``api_hooks``), Primitive
wrappers (``primitive_hooks``), the Jit executor (``jit_hooks``), Cell hooks
(``cell_hooks``) and parameter hooks (``grad_hooks``) call into it; it builds the leaves
(``leaves``), installs the backward identities (``backward``) and emits
:class:`store.records.Call` events through the session.

The ``scope`` filter (spec 5.5 with fix 19) is applied here: a range opens when its first
forward entry starts and closes when its last one has finished (both included); backward
entries exist only for forwards inside it. It is reset at each step.

Every entry point sets the thread's ``busy`` flag while msprobe's own code or a recorded
call runs, so calls made inside a recorded call, and msprobe's own operations, are never
recorded (spec 2.1, section 9 fixes 1-2). Internal errors are logged once and stop
recording; they never propagate into the training script.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from mindspore import Tensor
from mindspore.graph.api import _pynative_executor

from msprobe.core.recorder import Frame, Plan, RecorderCore
from msprobe.core.session import Session
from msprobe.core.values import object_items
from msprobe.mindspore.backward import BackwardTaps, PendingBackward
from msprobe.core.npy_payload import array_bytes
from msprobe.mindspore.device_stats import DeviceStats, PendingLeaf
from msprobe.mindspore.device_stats import wanted as device_stats_wanted
from msprobe.mindspore.leaves import LeafBuilder
from store import schema
from store.records import Call, Leaf, null_leaf



def grad_active() -> bool:
    """True while MindSpore records a gradient graph (inside ``grad``/``value_and_grad``,
    ``Model.train``); only then are backward identities installed."""
    return bool(_pynative_executor.requires_grad())


class CellFrame(Frame):
    """A Cell forward in progress (:class:`msprobe.core.recorder.Frame`); ``inputs``: its
    positional and keyword arguments."""

    __slots__ = ("inputs",)


class Recorder(RecorderCore):
    """Builds events from intercepted MindSpore calls (:class:`msprobe.core.recorder.RecorderCore`
    holds the filters, plans and frames).

    Args:
        session: the recording session (state, counters, filters, writer).

    Task ``tensor`` (``session.stores_tensors``): each tensor's host copy goes to the
    session's payload store when its leaf is built (inputs before the call runs, so an
    in-place call does not change them); the exporter writes the ``.npy`` files.
    """

    #: a call starting now can have a backward: MindSpore records a gradient graph
    grad_active = staticmethod(grad_active)

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        cfg = session.config
        self.device_stats = DeviceStats(on_full=self.flush_stats)
        self.leaves = LeafBuilder(md5=cfg.summary_mode == "md5", with_data=cfg.task != "structure",
                                  capture=self._capture if session.stores_tensors else None,
                                  device=self.device_stats if device_stats_wanted() else None)
        session.add_flush_hook(self.flush_stats)
        self.taps = BackwardTaps(self._on_grad)
        self._fired = 0
        self._tensor_hooks: list = []  # handles of the Cell-input hooks of this computation

    def emit(self, call: Call) -> None:
        """Hand ``call`` to the session, or queue it while device statistics are pending
        (:mod:`msprobe.mindspore.device_stats`; queued entries keep their order)."""
        ds = self.device_stats
        if len(ds) or any(isinstance(x, PendingLeaf) for x in call.leaves):
            ds.queue(call)
        else:
            self.session.emit(call)

    def flush_stats(self) -> None:
        """Resolve the pending device statistics (one host transfer) and emit the queued
        entries: a session flush hook (stop(), step(), close()), and run by
        :class:`DeviceStats` when the pending tensors reach its limit or memory budget."""
        ds = self.device_stats
        if not (len(ds) or ds.pending):
            return
        with self.guarded():
            for call in ds.resolve():
                self.session.emit(call)

    def _capture(self, a: Any) -> Optional[str]:
        """Task tensor: store the values of host array ``a`` now; the payload reference."""
        return self.session.put_payload(*array_bytes(a))

    # --- API, Primitive and Jit calls ---------------------------------------------------------
    def record_api(self, original: Callable, family: str, key: str, args: tuple, kwargs: dict,
                   inplace: bool = False, record_args: Optional[tuple] = None) -> Any:
        """Run ``original(*args, **kwargs)`` recording it as ``{key}.{n}.forward`` (and its
        backward). ``record_args`` (default ``args``) are the arguments written to the dump
        (a Jit Cell's ``self`` is left out). Exceptions of ``original`` propagate unchanged."""
        tls = self.session._tls
        tls.busy = True
        fwd = key
        try:
            try:
                n = self.session.api_counter.next(key)
                fwd = f"{key}.{n}.forward"
                plan = self._before(family, key, n, args if record_args is None else record_args, kwargs)
            except Exception as exc:
                self.internal_error(exc)
                plan = None
            if plan is None:
                try:
                    return original(*args, **kwargs)
                finally:
                    self.scope.exit(fwd)
            call_args, call_kwargs = args, kwargs
            if plan.pending is not None:
                try:
                    offset = len(args) - len(record_args) if record_args is not None else 0
                    tapped, call_kwargs = self.taps.tap_inputs(plan.pending, args[offset:], kwargs, skip_first=inplace)
                    call_args = tuple(args[:offset]) + tuple(tapped)
                except Exception as exc:
                    self.internal_error(exc)
                    plan.pending, call_args, call_kwargs = None, args, kwargs
            try:
                out = original(*call_args, **call_kwargs)
            except BaseException:
                self.scope.exit(fwd)
                raise
            try:
                return self._after(plan, out, args, kwargs)
            except Exception as exc:
                self.internal_error(exc)
                return out
            finally:
                self.scope.exit(fwd)
        finally:
            tls.busy = False

    def _before(self, family: str, key: str, n: int, args: tuple, kwargs: dict) -> Optional[Plan]:
        fwd = f"{key}.{n}.forward"
        bwd = f"{key}.{n}.backward"
        want_fwd, want_bwd = self.wanted(fwd, bwd)
        if not (want_fwd or want_bwd):
            return None
        plan = self.start_plan(Plan(), fwd, family, want_fwd)
        if want_fwd and self._fwd_input:
            self.leaves.sequence(fwd, "input_args", args, plan.leaves)
            self.leaves.mapping(fwd, "input_kwargs", kwargs, plan.leaves)
        if want_bwd:
            self.new_pending(plan, bwd, schema.API_BACKWARD, PendingBackward)
        return plan

    def _after(self, plan: Plan, out: Any, args: tuple, kwargs: dict) -> Any:
        result = out
        if plan.pending is not None:
            result = self.taps.tap_outputs(plan.pending, out, tuple(args) + tuple(kwargs.values()))
            self.pending[id(plan.pending)] = plan.pending
        if plan.want_fwd:
            if self._fwd_output:
                self.leaves.sequence(plan.name, "output", _as_list(out), plan.leaves)
            self.emit(self.forward_call(plan, schema.API_FORWARD))
        return result

    # --- Cells -------------------------------------------------------------------------------
    def cell_pre(self, cell: Any, prefix: str, args: tuple, kwargs: dict):
        """Forward pre-hook body; returns ``(args, kwargs)`` to substitute, or None."""
        s = self.session
        tls = s._tls
        stack = self.session.module_stack()
        if not s.recording or getattr(tls, "busy", False):
            stack.append(None)
            return None
        tls.busy = True
        pushed = False
        try:
            frame = self._cell_frame(cell, prefix, args, kwargs)
            stack.append(frame)
            pushed = True
            if frame is None or frame.pending is None:
                return None
            # no identity on the inputs (it would regroup their gradient sums): tensor hooks
            self._tensor_hooks.extend(self.taps.hook_inputs(frame.pending, args, kwargs))
            return None
        except Exception as exc:
            self.internal_error(exc)
            if not pushed:
                stack.append(None)
            return None
        finally:
            tls.busy = False

    def _cell_frame(self, cell: Any, prefix: str, args: tuple, kwargs: dict) -> Optional[CellFrame]:
        n = self.session.module_counter.next(prefix)
        fwd = f"{prefix}.forward.{n}"
        bwd = f"{prefix}.backward.{n}"
        want_fwd, want_bwd = self.wanted(fwd, bwd)
        if not (want_fwd or want_bwd):
            return None
        frame = self.start_frame(CellFrame(), prefix, fwd, bwd, "Cell", want_fwd)
        frame.inputs = tuple(args) + tuple(kwargs.values())
        if want_fwd:
            if self._fwd_input:
                self.leaves.sequence(fwd, "input_args", args, frame.leaves)
                self.leaves.mapping(fwd, "input_kwargs", kwargs, frame.leaves)
            if self._parameters:
                self.leaves.mapping(fwd, "parameters", dict(cell._params), frame.leaves)
        if want_bwd:
            self.new_pending(frame, bwd, schema.MODULE_BACKWARD, PendingBackward)
        return frame

    def cell_post(self, cell: Any, output: Any) -> Any:
        """Forward hook body; returns a substitute output or None."""
        s = self.session
        tls = s._tls
        stack = getattr(s.local, "frames", None)
        if not stack:
            return None
        frame = stack.pop()
        if frame is None:
            return None
        self.scope.exit(frame.name)
        prev = getattr(tls, "busy", False)
        tls.busy = True
        try:
            result = output
            if frame.pending is not None:
                result = self.taps.tap_outputs(frame.pending, output, frame.inputs)
                self.pending[id(frame.pending)] = frame.pending
            if frame.want_fwd:
                if self._fwd_output:
                    self.leaves.sequence(frame.name, "output", _as_list(output), frame.leaves)
                self.emit(self.forward_call(frame, schema.MODULE_FORWARD))
            return None if result is output else result
        except Exception as exc:
            self.internal_error(exc)
            return None
        finally:
            tls.busy = prev

    # --- parameter gradients ----------------------------------------------------------------
    def parameter_grad(self, prefix: str, pname: str, names: tuple[str, ...], grad: Any) -> None:
        """``Parameter.register_hook`` body: record the accumulated gradient under
        ``{prefix}.parameters_grad`` (key ``pname``; ``names`` = all keys of the entry)."""
        s = self.session
        name = self.parameters_grad_entry(prefix) if prefix in self.modules_seen else None
        if name is None or not s.open_step(s.step):
            return
        with self.guarded():
            leaf = (self.leaves.tensor_leaf(pname, (0,), grad) if isinstance(grad, Tensor)
                    else null_leaf(pname, (0,)))
            self.emit(Call(step=s.step, kind=schema.PARAMETERS_GRAD, name=name, api_type="Cell",
                        keys=names, leaves=(leaf,)))

    # --- backward ------------------------------------------------------------------------------
    def _on_grad(self, pending: PendingBackward, side: str, paths: list, grad: Any) -> None:
        with self.guarded():
            if not self.accepts_grad(pending):
                return
            if pending.order is None:
                self._fired += 1
                pending.order = self._fired
            grads = pending.grads_in if side == "input" else pending.grads_out
            if isinstance(grad, Tensor):
                first = self.leaves.tensor_leaf(side, paths[0], grad)
                for p in paths:
                    grads[p] = first if p == paths[0] else first.replace(path=p)

    def backward_end(self) -> None:
        """A gradient computation returned: emit every entry that received a gradient, in
        the order of their first gradient; entries that received none never will."""
        with self.guarded():
            fired = sorted((p for p in self.pending.values() if p.order is not None), key=lambda p: p.order)
            for pending in fired:
                pending.done = True
                if pending.keys and self.session.open_step(pending.step):
                    self.emit(pending.to_call())
        self.pending.clear()
        self._fired = 0
        hooks, self._tensor_hooks = self._tensor_hooks, []
        for handle in hooks:
            try:
                handle.remove()
            except Exception as exc:
                self.internal_error(exc)

    def flush_pending(self) -> None:
        """Step end: emit what is still pending and forget the step's Cells."""
        self.backward_end()
        self.step_reset()

    # --- debug save ----------------------------------------------------------------------------
    def save(self, variable: Any, name: str, k: int, save_backward: bool) -> Any:
        """Record ``variable`` as ``{name}.{k}`` and, with ``save_backward``, its gradients
        as ``{name}_grad.{k}`` (spec 6.1/6.2). Returns the value the caller should keep
        using: with ``save_backward`` during a gradient computation, tensors are replaced by
        identities that report their gradient."""
        s = self.session
        with self.guarded():
            entry = f"{name}.{k}"
            leaves: list[Leaf] = []
            for p, v, kind in _walk_for_save(variable):
                if kind == schema.LEAF_TENSOR:
                    leaves.append(self.leaves.tensor_leaf("", p, v))
                else:
                    tmp: list[Leaf] = []
                    self.leaves.leaves(entry, "", v, tmp, p)
                    leaves.extend(tmp)
            self.emit(Call(step=s.step, kind=schema.DEBUG_SAVE, name=entry, api_type="debug", leaves=tuple(leaves)))
            if not save_backward:
                return variable
            gname = f"{name}_grad.{k}"
            structure = [Leaf(io="", path=p, leaf_kind=schema.LEAF_NONE) for p, _v, kind in _walk_for_save(variable)
                         if kind == schema.LEAF_TENSOR] or [Leaf(io="", path=(), leaf_kind=schema.LEAF_NONE)]
            self.emit(Call(step=s.step, kind=schema.DEBUG_SAVE, name=gname, api_type="debug", leaves=tuple(structure)))
            # file names of the gradients as the saved tensors', whatever order they arrive in
            s.reserve_file_names(gname, schema.DEBUG_SAVE, [("", leaf.path) for leaf in leaves
                                                            if leaf.leaf_kind == schema.LEAF_TENSOR])
            if grad_active():
                for p, v, kind in _walk_for_save(variable):
                    if kind == schema.LEAF_TENSOR and (v.is_floating_point() or v.is_complex()):
                        v.register_hook(self._save_grad_hook(gname, p))
        return variable

    def _save_grad_hook(self, gname: str, path: tuple) -> Callable:
        s = self.session
        step = s.step

        def hook(g):
            if not isinstance(g, Tensor) or s.failed or s.disabled:
                return None
            with self.guarded():
                leaf = self.leaves.tensor_leaf("", path, g)
                self.emit(Call(step=step, kind=schema.DEBUG_SAVE, name=gname, api_type="debug", leaves=(leaf,)))
            return None

        return hook


def _walk_for_save(value: Any, path: tuple = (), depth: int = 0):
    """``(path, value, kind)``: tensors as LEAF_TENSOR, everything else whole as LEAF_VALUE
    (expanded by the leaf builder); lists/tuples/dicts are descended."""
    if isinstance(value, Tensor):
        yield path, value, schema.LEAF_TENSOR
    elif depth < 10 and isinstance(value, (list, tuple)) and value and not hasattr(value, "_fields"):
        for i, v in enumerate(value):
            yield from _walk_for_save(v, path + (i,), depth + 1)
    elif depth < 10 and isinstance(value, dict) and value:
        for text, _, v in object_items(value):
            yield from _walk_for_save(v, path + (text,), depth + 1)
    else:
        yield path, value, schema.LEAF_VALUE


def _as_list(out: Any) -> list:
    if isinstance(out, (list, tuple)) and not hasattr(out, "_fields"):
        return list(out)
    return [out]
