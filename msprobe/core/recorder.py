"""The framework-neutral part of a recorder: plans, frames, filters and pending backward entries.

A recorder turns intercepted calls into :class:`store.records.Call` events for its session.
What does not depend on the framework lives here, once, and the PyTorch and MindSpore
recorders (``msprobe.pytorch.recorder``, ``msprobe.mindspore.recorder``) derive from
:class:`RecorderCore`; each adapter supplies only tensor leaves, backward taps and the
question whether a gradient graph is being recorded (:meth:`RecorderCore.grad_active`).

The decisions made here, per call or module/Cell forward starting now (spec 5.4-5.5 with
section 9 fix 19 and 21):

- ``data_mode``: which directions and sides an entry holds (:class:`~msprobe.core.filters.DataMode`).
- ``scope``: a range opens at its first forward entry and closes when its last one has
  finished, both included; a backward entry exists only for a forward inside it.
- ``list``: an entry is kept when its name contains a listed substring; at level ``mix``
  everything running inside a module/Cell whose forward (backward) name matched is kept too.

Nothing here imports a deep-learning framework.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from msprobe.core.filters import ScopeRange
from msprobe.core.guard import Guarded
from msprobe.core.naming import to_backward
from store import schema
from store.records import Call, Leaf, null_leaf

Path = tuple


class PendingBackward:
    """The gradients of one recorded forward call or module/Cell forward, collected while
    backward runs; :meth:`to_call` makes its backward entry.

    Args (keyword only):
        step: the step of the forward (int).
        name: the backward entry's name (``Tensor.add.0.backward``, ``Module.fc.Linear.backward.0``).
        kind: ``schema.API_BACKWARD`` or ``schema.MODULE_BACKWARD``.
        api_type: the entry's API family or module/Cell type.
        parent: the backward name of the enclosing module/Cell (construct.json), or None.
        stack_id: the forward's stack id, or None.
        keys: the entry's dump.json keys (``DataMode.backward_keys()``).

    ``in_slots``/``out_slots``: the argument paths of backward ``input`` (gradients w.r.t.
    the forward outputs) and ``output`` (w.r.t. the forward inputs), in argument order;
    ``grads_in``/``grads_out``: the leaf per path that received a gradient."""

    __slots__ = ("step", "name", "kind", "api_type", "parent", "stack_id", "keys",
                 "in_slots", "out_slots", "grads_in", "grads_out", "done")

    def __init__(self, *, step: int, name: str, kind: str, api_type: str,
                 parent: Optional[str], stack_id: Optional[int], keys: tuple[str, ...]) -> None:
        self.step, self.name, self.kind, self.api_type = step, name, kind, api_type
        self.parent, self.stack_id, self.keys = parent, stack_id, keys
        self.in_slots: list[Path] = []
        self.out_slots: list[Path] = []
        self.grads_in: dict[Path, Any] = {}
        self.grads_out: dict[Path, Any] = {}
        self.done = False

    def to_call(self) -> Call:
        """The backward entry: one leaf per slot, a missing gradient as a ``none`` leaf."""
        leaves: list[Leaf] = []
        if "input" in self.keys:
            _fill(leaves, "input", self.in_slots, self.grads_in)
        if "output" in self.keys:
            _fill(leaves, "output", self.out_slots, self.grads_out)
        return Call(step=self.step, kind=self.kind, name=self.name, api_type=self.api_type,
                    parent=self.parent, stack_id=self.stack_id, keys=self.keys, leaves=tuple(leaves))


def _fill(out: list, io: str, slots: Iterable[Path], grads: dict) -> None:
    for path in slots:
        leaf = grads.get(path)
        out.append(leaf if leaf is not None else null_leaf(io, path))


class Plan:
    """An API call in progress: what its forward entry needs once the call has returned.

    ``name``: the forward entry's name; ``api_type``: the API family; ``want_fwd``: the
    forward entry is recorded; ``pending``: its backward entry, or None; ``leaves``: the
    input leaves built so far; ``parent``/``stack_id``: construct.json parent and stack
    id. Adapters derive to add what they carry (autograd taps, held tensors)."""

    __slots__ = ("name", "api_type", "want_fwd", "pending", "leaves", "parent", "stack_id")


class Frame(Plan):
    """A module/Cell forward in progress; the innermost one parents the calls inside it.

    ``prefix``: the module's dump name prefix (``Module.fc.Linear``); ``keep_fwd``/
    ``keep_bwd``: its forward/backward name matched the ``list`` at level mix, so
    everything running inside it is kept (spec 5.5)."""

    __slots__ = ("prefix", "keep_fwd", "keep_bwd")


class RecorderCore:
    """What a recorder of either framework does the same way.

    Args:
        session: the recording session (:class:`msprobe.core.session.Session`: state,
            counters, filters, writer).

    Attributes set here: ``session``, ``dm`` (the session's ``DataMode``), ``scope``
    (:class:`~msprobe.core.filters.ScopeRange`), ``pending`` (``id -> PendingBackward``
    waiting for gradients), ``modules_seen`` (module/Cell prefixes with a recorded
    forward this step), ``api_keys``/``module_keys``/``bwd_keys`` (the dump.json keys of
    a forward API entry, a forward module entry and a backward entry).

    Subclasses set :attr:`RECOMPUTE` (whether forward entries carry ``is_recompute``) and
    implement :meth:`grad_active`.
    """

    #: forward entries carry ``is_recompute`` (activation checkpointing, PyTorch)
    RECOMPUTE = False

    def __init__(self, session: Any) -> None:
        cfg = session.config
        self.session = session
        self.dm = dm = session.data_mode
        self.pending: dict[int, PendingBackward] = {}
        self.modules_seen: set[str] = set()
        self.scope = ScopeRange.from_config(cfg.scope)
        self.list_inside = cfg.level == "mix" and bool(cfg.list)
        # no scope and no list: only data_mode and the gradient graph decide (wanted)
        self._unfiltered = self.scope.first is None and not cfg.list
        self._dm_fwd, self._dm_bwd = dm.forward, dm.backward
        self._fwd_input = dm.allows("forward", "input")
        self._fwd_output = dm.allows("forward", "output")
        self._parameters = dm.allows_parameters()
        recompute = ("is_recompute",) if self.RECOMPUTE else ()
        inputs = ("input_args", "input_kwargs") if self._fwd_input else ()
        outputs = ("output",) if self._fwd_output else ()
        self.api_keys: tuple[str, ...] = inputs + recompute + outputs
        self.module_keys: tuple[str, ...] = (inputs + outputs + (("parameters",) if self._parameters else ())
                                             + recompute)
        self.bwd_keys: tuple[str, ...] = dm.backward_keys()

    def grad_active(self) -> bool:
        """True when a call starting now can have a backward (a gradient graph is recorded)."""
        raise NotImplementedError

    # --- per-thread state -------------------------------------------------------------------
    def _frames(self) -> Optional[list]:
        """This thread's module/Cell stack (``Session.module_stack``), or None where this
        thread has none. Read from the ``threading.local``'s own dict: a ``getattr`` of an
        attribute this thread never set raises and catches an AttributeError (0.3–1 µs, on
        every API call at level L1, where no module stack exists)."""
        return self.session.local.__dict__.get("frames")

    def parent(self) -> Optional[str]:
        """The forward name of this thread's innermost recorded module/Cell, or None."""
        stack = self._frames()
        if stack:
            for frame in reversed(stack):
                if isinstance(frame, Frame):
                    return frame.name
        return None

    def _kept_inside(self) -> tuple[bool, bool]:
        """``(forward, backward)``: a running module/Cell matched the ``list`` at mix (spec 5.5)."""
        fwd = bwd = False
        if self.list_inside:
            for frame in self._frames() or ():
                if isinstance(frame, Frame):
                    fwd |= frame.keep_fwd
                    bwd |= frame.keep_bwd
        return fwd, bwd

    def wanted(self, fwd: str, bwd: str) -> tuple[bool, bool]:
        """Whether the forward entry ``fwd`` and the backward entry ``bwd`` of a call or
        module/Cell starting now are recorded: data_mode, scope (entered here: inclusive,
        a backward follows its forward), list and :meth:`grad_active`."""
        if self._unfiltered:  # what the lines below give with an empty scope and list
            return self._dm_fwd, self._dm_bwd and self.grad_active()
        if not self.scope.enter(fwd):
            return False, False
        s = self.session
        inside_fwd, inside_bwd = self._kept_inside()
        return (self._dm_fwd and (inside_fwd or s.accepts(fwd)),
                self._dm_bwd and (inside_bwd or s.accepts(bwd)) and self.grad_active())

    # --- plans and frames --------------------------------------------------------------------
    def start_plan(self, plan: Plan, name: str, api_type: str, want_fwd: bool) -> Plan:
        """Fill the fields of ``plan`` (a fresh :class:`Plan` or :class:`Frame`) shared by
        both kinds: name, API type, parent, stack id (captured now), no leaves, no pending."""
        plan.name, plan.api_type, plan.want_fwd = name, api_type, want_fwd
        plan.parent = self.parent()
        plan.stack_id = self.session.stacks.capture()
        plan.leaves = []
        plan.pending = None
        return plan

    def start_frame(self, frame: Frame, prefix: str, fwd: str, bwd: str, api_type: str, want_fwd: bool) -> Frame:
        """:meth:`start_plan` for the module/Cell ``prefix`` whose forward is ``fwd`` (and
        backward ``bwd``), with its ``list`` matches; notes ``prefix`` in ``modules_seen``."""
        self.start_plan(frame, fwd, api_type, want_fwd)
        frame.prefix = prefix
        inside = self.list_inside
        frame.keep_fwd = inside and self.session.name_list.matches(fwd)
        frame.keep_bwd = inside and self.session.name_list.matches(bwd)
        self.modules_seen.add(prefix)
        return frame

    def new_pending(self, plan: Plan, name: str, kind: str, cls: type = PendingBackward) -> PendingBackward:
        """The backward entry ``name`` of ``plan`` (``kind``: ``schema.API_BACKWARD`` or
        ``schema.MODULE_BACKWARD``), as an instance of ``cls``; set as ``plan.pending``."""
        pending = plan.pending = cls(step=self.session.step, name=name, kind=kind, api_type=plan.api_type,
                                     parent=to_backward(plan.parent), stack_id=plan.stack_id,
                                     keys=self.bwd_keys)
        return pending

    def forward_call(self, plan: Plan, kind: str, is_recompute: Optional[bool] = None) -> Call:
        """The forward entry of ``plan`` (``kind``: ``schema.API_FORWARD`` or
        ``schema.MODULE_FORWARD``) with the leaves built so far; ``is_recompute``: None
        where the framework has no such flag (:attr:`RECOMPUTE` False)."""
        keys = self.api_keys if kind == schema.API_FORWARD else self.module_keys
        return Call(step=self.session.step, kind=kind, name=plan.name, api_type=plan.api_type,
                    parent=plan.parent, stack_id=plan.stack_id, is_recompute=is_recompute,
                    keys=keys, leaves=tuple(plan.leaves))

    # --- parameter gradients ------------------------------------------------------------------
    def parameters_grad_entry(self, prefix: str, recorded_backward: bool = False) -> Optional[str]:
        """The name of the ``{prefix}.parameters_grad`` entry if a gradient of module/Cell
        ``prefix``'s parameters is recorded now, else None: recording runs, data_mode
        holds parameter gradients, and the name passes the filters (or ``recorded_backward``:
        the module's backward is recorded this step). Whether the module ran this step is
        the adapter's check."""
        s = self.session
        if s.failed or s.disabled or not self.dm.allows_parameters_grad():
            return None
        name = f"{prefix}.parameters_grad"
        return name if recorded_backward or s.accepts(name) else None

    # --- backward ------------------------------------------------------------------------------
    def accepts_grad(self, pending: PendingBackward) -> bool:
        """Whether a gradient arriving for ``pending`` is recorded: the entry is not done
        and its step is still open (else it is marked done and forgotten)."""
        if pending.done:
            return False
        if not self.session.open_step(pending.step):
            pending.done = True
            self.pending.pop(id(pending), None)
            return False
        return True

    def step_reset(self) -> None:
        """Step end: forget the step's modules/Cells and close the scope."""
        self.modules_seen.clear()
        self.scope.reset()

    def guarded(self) -> "Guarded":
        """``with self.guarded():`` runs msprobe's own code: this thread is busy inside, and
        an ``Exception`` raised there is :meth:`internal_error` and does not propagate."""
        return Guarded(self.internal_error)

    def internal_error(self, exc: BaseException) -> None:
        """Log an internal error once and stop recording (``Session.internal_error``)."""
        self.session.internal_error(exc)
