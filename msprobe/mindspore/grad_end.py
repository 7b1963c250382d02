"""Know when a PyNative gradient computation has finished.

``mindspore.grad``, ``value_and_grad``, ``GradOperation`` and ``Model.train``'s
``TrainOneStepCell`` all end in ``mindspore.graph.api._pynative_executor.grad(...)``,
which returns once every gradient has been computed (and every backward hook has run).
:func:`install_grad_end` wraps that method on the executor instance; after it returns the
recorder emits the backward entries collected during it.
"""
from __future__ import annotations

from typing import Any, Callable

from mindspore.graph.api import _pynative_executor

from msprobe.core.handles import CallbackHandle


def install_grad_end(on_end: Callable[[], None]) -> CallbackHandle:
    """Call ``on_end()`` after each ``_pynative_executor.grad`` call (also when it raised).

    Returns a handle whose ``remove()`` restores the executor's own method. Stacks with
    other debuggers: each wraps the method found when it installed.
    """
    executor = _pynative_executor
    had_own = "grad" in vars(executor)
    previous = executor.grad

    def grad(*args: Any, **kwargs: Any) -> Any:
        try:
            return previous(*args, **kwargs)
        finally:
            if not grad.__msprobe_disabled__:
                on_end()

    grad.__msprobe_disabled__ = False
    grad.__msprobe_previous__ = (previous, had_own)
    executor.grad = grad

    def undo() -> None:
        grad.__msprobe_disabled__ = True
        if vars(executor).get("grad") is grad:
            # past the wrappers of debuggers removed before this one (disabled pass-throughs)
            target, own = previous, had_own
            while own and getattr(target, "__msprobe_disabled__", False):
                target, own = target.__msprobe_previous__
            if own:
                executor.grad = target
            else:
                del executor.grad

    return CallbackHandle(undo)
