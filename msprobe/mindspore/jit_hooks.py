"""Jit functions and Cells (family ``Jit``): ``Jit.{name}.{n}.forward``/``.backward``.

``@mindspore.jit`` (capture mode ``ast``) builds a ``_JitExecutor`` on every call, looked
up as a global of ``mindspore.graph.api`` (patching ``mindspore.common.api``, as upstream
does, has no effect on MindSpore >= 2.9: spec section 8 defect 32). We replace that global
by a subclass whose ``__call__`` records the call through the recorder, with the API
wrappers suspended while MindSpore compiles and runs the graph (its parser cannot compile
our wrappers, and calls inside a graph are not Python calls anyway). ``name`` is the
function's name, or the Cell's class name for a ``@jit`` ``construct``; counters start at
0 and a backward entry exists only when a gradient flowed through the call (fix 32).
"""
from __future__ import annotations

from functools import partial
from typing import Any

import mindspore.graph.api as graph_api
from mindspore import nn

from msprobe.core.handles import CallbackHandle


def install_jit_hook(recorder: Any, guard: Any) -> CallbackHandle:
    """Swap ``mindspore.graph.api._JitExecutor`` for a recording subclass.

    Args:
        recorder: receives the Jit calls.
        guard: an object with ``suspend(owner)`` and ``resume()``: takes msprobe's API
            wrappers, Cell hooks and Primitive wrappers inside ``owner`` (a Cell, or None
            for a plain function) out while MindSpore compiles and runs the graph.
    Returns:
        A handle whose ``remove()`` puts the previous executor class back.
    """
    base = graph_api._JitExecutor
    session = recorder.session
    tls = session._tls

    def run(executor: Any, *args: Any, **kwargs: Any) -> Any:
        # a function, not a method: with another debugger's subclass on top, ``self._run``
        # would find that subclass's and the two would call each other without end
        owner = getattr(executor, "obj", None)
        guard.suspend(owner if isinstance(owner, nn.Cell) else None)
        try:
            return base.__call__(executor, *args, **kwargs)
        finally:
            guard.resume()

    class RecordingJitExecutor(base):  # type: ignore[misc, valid-type]
        __msprobe_disabled__ = False
        __msprobe_base__ = base

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            if (RecordingJitExecutor.__msprobe_disabled__ or not session.recording
                    or getattr(tls, "busy", False)):
                return run(self, *args, **kwargs)
            owner = getattr(self, "obj", None)
            if isinstance(owner, nn.Cell):
                name = type(owner).__name__
                record_args = args[1:] if args and args[0] is owner else args
            else:
                fn = getattr(self, "fn", None)
                name = getattr(fn, "__name__", "jit_function")
                record_args = args
            return recorder.record_api(partial(run, self), "Jit", f"Jit.{name}", args, kwargs, False,
                                       tuple(record_args))

    graph_api._JitExecutor = RecordingJitExecutor

    def undo() -> None:
        RecordingJitExecutor.__msprobe_disabled__ = True
        if graph_api._JitExecutor is RecordingJitExecutor:
            # past the classes of debuggers removed before this one (disabled pass-throughs)
            previous = base
            while vars(previous).get("__msprobe_disabled__", False):
                previous = previous.__msprobe_base__
            graph_api._JitExecutor = previous

    return CallbackHandle(undo)
