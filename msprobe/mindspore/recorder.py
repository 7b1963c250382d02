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

from msprobe.core.filters import ScopeRange
from msprobe.core.naming import to_backward
from msprobe.core.session import Session
from msprobe.core.values import object_items
from msprobe.mindspore.backward import BackwardTaps, PendingBackward
from msprobe.core.npy_payload import array_bytes
from msprobe.mindspore.leaves import LeafBuilder
from store import schema
from store.records import Call, Leaf



def grad_active() -> bool:
    """True while MindSpore records a gradient graph (inside ``grad``/``value_and_grad``,
    ``Model.train``); only then are backward identities installed."""
    return bool(_pynative_executor.requires_grad())


class _Plan:
    __slots__ = ("name", "want_fwd", "pending", "leaves", "args", "kwargs", "parent", "stack_id")


class CellFrame:
    """A Cell forward in progress (the innermost one parents API calls).

    ``keep_fwd``/``keep_bwd``: the Cell's forward/backward name matched the ``list`` at level
    mix, so everything running inside it is kept (spec 5.5)."""

    __slots__ = ("name", "prefix", "parent", "stack_id", "leaves", "pending", "want_fwd", "inputs", "swaps",
                 "keep_fwd", "keep_bwd")


class Recorder:
    """Builds events from intercepted MindSpore calls.

    Args:
        session: the recording session (state, counters, filters, writer).

    Task ``tensor`` (``session.stores_tensors``): each tensor's host copy goes to the
    session's payload store when its leaf is built (inputs before the call runs, so an
    in-place call does not change them); the exporter writes the ``.npy`` files.
    """

    def __init__(self, session: Session) -> None:
        cfg = session.config
        self.session = session
        self.dm = session.data_mode
        self.leaves = LeafBuilder(md5=cfg.summary_mode == "md5", with_data=cfg.task != "structure",
                                  capture=self._capture if session.stores_tensors else None)
        self.taps = BackwardTaps(self._on_grad)
        self.pending: dict[int, PendingBackward] = {}
        self.cells_seen: set[str] = set()
        self.scope = ScopeRange.from_config(cfg.scope)
        self.list_inside = cfg.level == "mix" and bool(cfg.list)
        self._fired = 0

    def _capture(self, a: Any) -> Optional[str]:
        """Task tensor: store the values of host array ``a`` now; the payload reference."""
        return self.session.put_payload(*array_bytes(a))

    # --- per-thread state -------------------------------------------------------------------
    def parent(self) -> Optional[str]:
        stack = getattr(self.session.local, "frames", None)
        if stack:
            for frame in reversed(stack):
                if frame is not None:
                    return frame.name
        return None

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

    def _wanted(self, fwd: str, bwd: str) -> tuple[bool, bool]:
        """Whether the forward and the backward entry of a call or Cell starting now are
        recorded: scope (entered here), data_mode and list."""
        s, dm = self.session, self.dm
        if not self.scope.enter(fwd):
            return False, False
        inside_fwd = inside_bwd = False
        if self.list_inside:
            for frame in getattr(s.local, "frames", None) or ():
                if frame is not None:
                    inside_fwd |= frame.keep_fwd
                    inside_bwd |= frame.keep_bwd
        return (dm.forward and (inside_fwd or s.accepts(fwd)),
                dm.backward and (inside_bwd or s.accepts(bwd)) and grad_active())

    def _before(self, family: str, key: str, n: int, args: tuple, kwargs: dict) -> Optional[_Plan]:
        s, dm = self.session, self.dm
        fwd = f"{key}.{n}.forward"
        bwd = f"{key}.{n}.backward"
        want_fwd, want_bwd = self._wanted(fwd, bwd)
        if not (want_fwd or want_bwd):
            return None
        plan = _Plan()
        plan.name, plan.want_fwd = fwd, want_fwd
        plan.parent = self.parent()
        plan.stack_id = s.stacks.capture()
        leaves: list[Leaf] = []
        if want_fwd and dm.allows("forward", "input"):
            self.leaves.sequence(fwd, "input_args", args, leaves)
            self.leaves.mapping(fwd, "input_kwargs", kwargs, leaves)
        plan.leaves = leaves
        plan.pending = None
        if want_bwd:
            plan.pending = PendingBackward(step=s.step, name=bwd, kind=schema.API_BACKWARD, api_type=family,
                                           parent=to_backward(plan.parent), stack_id=plan.stack_id,
                                           keys=self.dm.backward_keys())
        return plan

    def _after(self, plan: _Plan, out: Any, args: tuple, kwargs: dict) -> Any:
        s, dm = self.session, self.dm
        result = out
        if plan.pending is not None:
            result = self.taps.tap_outputs(plan.pending, out, tuple(args) + tuple(kwargs.values()))
            self.pending[id(plan.pending)] = plan.pending
        if plan.want_fwd:
            keys = []
            if dm.allows("forward", "input"):
                keys += ["input_args", "input_kwargs"]
            if dm.allows("forward", "output"):
                keys.append("output")
                self.leaves.sequence(plan.name, "output", _as_list(out), plan.leaves)
            s.emit(Call(step=s.step, kind=schema.API_FORWARD, name=plan.name, api_type=plan.name.split(".", 1)[0],
                        parent=plan.parent, stack_id=plan.stack_id, keys=tuple(keys), leaves=tuple(plan.leaves)))
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
            # the caller's lists in place: a Cell may change a list it was given for its caller
            new_args, new_kwargs = self.taps.tap_inputs(frame.pending, args, kwargs, swaps=frame.swaps)
            if new_args is args and new_kwargs is kwargs:
                return None
            return new_args, new_kwargs
        except Exception as exc:
            self.internal_error(exc)
            if not pushed:
                stack.append(None)
            return None
        finally:
            tls.busy = False

    def _cell_frame(self, cell: Any, prefix: str, args: tuple, kwargs: dict) -> Optional[CellFrame]:
        s, dm = self.session, self.dm
        n = s.module_counter.next(prefix)
        fwd = f"{prefix}.forward.{n}"
        bwd = f"{prefix}.backward.{n}"
        want_fwd, want_bwd = self._wanted(fwd, bwd)
        if not (want_fwd or want_bwd):
            return None
        frame = CellFrame()
        frame.name, frame.prefix, frame.want_fwd = fwd, prefix, want_fwd
        frame.parent = self.parent()
        frame.stack_id = s.stacks.capture()
        frame.inputs = tuple(args) + tuple(kwargs.values())
        frame.swaps = []
        frame.keep_fwd = self.list_inside and s.name_list.matches(fwd)
        frame.keep_bwd = self.list_inside and s.name_list.matches(bwd)
        leaves: list[Leaf] = []
        if want_fwd:
            if dm.allows("forward", "input"):
                self.leaves.sequence(fwd, "input_args", args, leaves)
                self.leaves.mapping(fwd, "input_kwargs", kwargs, leaves)
            if dm.allows_parameters():
                self.leaves.mapping(fwd, "parameters", dict(cell._params), leaves)
        frame.leaves = leaves
        frame.pending = None
        if want_bwd:
            frame.pending = PendingBackward(step=s.step, name=bwd, kind=schema.MODULE_BACKWARD, api_type="Cell",
                                            parent=to_backward(frame.parent), stack_id=frame.stack_id,
                                            keys=self.dm.backward_keys())
        self.cells_seen.add(prefix)
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
                dm = self.dm
                keys = []
                if dm.allows("forward", "input"):
                    keys += ["input_args", "input_kwargs"]
                if dm.allows("forward", "output"):
                    keys.append("output")
                    self.leaves.sequence(frame.name, "output", _as_list(output), frame.leaves)
                if dm.allows_parameters():
                    keys.append("parameters")
                s.emit(Call(step=s.step, kind=schema.MODULE_FORWARD, name=frame.name, api_type="Cell",
                            parent=frame.parent, stack_id=frame.stack_id, keys=tuple(keys),
                            leaves=tuple(frame.leaves)))
            return None if result is output else result
        except Exception as exc:
            self.internal_error(exc)
            return None
        finally:
            self.taps.restore(frame.swaps)
            tls.busy = prev

    # --- parameter gradients ----------------------------------------------------------------
    def parameter_grad(self, prefix: str, pname: str, names: tuple[str, ...], grad: Any) -> None:
        """``Parameter.register_hook`` body: record the accumulated gradient under
        ``{prefix}.parameters_grad`` (key ``pname``; ``names`` = all keys of the entry)."""
        s = self.session
        if prefix not in self.cells_seen or s.failed or s.disabled or not self.dm.allows_parameters_grad():
            return
        name = f"{prefix}.parameters_grad"
        if not s.accepts(name) or not s.open_step(s.step):
            return
        tls = s._tls
        prev = getattr(tls, "busy", False)
        tls.busy = True
        try:
            leaf = (self.leaves.tensor_leaf(pname, (0,), grad) if isinstance(grad, Tensor)
                    else Leaf(io=pname, path=(0,), leaf_kind=schema.LEAF_NONE))
            s.emit(Call(step=s.step, kind=schema.PARAMETERS_GRAD, name=name, api_type="Cell",
                        keys=names, leaves=(leaf,)))
        except Exception as exc:
            self.internal_error(exc)
        finally:
            tls.busy = prev

    # --- backward ------------------------------------------------------------------------------
    def _on_grad(self, pending: PendingBackward, side: str, paths: list, grad: Any) -> None:
        s = self.session
        tls = s._tls
        prev = getattr(tls, "busy", False)
        tls.busy = True
        try:
            if pending.done:
                return
            if not s.open_step(pending.step):
                pending.done = True
                self.pending.pop(id(pending), None)
                return
            if pending.order is None:
                self._fired += 1
                pending.order = self._fired
            grads = pending.grads_in if side == "input" else pending.grads_out
            if isinstance(grad, Tensor):
                first = self.leaves.tensor_leaf(side, paths[0], grad)
                for p in paths:
                    grads[p] = first if p == paths[0] else first.replace(path=p)
        except Exception as exc:
            self.internal_error(exc)
        finally:
            tls.busy = prev

    def backward_end(self) -> None:
        """A gradient computation returned: emit every entry that received a gradient, in
        the order of their first gradient; entries that received none never will."""
        tls = self.session._tls
        prev = getattr(tls, "busy", False)
        tls.busy = True
        try:
            fired = sorted((p for p in self.pending.values() if p.order is not None), key=lambda p: p.order)
            for pending in fired:
                pending.done = True
                if pending.keys and self.session.open_step(pending.step):
                    self.session.emit(pending.to_call())
            self.pending.clear()
            self._fired = 0
        except Exception as exc:
            self.internal_error(exc)
        finally:
            tls.busy = prev

    def flush_pending(self) -> None:
        """Step end: emit what is still pending and forget the step's Cells."""
        self.backward_end()
        self.cells_seen.clear()
        self.scope.reset()

    # --- debug save ----------------------------------------------------------------------------
    def save(self, variable: Any, name: str, k: int, save_backward: bool) -> Any:
        """Record ``variable`` as ``{name}.{k}`` and, with ``save_backward``, its gradients
        as ``{name}_grad.{k}`` (spec 6.1/6.2). Returns the value the caller should keep
        using: with ``save_backward`` during a gradient computation, tensors are replaced by
        identities that report their gradient."""
        s = self.session
        tls = s._tls
        prev = getattr(tls, "busy", False)
        tls.busy = True
        try:
            entry = f"{name}.{k}"
            leaves: list[Leaf] = []
            for p, v, kind in _walk_for_save(variable):
                if kind == schema.LEAF_TENSOR:
                    leaves.append(self.leaves.tensor_leaf("", p, v))
                else:
                    tmp: list[Leaf] = []
                    self.leaves.leaves(entry, "", v, tmp, p)
                    leaves.extend(tmp)
            s.emit(Call(step=s.step, kind=schema.DEBUG_SAVE, name=entry, api_type="debug", leaves=tuple(leaves)))
            if not save_backward:
                return variable
            gname = f"{name}_grad.{k}"
            structure = [Leaf(io="", path=p, leaf_kind=schema.LEAF_NONE) for p, _v, kind in _walk_for_save(variable)
                         if kind == schema.LEAF_TENSOR] or [Leaf(io="", path=(), leaf_kind=schema.LEAF_NONE)]
            s.emit(Call(step=s.step, kind=schema.DEBUG_SAVE, name=gname, api_type="debug", leaves=tuple(structure)))
            # file names of the gradients as the saved tensors', whatever order they arrive in
            s.reserve_file_names(gname, schema.DEBUG_SAVE, [("", leaf.path) for leaf in leaves
                                                            if leaf.leaf_kind == schema.LEAF_TENSOR])
            if grad_active():
                for p, v, kind in _walk_for_save(variable):
                    if kind == schema.LEAF_TENSOR and (v.is_floating_point() or v.is_complex()):
                        v.register_hook(self._save_grad_hook(gname, p))
            return variable
        except Exception as exc:
            self.internal_error(exc)
            return variable
        finally:
            tls.busy = prev

    def _save_grad_hook(self, gname: str, path: tuple) -> Callable:
        s = self.session
        step = s.step

        def hook(g):
            if not isinstance(g, Tensor) or s.failed or s.disabled:
                return None
            tls = s._tls
            prev = getattr(tls, "busy", False)
            tls.busy = True
            try:
                leaf = self.leaves.tensor_leaf("", path, g)
                s.emit(Call(step=step, kind=schema.DEBUG_SAVE, name=gname, api_type="debug", leaves=(leaf,)))
            except Exception as exc:
                self.internal_error(exc)
            finally:
                tls.busy = prev
            return None

        return hook

    def internal_error(self, exc: BaseException) -> None:
        """Log an internal error once and stop recording (:meth:`Session.internal_error`)."""
        self.session.internal_error(exc)


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
