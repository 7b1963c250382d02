"""Recording inside ``torch.compile``'d regions (config ``"compiled_regions": "inside"``).

By default (``"root"``) every msprobe hook and API wrapper only passes the call through
while torch.compile traces (:mod:`msprobe.pytorch.compiled`), so the compiled graphs are the
ones compiled without msprobe. With ``"inside"``, a module hook or API wrapper that Dynamo
traces adds to the graph one call of the opaque custom op ``msprobe::record`` after the
call (module: one before, with the inputs and parameters, and one after, with the output).
The op takes the call's tensors as inputs, returns nothing and writes no tensor, so the
graph computes what it computed without it; at run time it rebuilds the call's arguments
and hands them to the recorder, which writes the same forward entry an eager call writes
(same name, counter, parent module and statistics).

How the pieces fit (torch >= 2.4):

- :func:`capture` is registered with ``torch.compiler.allow_in_graph``: Dynamo does not
  trace into it but puts a call of it into its FX graph, with the call's arguments (tensors
  as graph values, everything else as constants). The backend runs it: ``eager`` at run
  time with real tensors, AOTAutograd (``aot_eager``, ``inductor``) once while it traces,
  with fake tensors, which puts the op into the aten graph.
- :func:`capture` flattens its payload with ``torch.utils._pytree``, keeps the structure
  and the non-tensor values in a :class:`_Site` (one per distinct call shape), and calls
  ``msprobe::record(site, tensors, ints)`` (``ints``: symbolic sizes, read at run time).
- ``msprobe::record`` is registered as an ordered effectful op
  (``torch._higher_order_ops.effects``): AOTAutograd threads an effect token through every
  call, so no pass removes it (it has no output) or reorders the calls among themselves;
  entries come out in the order the calls ran.
- Which calls: those Dynamo traces through an API wrapper, and those Dynamo put into its
  graph as one node (``a + b`` is ``operator.add``, which calls ``Tensor.__add__``) that
  AOTAutograd then runs (:func:`_graph_code`). Calls that AOTAutograd's decompositions
  make are not the user's and are not recorded. Only the outermost API call is recorded
  (as in eager): a wrapper inside another wrapper's call sees :data:`_NESTING` ``.depth``
  > 0 (Dynamo models the attribute's change while it traces).

Backward entries of calls inside a compiled region are not recorded: their gradients are
computed by the compiled backward graph, where no autograd node of the call exists.
Parameter gradients are recorded as with ``"root"`` (docs/pytorch.md, "torch.compile").
"""
from __future__ import annotations

import itertools
import logging
import re
import sys
import threading
import weakref
from typing import Any, Callable, Optional, Sequence

import torch
from torch.fx.node import _get_qualified_name as _qualified_name
from torch.utils import _pytree as pytree

from msprobe.core.handles import CallbackHandle, HandleGroup
from msprobe.core.recorder import Frame
from msprobe.pytorch.compiled import is_compiling

logger = logging.getLogger("msprobe")

#: call kinds of a site: an API call, a module's forward start and its end
API, PRE, POST = "api", "pre", "post"

_ids = itertools.count()
_RECORDERS: dict[int, "weakref.ref[Any]"] = {}   # recorder id -> Recorder
_SITES: list["_Site"] = []                        # site id -> site
_SITE_IDS: dict[tuple, int] = {}                  # site key -> site id
_lock = threading.Lock()
_warned: list = []

#: True only while Dynamo traces Python code symbolically (not while AOTAutograd or a
#: backend runs code for real, where ``torch.compiler.is_compiling()`` is also True)
is_dynamo_compiling = getattr(torch.compiler, "is_dynamo_compiling", lambda: False)
#: the code of ``torch.fx.Interpreter.call_function``/``call_method`` (run one node of a graph)
_INTERPRETER_CALLS = (torch.fx.Interpreter.call_function.__code__, torch.fx.Interpreter.call_method.__code__)
#: recorder id -> API keys that graphs run by the ``eager`` backend call through the wrapper
_CALLED_BY_NAME: dict[int, frozenset] = {}


class _Nesting:
    """``depth``: how many API wrappers are inside their original's call in the code
    being traced (only the outermost call is recorded). An instance attribute: Dynamo
    guards on its value (0 when a traced frame starts)."""

    def __init__(self) -> None:
        self.depth = 0


_NESTING = _Nesting()


class _Site:
    """One recorded call shape: ``kind`` (:data:`API`, :data:`PRE`, :data:`POST`), the
    recorder id ``rid``, ``name`` (API key ``Functional.relu`` or module prefix
    ``Module.fc1.Linear``), ``family`` (API family; None for modules), the payload's
    ``spec`` (a pytree ``TreeSpec``) and ``leaves``: the flat payload with each tensor
    replaced by ``("t", i)`` and each symbolic int by ``("i", j)`` (indices into the
    op's ``tensors`` and ``ints``); other values as they were traced. ``grads``: per
    tensor, its ``requires_grad`` where the call was traced (at run time the compiled
    forward computes without autograd)."""

    __slots__ = ("kind", "rid", "name", "family", "spec", "leaves", "grads", "traced", "inner")

    def __init__(self, kind: str, rid: int, name: str, family: Optional[str], spec: Any, leaves: list,
                 grads: tuple, traced: tuple) -> None:
        self.kind, self.rid, self.name, self.family, self.spec, self.leaves = kind, rid, name, family, spec, leaves
        self.grads = grads
        #: ``(file, line, function, source)`` of the traced call's frames, innermost first
        self.traced = traced
        #: ``traced``'s user frames formatted for stack.json (set at the first run)
        self.inner: Optional[tuple[str, ...]] = None


class _Slot(tuple):
    """A placeholder leaf of :attr:`_Site.leaves`: ``("t", i)`` or ``("i", j)``."""


def _record_body(site: int, tensors: Sequence[Optional[torch.Tensor]], ints: Sequence[int]) -> None:
    """Run-time body of ``msprobe::record``: record the call of site ``site`` whose tensors
    are ``tensors`` and symbolic sizes ``ints`` (:func:`_run`). Returns nothing."""
    _run(site, list(tensors), list(ints))


def _record_fake(site: int, tensors: Sequence[Optional[torch.Tensor]], ints: Sequence[int]) -> None:
    return None


_defined: list = []  # [the torch.library.Library] once msprobe::record exists in this process


def _define_op() -> None:
    """Define ``msprobe::record`` (once per process) and register it as an ordered side
    effect: no compiler pass removes it or reorders its calls.

    Raises:
        RuntimeError: this torch lacks what is needed (``torch.library.register_fake``,
            ``torch.compiler.is_dynamo_compiling``, ``torch.compiler.allow_in_graph``).
    """
    if _defined:
        return
    if not all(hasattr(m, a) for m, a in ((torch.library, "register_fake"), (torch.compiler, "is_dynamo_compiling"),
                                          (torch.compiler, "allow_in_graph"))):
        raise RuntimeError(f"torch {torch.__version__} lacks torch.library.register_fake or torch.compiler's "
                           "is_dynamo_compiling/allow_in_graph (torch >= 2.4 has them)")
    # the plain operator-registration API: a call costs ~3 us on the CPU, against ~10-35 us
    # through torch.library.custom_op's Python wrappers (measured with torch 2.13)
    lib = torch.library.Library("msprobe", "DEF")
    lib.define("record(int site, Tensor?[] tensors, SymInt[] ints) -> ()")
    lib.impl("record", _record_body, "CompositeExplicitAutograd")
    torch.library.register_fake("msprobe::record", _record_fake, lib=lib)
    _defined.append(lib)  # the registrations live as long as this object
    overload = torch.ops.msprobe.record.default
    try:
        from torch._higher_order_ops.effects import _EffectType, _register_effectful_op
        _register_effectful_op(overload, _EffectType.ORDERED)
    except (ImportError, AttributeError):  # older torch: at least not removed as dead code
        torch.fx.node.has_side_effect(overload)
    global capture
    capture = torch.compiler.allow_in_graph(capture)


def _is_symbolic(x: Any) -> bool:
    return isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool))


def capture(rid: int, kind: str, name: str, family: Optional[str], payload: Any) -> None:
    """Put one ``msprobe::record`` call for ``payload`` into the graph being traced (or,
    under the ``eager`` backend, run it now).

    Args:
        rid: the recorder's id (:func:`enable`).
        kind: :data:`API` (``payload = (args, kwargs, output)``), :data:`PRE`
            (``(args, kwargs, parameters)``) or :data:`POST` (``output``).
        name: API key (``Functional.relu``) or module prefix (``Module.fc1.Linear``).
        family: the API family (``Functional``), None for a module.
        payload: any pytree of tensors and Python values.
    """
    if kind == API and not is_compiling() and name in _CALLED_BY_NAME.get(rid, ()):
        return  # the eager backend's graph ran the wrapper, which recorded the call
    flat, spec = pytree.tree_flatten(payload)
    tensors: list = []
    ints: list = []
    leaves: list = []
    for x in flat:
        if isinstance(x, torch.Tensor):
            leaves.append(_Slot(("t", len(tensors))))
            tensors.append(x)
        elif isinstance(x, torch.SymInt):
            leaves.append(_Slot(("i", len(ints))))
            ints.append(x)
        elif _is_symbolic(x):  # a symbolic float or bool: no value to hand over
            leaves.append(None)
        elif type(x) is str and x.startswith(_OPAQUE):
            leaves.append(Opaque(x[len(_OPAQUE):]))
        else:
            leaves.append(x)
    grads = tuple(bool(t.requires_grad) for t in tensors)
    traced = _traced_frames()
    key = (kind, rid, name, family, str(spec), repr(leaves), grads, traced)
    with _lock:
        site = _SITE_IDS.get(key)
        if site is None:
            site = _SITE_IDS[key] = len(_SITES)
            _SITES.append(_Site(kind, rid, name, family, spec, leaves, grads, traced))
    torch.ops.msprobe.record(site, tensors, ints)


_FRAME_RE = re.compile(r'\s*File "(.+)", line (\d+), in (.+)$')


def _traced_frames() -> tuple:
    """The frames of the call being traced, innermost first, as ``(file, line, function,
    source)``: the ``stack_trace`` that Dynamo gave the graph node AOTAutograd runs now
    (``torch.fx.traceback``); ``()`` where there is none (the ``eager`` backend runs the
    graph without node metadata)."""
    try:
        meta = torch.fx.traceback.get_current_meta()
    except Exception:
        return ()
    text = meta.get("stack_trace") if meta else None
    if not isinstance(text, str):
        return ()
    lines = text.splitlines()
    frames = []
    for i, line in enumerate(lines):
        m = _FRAME_RE.match(line)
        if m:
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            source = "" if _FRAME_RE.match(nxt) else nxt.strip()
            frames.append((m.group(1), int(m.group(2)), m.group(3), source))
    return tuple(reversed(frames))


def _stack_id(recorder: Any, site: _Site) -> int:
    """stack.json id of a call of ``site`` now: the traced user frames inside the compiled
    code, then the user frames around the compiled call
    (:meth:`msprobe.core.stack.StackInterner.capture_around`)."""
    stacks = recorder.session.stacks
    if site.inner is None:
        site.inner = tuple(f"File {path}, line {line}, in {func}, \n {source}"
                           for path, line, func, source in site.traced if stacks.is_user_file(path))
    return stacks.capture_around(site.inner)


def _rebuild(site: _Site, tensors: list, ints: list) -> Any:
    """The payload of ``site`` with the run's tensors and sizes in place; a tensor that
    required grad where the call was traced is given as a detached alias that does (the
    same memory; the run's tensor is not changed)."""
    tensors = list(tensors)
    aliases: dict = {}
    for i, t in enumerate(tensors):
        if t is not None and site.grads[i] and not t.requires_grad:
            alias = aliases.get(id(t))
            if alias is None:
                alias = aliases[id(t)] = t.detach().requires_grad_()
            tensors[i] = alias
    flat = [(tensors[x[1]] if x[0] == "t" else ints[x[1]]) if type(x) is _Slot else x for x in site.leaves]
    return pytree.tree_unflatten(flat, site.spec)


class _Params:
    """Stands for a module in :meth:`Recorder.module_pre`: its own parameters as given to
    the op (``named_parameters(recurse=False)``); identified by ``id()`` until
    :meth:`Recorder.module_post`."""

    __slots__ = ("params",)

    def __init__(self, params: dict) -> None:
        self.params = params

    def named_parameters(self, recurse: bool = False):
        return iter(self.params.items())


class _Modules(threading.local):
    """Per thread: the :class:`_Params` of the compiled modules whose forward runs."""

    def __init__(self) -> None:
        self.stack: list = []


_modules = _Modules()


def _run(site_id: int, tensors: list, ints: list) -> None:
    """Record one call at run time (the body of ``msprobe::record``). Never raises into
    the compiled code: an error is the recorder's internal error."""
    site = _SITES[site_id]
    ref = _RECORDERS.get(site.rid)
    recorder = ref() if ref is not None else None
    if site.kind == POST:
        holder = _modules.stack.pop() if _modules.stack else None
        if holder is None or recorder is None:
            return
    elif recorder is None:
        if site.kind == PRE:
            _modules.stack.append(None)
        return
    pushed = False
    try:
        payload = _rebuild(site, tensors, ints)
        # the call's gradients belong to the compiled backward graph: no backward entry
        # (grad mode off: the recorder's gradient taps are not set)
        with torch.no_grad():
            if site.kind == API:
                _record_api(recorder, site, *payload)
            elif site.kind == PRE:
                args, kwargs, params = payload
                holder = _Params(params)
                _modules.stack.append(holder)
                pushed = True
                recorder.module_pre(holder, site.name, tuple(args), kwargs)
                frames = recorder.session.module_stack()
                if frames and isinstance(frames[-1], Frame) and frames[-1].prefix == site.name:
                    frames[-1].stack_id = _stack_id(recorder, site)
            else:
                recorder.module_done(holder)
                recorder.module_post(holder, payload)
    except Exception as exc:
        if site.kind == PRE and not pushed:  # its POST finds a placeholder: nothing to close
            _modules.stack.append(None)
        recorder.internal_error(exc)


def _record_api(recorder: Any, site: _Site, args: Any, kwargs: dict, out: Any) -> None:
    """The forward entry of the API call ``site`` whose arguments were ``args``/``kwargs``
    and whose result is ``out`` (the call itself already ran in the compiled code)."""
    s = recorder.session
    tls = s._tls
    if not s.recording or tls.busy or recorder.exclusive is not None:
        return
    tls.busy = True
    recorder._closing = None
    try:
        # tensors inside a compiled graph change without a version bump (buffers reused in
        # place by inductor): no statistics are reused across calls
        recorder.leaves.memo.clear()
        plan = recorder._api_before(site.family, site.name, tuple(args), kwargs)
        closing = recorder._closing
        if plan is not None:
            plan.stack_id = _stack_id(recorder, site)
            recorder._api_after(plan, out)
        if closing is not None:
            recorder.scope.exit(closing)
    finally:
        tls.busy = False


# --- hooks' side: called while Dynamo traces ------------------------------------------------
def note_called_by_name(rid: int, apis: list[tuple[str, Any]]) -> None:
    """Note which APIs (``(key, original)``) of recorder ``rid`` a graph run by the
    ``eager`` backend calls through their wrapper: FX's generated code calls a function of
    torch by its qualified name (``torch.nn.functional.relu``, ``torch.tanh``), which
    resolves to the wrapper now in place, and the wrapper records the call as in eager
    (with its backward); :func:`capture` then adds no second entry."""
    named = set()
    for key, original in apis:
        try:
            qualified = _qualified_name(original)
        except Exception:
            continue
        obj: Any = torch
        for part in qualified.split(".")[1:]:
            obj = getattr(obj, part, None)
        if qualified.startswith("torch.") and getattr(obj, "__msprobe_original__", None) is not None:
            named.add(key)
    _CALLED_BY_NAME[rid] = frozenset(named)


def _graph_code(frame: Any) -> bool:
    """Whether ``frame`` (the caller of an API wrapper) runs a node of an FX graph, by its
    generated code (``<eval_with_key>.N``) or ``torch.fx.Interpreter``: AOTAutograd
    running a node of Dynamo's graph, which Dynamo recorded as a call of the user's
    (``a + b`` as ``operator.add``, ``F.relu`` kept whole)."""
    return frame is not None and (frame.f_code in _INTERPRETER_CALLS
                                  or frame.f_code.co_filename.startswith("<eval_with_key>"))


#: leaf types a graph node can take as arguments (others are replaced: :func:`_graphable`)
_GRAPHABLE = (torch.Tensor, bool, int, float, str, torch.dtype, torch.device, torch.layout,
              torch.memory_format, slice, type(None), type(Ellipsis), torch.SymInt, torch.SymFloat, torch.SymBool)
#: prefix of the text that stands for an argument of another type
_OPAQUE = "\x00msprobe-opaque:"


def _graphable(value: Any) -> Any:
    """``value`` (a call's arguments or output, while Dynamo traces) with every value that
    a graph node cannot take (an object of a user class) replaced by a text naming its
    type, which :func:`capture` turns into an :class:`Opaque`: otherwise Dynamo would break
    the graph there (an error under ``fullgraph=True``). Plain lists, tuples and dicts are
    walked; other tuples (``torch.return_types``, named tuples) are kept as they are."""
    kind = type(value)
    if kind is list or kind is tuple:
        items = [_graphable(v) for v in value]
        return items if kind is list else tuple(items)
    if kind is dict:
        return {k: _graphable(v) for k, v in value.items()}
    if isinstance(value, tuple) or isinstance(value, _GRAPHABLE):
        return value
    return _OPAQUE + kind.__module__ + "." + kind.__qualname__


class Opaque:
    """Stands for an argument inside a compiled region that the graph could not carry
    (an object of a user class): dump.json records ``{"type": "...Opaque", "value":
    "<{module}.{class} object>"}``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name} object>"


def api_call(rid: int, family: str, key: str, original: Callable, args: tuple, kwargs: dict) -> Any:
    """An API wrapper's body while torch.compile traces, with ``"inside"``: the original's
    result, and a record of the call after it when it is the outermost wrapped call."""
    if not is_dynamo_compiling() and not _graph_code(sys._getframe(2)):
        # run for real by the compiler (a decomposition, or code inside a call that
        # Dynamo's graph holds as one node): not a call of the user's code
        return original(*args, **kwargs)
    depth = _NESTING.depth
    _NESTING.depth = depth + 1
    out = original(*args, **kwargs)
    _NESTING.depth = depth
    if depth == 0:
        capture(rid, API, key, family, _graphable((args, kwargs, out)))
    return out


def module_pre(rid: int, prefix: str, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """A module's forward pre-hook while torch.compile traces, with ``"inside"``."""
    if not is_dynamo_compiling():
        return
    capture(rid, PRE, prefix, None, _graphable((args, kwargs, dict(module.named_parameters(recurse=False)))))


def module_post(rid: int, prefix: str, output: Any) -> None:
    """A module's forward hook while torch.compile traces, with ``"inside"``."""
    if not is_dynamo_compiling():
        return
    capture(rid, POST, prefix, None, _graphable(output))


def enable(recorder: Any, group: HandleGroup) -> Optional[int]:
    """Make ``recorder`` reachable from compiled code (held weakly) and return its id;
    ``group`` gets a handle for the end of recording. Dynamo's caches are reset now and
    when the handle is removed (``torch.compiler.reset()``): code compiled before is
    compiled again, with the
    recording calls in it, at its next call, and without them after the hooks are gone
    (Dynamo does not guard on module hooks, so nothing else would recompile it).
    None (with a warning, once) where this torch cannot: compiled regions are then
    recorded as with ``"root"``."""
    try:
        _define_op()
    except Exception as exc:
        if not _warned:
            _warned.append(True)
            logger.warning("msprobe: compiled_regions \"inside\" is not available (%s); "
                           "compiled regions are recorded as with \"root\"", exc)
        return None
    for rid, ref in _RECORDERS.items():
        if ref() is recorder:
            break
    else:
        rid = next(_ids)
        _RECORDERS[rid] = weakref.ref(recorder)
    torch.compiler.reset()
    group.add(CallbackHandle(torch.compiler.reset))
    return rid


def inside(recorder: Any) -> bool:
    """Whether ``recorder``'s config records inside compiled regions."""
    return getattr(recorder.session.config, "compiled_regions", "root") == "inside"
