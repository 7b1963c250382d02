"""API interception: wrap the functions named in ``support_wrap_ops.yaml``.

Families (spec section 7.1): ``Tensor`` (``torch.Tensor`` methods), ``Torch`` (``torch.*``),
``Functional`` (``torch.nn.functional``), ``VF`` (``torch._VF``), ``Distributed``
(``torch.distributed``, recorded by :mod:`msprobe.pytorch.dist_hooks`), ``Aten``
(``torch.ops.aten`` packets, transparent proxies of :mod:`msprobe.pytorch.aten_hooks`) and ``NPU``
(``torch_npu`` custom ops, yaml key ``torch_npu``, only when ``torch_npu`` is importable). Each listed name is
replaced by a wrapper that, while the session records and the thread is not already
inside a recorded call, hands the call to :meth:`Recorder.record_api`; otherwise it calls
the original at once. ``install_api_hooks`` returns a handle that restores every original.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import os
import sys
import types
from typing import Any, Callable, Optional

import torch

from msprobe.core.api_list import ApiSpec
from msprobe.core.api_list import load_api_list as read_api_list
from msprobe.core.handles import CallbackHandle, HandleGroup, finish_wrapper, restore_attribute
from msprobe.pytorch.aten_hooks import FAMILY as ATEN_FAMILY, aten_namespace, make_aten_proxy
from msprobe.pytorch import compiled_record
from msprobe.pytorch.compiled import COMPILER_PACKAGES, is_compiling
from msprobe.pytorch.dist_hooks import FAMILY as DIST_FAMILY, DistributedCalls, DistributedWrapper, distributed_module
from msprobe.pytorch.jit_compat import prepare_builtin_table, script_as_original
from msprobe.pytorch.seqslot import restore_sq_item, saved_sq_item
from msprobe.pytorch.stats_memo import StatsMemo

logger = logging.getLogger("msprobe")

DEFAULT_API_LIST = os.path.join(os.path.dirname(__file__), "support_wrap_ops.yaml")

# yaml key -> (family prefix, owner resolver)
_FAMILIES: dict[str, tuple[str, Callable[[], Any]]] = {
    "tensor": ("Tensor", lambda: torch.Tensor),
    "torch": ("Torch", lambda: torch),
    "functional": ("Functional", lambda: torch.nn.functional),
    "_VF": ("VF", lambda: torch._VF),
    "aten": (ATEN_FAMILY, aten_namespace),  # packets of torch.ops.aten, see aten_hooks
    "distributed": (DIST_FAMILY, distributed_module),  # None where torch has no distributed
    "torch_npu": ("NPU", lambda: _import_optional("torch_npu")),
}


def _import_optional(name: str) -> Any:
    """The module ``name`` if it is importable, else None."""
    if importlib.util.find_spec(name) is None:
        return None
    try:
        return importlib.import_module(name)
    except Exception as exc:
        logger.warning("msprobe: %s is installed but cannot be imported (%s); its APIs are not recorded", name, exc)
        return None


def load_api_list(path: str | None = None) -> tuple[list[ApiSpec], list[str]]:
    """Read a PyTorch API list (``support_wrap_ops.yaml`` format; None = the packaged one)
    and resolve its names; see :func:`msprobe.core.api_list.load_api_list` (a
    ``torch_npu`` section is skipped quietly when torch_npu is not installed).

    Raises:
        ConfigError: the file cannot be read or parsed, or is not a mapping of lists.
    """
    return read_api_list(path or DEFAULT_API_LIST, _FAMILIES, framework="PyTorch",
                         optional=frozenset({"torch_npu"}))


def install_api_hooks(specs: list[ApiSpec], recorder: Any, targets: Optional[dict] = None) -> HandleGroup:
    """Wrap every API of ``specs`` for ``recorder``; returns handles restoring originals.

    ``targets``: filled with ``id(original) -> (original, wrapper)`` of each recording
    wrapper put in place (for :class:`msprobe.pytorch.references.References`)."""
    group = HandleGroup()
    prepare_builtin_table()  # before any wrapper is in place (see msprobe.pytorch.jit_compat)
    session = recorder.session
    # compiled_regions "inside": wrappers traced by torch.compile record (msprobe.pytorch.compiled_record)
    rid = compiled_record.enable(recorder, group) if compiled_record.inside(recorder) else None
    dist_calls = None
    traced: list[tuple[str, Any]] = []
    wrapped: set[tuple[int, str]] = set()
    for spec in specs:
        owner, name = spec.owner, spec.api
        wrapped.add((id(owner), name))
        original = getattr(owner, name)
        if spec.family == DIST_FAMILY:
            dist_calls = dist_calls or DistributedCalls(recorder)
            wrapper = DistributedWrapper(original, f"{spec.family}.{name}", dist_calls.record, session,
                                         recorder.leaves.memo)
        elif spec.family == ATEN_FAMILY:
            wrapper = make_aten_proxy(original, name, recorder.record_api, session)
        else:
            wrapper = _make_wrapper(original, spec.family, name, recorder.record_api, session, recorder.leaves.memo,
                                    rid)
        if _replace(owner, name, original, wrapper, group) and targets is not None and spec.family != ATEN_FAMILY:
            targets.setdefault(id(original), (original, wrapper))
        if rid is not None:
            traced.append((f"{spec.family}.{name}", original))
    if traced:
        compiled_record.note_called_by_name(rid, traced)
    memo = recorder.leaves.memo
    for owner, name in _unlisted_writers(wrapped):
        original = getattr(owner, name)
        _replace(owner, name, original, _make_release_wrapper(original, memo), group)
    return group


def _replace(owner: Any, name: str, original: Any, wrapper: Any, group: HandleGroup) -> bool:
    """Put ``wrapper`` in place of ``owner.name`` (``original``) and add the handle that
    restores it to ``group``; attributes that cannot be set are left alone (False)."""
    own = name in vars(owner) if isinstance(owner, type) else True
    slots = saved_sq_item(owner) if name == "__getitem__" else None
    try:
        setattr(owner, name, wrapper)
    except (AttributeError, TypeError):
        return False
    _pickle_as(wrapper, owner, name)
    restore = functools.partial(restore_attribute, owner, name, wrapper, original if own else None)
    if slots:  # a tensor stays no sequence (msprobe.pytorch.seqslot)
        restore_sq_item(slots)
        restore = functools.partial(_restore_then, restore, functools.partial(restore_sq_item, slots))
    group.add(CallbackHandle(with_script_original(restore, wrapper, original)))
    return True


def _pickle_as(wrapper: Any, owner: Any, name: str) -> None:
    """Let pickle find ``wrapper`` (a function) where it is installed, ``owner.name``, when
    the ``__module__``/``__qualname__`` copied from its original lead elsewhere (a C
    builtin such as ``torch._C._nn.gelu``, which is ``torch.nn.functional.gelu``): pickling a
    model that holds the function by reference (``GELUActivation.act``, rebound to the
    wrapper by msprobe.pytorch.references) then stores ``torch.nn.functional.gelu``, which
    loads as whatever that name is then."""
    if not isinstance(wrapper, types.FunctionType):
        return
    if isinstance(owner, types.ModuleType):
        module, qualname = owner.__name__, name
    elif isinstance(owner, type):
        module, qualname = owner.__module__, f"{owner.__qualname__}.{name}"
    else:
        return
    found = sys.modules.get(wrapper.__module__ or "")
    for part in (wrapper.__qualname__ or "").split("."):
        found = getattr(found, part, None)
    if found is wrapper or sys.modules.get(module) is None:
        return
    wrapper.__module__, wrapper.__qualname__ = module, qualname


def _restore_then(restore: Callable[[], None], after: Callable[[], None]) -> None:
    try:
        restore()
    finally:
        after()


def with_script_original(restore: Callable[[], None], wrapper: Any, original: Any) -> Callable[[], None]:
    """Make TorchScript take ``wrapper`` for ``original``
    (:func:`msprobe.pytorch.jit_compat.script_as_original`); returns ``restore`` extended to
    undo that too."""
    undo = script_as_original(wrapper, original)
    if undo is None:
        return restore

    def restore_both() -> None:
        try:
            restore()
        finally:
            undo()

    return restore_both


#: in-place spellings that write no tensor memory
_NOT_WRITERS = frozenset({"requires_grad_", "detach_", "share_memory_", "_coalesced_", "_dtensor__new__"})


def _unlisted_writers(wrapped: set[tuple[int, str]]) -> list[tuple[Any, str]]:
    """``(owner, name)`` of the in-place functions of ``torch`` and ``torch.Tensor`` (name
    ending in ``_``) that the API list does not wrap (``wrapped``: ``(id(owner), name)``):
    ``torch._foreach_add_``, ``torch._fused_adam_``, ``Tensor.apply_``..."""
    out = []
    for owner in (torch, torch.Tensor):
        for name in dir(owner):
            if (not name.endswith("_") or name.startswith("__") or name in _NOT_WRITERS
                    or (id(owner), name) in wrapped):
                continue
            fn = getattr(owner, name, None)
            if callable(fn) and not isinstance(fn, type):
                out.append((owner, name))
    return out


def _make_release_wrapper(original: Any, memo: StatsMemo) -> Callable:
    """Wrapper of an in-place API the API list does not record: before and after it runs,
    the memo forgets what it may write (:meth:`StatsMemo.release`; fused optimizers and
    ``Tensor.apply_`` bump no version, ``torch._foreach_*`` only the counter of the tensor
    given, not of its ``.data`` aliases). Nothing is recorded."""
    entries, release = memo.entries, memo.release

    def wrapper(*args, **kwargs):
        if is_compiling():  # first: torch.compile traces only the original (msprobe.pytorch.compiled)
            return original(*args, **kwargs)
        if entries and not wrapper.__msprobe_disabled__:
            release(args, kwargs)
        out = original(*args, **kwargs)
        if entries and not wrapper.__msprobe_disabled__:  # another thread may have recorded them meanwhile
            release(args, kwargs)
        return out

    return finish_wrapper(wrapper, original)


def _make_wrapper(original: Any, family: str, api: str, record: Callable, session: Any,
                  memo: StatsMemo, rid: Optional[int] = None) -> Callable:
    """The wrapper of one API; ``rid``: the recorder's id where calls traced by
    torch.compile are recorded (:mod:`msprobe.pytorch.compiled_record`), else None.

    The tests, in the order made: torch.compile tracing (``is_compiling``, first, so that
    Dynamo sees nothing else, :mod:`msprobe.pytorch.compiled`); the session recording;
    this thread inside msprobe's own code or a recorded call (``busy``,
    :mod:`msprobe.core.guard`: the call goes straight to the original); this wrapper not
    switched off (``__msprobe_disabled__``) and the caller's module not torch.compile's
    runtime (:data:`~msprobe.pytorch.compiled.COMPILER_PACKAGES`): the call is recorded.
    Otherwise, outside msprobe's own code, the statistics memo is emptied when it holds
    anything (backward entries are still recorded after ``stop()``: a write here counts)
    and the original runs. Each path reads only what decides it: two attributes for a
    call inside a recorded one, two for a call while the session is stopped."""
    key = f"{family}.{api}"
    traced = compiled_record.api_call
    tls = session._tls
    entries = memo.entries  # the memo's dict (never replaced): a cheap emptiness test
    clear = memo.clear
    getframe = sys._getframe
    compiler = COMPILER_PACKAGES

    def wrapper(*args, **kwargs):
        if is_compiling():  # first: torch.compile traces only the original (msprobe.pytorch.compiled)
            if rid is None:
                return original(*args, **kwargs)
            return traced(rid, family, key, original, args, kwargs)  # compiled_regions "inside"
        if session.recording:
            if tls.busy:  # a class default: reading it never raises
                return original(*args, **kwargs)
            if (not wrapper.__msprobe_disabled__
                    and not getframe(1).f_globals.get("__name__", "").startswith(compiler)):
                return record(original, family, key, args, kwargs)
        if entries and not tls.busy:
            clear()
        return original(*args, **kwargs)

    return finish_wrapper(wrapper, original, session)
