"""Removable hook handles, collected so that a session removes everything it installed."""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Protocol


class Handle(Protocol):
    """Anything with an idempotent ``remove()`` (``torch.utils.hooks.RemovableHandle``,
    :class:`CallbackHandle`)."""

    def remove(self) -> None: ...


class CallbackHandle:
    """A handle whose ``remove()`` calls ``undo`` exactly once.

    Args:
        undo: a callable without arguments that reverses an installation
            (restores a patched attribute, unregisters a hook).
    """

    __slots__ = ("_undo",)

    def __init__(self, undo: Callable[[], None]) -> None:
        self._undo: Callable[[], None] | None = undo

    def remove(self) -> None:
        undo, self._undo = self._undo, None
        if undo is not None:
            undo()

    def __enter__(self) -> "CallbackHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


class HandleGroup:
    """Holds handles and removes them all, in reverse order of installation, once.

    ``remove()`` is idempotent; the group can be reused after it (new handles can be
    added). It is a context manager whose exit removes everything.
    """

    __slots__ = ("_handles",)

    def __init__(self) -> None:
        self._handles: list[Handle] = []

    def add(self, handle: Handle) -> Handle:
        """Keep ``handle`` for a later :meth:`remove`; returns it unchanged."""
        self._handles.append(handle)
        return handle

    def __len__(self) -> int:
        return len(self._handles)

    def remove(self) -> None:
        """Remove every handle (last installed first); errors of one do not stop the rest."""
        handles, self._handles = self._handles, []
        first_error: BaseException | None = None
        for handle in reversed(handles):
            try:
                handle.remove()
            except Exception as exc:  # keep removing the others
                first_error = first_error or exc
        if first_error is not None:
            raise first_error

    def __enter__(self) -> "HandleGroup":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def finish_wrapper(wrapper: Callable, original: Any, session: Any = None) -> Callable:
    """Give an API wrapper its original's name and docstring (where the original has them)
    and the attributes every msprobe wrapper carries: ``__msprobe_original__`` (the
    function wrapped, for restoring and for chains of debuggers), ``__msprobe_disabled__``
    (False; True makes the wrapper a pass-through) and ``__msprobe_session__`` (the session
    it records for, or None for a wrapper that never records). Returns ``wrapper``."""
    with contextlib.suppress(AttributeError, TypeError):
        functools.update_wrapper(wrapper, original)
    wrapper.__msprobe_original__ = original
    wrapper.__msprobe_disabled__ = False
    wrapper.__msprobe_session__ = session
    return wrapper


def restore_attribute(owner: Any, name: str, wrapper: Any, original: Any) -> None:
    """Undo one wrapping (``wrapper`` made by :func:`finish_wrapper`). If another debugger
    wrapped on top of ours meanwhile, our wrapper stays in that chain but becomes a
    pass-through; wrappers already disabled are skipped when restoring, so chains never grow.

    ``original`` None means the name was inherited (``torch.Tensor`` from ``TensorBase``)
    and is deleted from ``owner`` instead of set (nothing happens where it is gone already).
    """
    wrapper.__msprobe_disabled__ = True
    if getattr(owner, name, None) is not wrapper:
        return
    while original is not None and getattr(original, "__msprobe_disabled__", False):
        original = original.__msprobe_original__
    if original is None:
        with contextlib.suppress(AttributeError):
            delattr(owner, name)
    else:
        setattr(owner, name, original)


def records_inside(fn: Any) -> bool:
    """True if ``fn`` is another debugger's API wrapper, or a chain of them, in which a wrapper
    is enabled and its session is recording now: that debugger records the call too. A chain
    of wrappers that only pass the call through (stopped or closed debuggers) gives False, so
    the calls made inside the recorded call stay unrecorded (only the outermost API call is
    recorded, spec section 2.1)."""
    while True:
        inner = getattr(fn, "__msprobe_original__", None)
        if inner is None:
            return False
        session = getattr(fn, "__msprobe_session__", None)
        if session is not None and session.recording and not fn.__msprobe_disabled__:
            return True
        fn = inner
