"""TorchScript sees the original function behind each msprobe wrapper.

``torch.jit.script`` resolves every Python value a scripted function calls: a builtin
operator (``torch.sin``, ``F.gelu``) is looked up by identity in TorchScript's builtin table
(``torch.jit._builtins._find_builtin``), and a Python function (``F.relu``) is compiled
from its source with its closure. An API wrapper is neither, so without this module a
function that calls a wrapped API fails to script while msprobe's hooks are installed
(``TypeError: module, class, method, function ... was expected, got
builtin_function_or_method`` for builtins, a ``RuntimeError`` for Python functions). That
broke user code that scripts at run time, and PyTorch itself: the first
``torch.func.jvp`` of a process scripts its decompositions.

:func:`script_as_original` makes TorchScript take the wrapper for its original: a
builtin's wrapper is registered in the builtin table under the original's operator (and
removed again when the wrapper is removed, before its ``id`` can be reused), a Python
function's wrapper gets ``__prepare_scriptable__`` (which ``torch.jit`` calls before
compiling a function) returning the original. Scripted code then runs the original
operators inside the TorchScript interpreter: like any TorchScript, it is not recorded.

The builtin table and ``__prepare_scriptable__`` are PyTorch internals (present in every
supported version, 2.1 onwards); where they are missing nothing is registered and scripting
behaves as before.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

from torch.jit import _builtins as _jit_builtins


def _innermost(fn: Any) -> Any:
    """The function behind a chain of msprobe wrappers (one per debugger)."""
    seen = 0
    while getattr(fn, "__msprobe_original__", None) is not None and seen < 64:
        fn = fn.__msprobe_original__
        seen += 1
    return fn


def prepare_builtin_table() -> None:
    """Build TorchScript's builtin table now (it is built on first use from the functions
    found on ``torch``'s modules: built while wrappers are installed, it would hold the
    wrappers instead of the builtins). Call before installing wrappers."""
    find = getattr(_jit_builtins, "_find_builtin", None)
    if find is None:
        return
    try:
        import torch
        find(torch.add)
    except Exception:  # noqa: BLE001 - an internal of PyTorch: scripting just stays as it was
        pass


def script_as_original(wrapper: Callable, original: Any) -> Optional[Callable[[], None]]:
    """Make ``torch.jit.script`` treat ``wrapper`` as ``original`` (see the module
    docstring). Returns a callable that undoes it (call it when the wrapper is removed), or
    None when there is nothing to undo. Never raises.

    Args:
        wrapper: the msprobe wrapper put in place of ``original``.
        original: the function it wraps (maybe another debugger's wrapper).
    """
    target = _innermost(original)
    find = getattr(_jit_builtins, "_find_builtin", None)
    register = getattr(_jit_builtins, "_register_builtin", None)
    try:
        op = find(target) if find is not None else None
    except Exception:  # noqa: BLE001 - see prepare_builtin_table
        op = None
    if op is not None and register is not None:
        try:
            register(wrapper, op)
        except Exception:  # noqa: BLE001
            return None
        return lambda: _unregister(wrapper, op)
    if inspect.isfunction(target) and not hasattr(wrapper, "__prepare_scriptable__"):
        try:
            wrapper.__prepare_scriptable__ = lambda: target
        except (AttributeError, TypeError):
            return None
    return None


def _unregister(wrapper: Callable, op: str) -> None:
    """Remove ``wrapper`` from TorchScript's builtin table (while it is alive, so its ``id``
    names nothing else)."""
    table = getattr(_jit_builtins, "_builtin_table", None)
    if isinstance(table, dict) and table.get(id(wrapper)) == op:
        del table[id(wrapper)]
