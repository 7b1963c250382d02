"""API interception for MindSpore: wrap the functions named in ``support_wrap_ops.yaml``.

Families (spec section 7.1): ``Tensor`` (``mindspore.Tensor`` methods), ``Functional``
(``mindspore.ops``), ``Mint`` (``mindspore.mint``), ``MintFunctional``
(``mindspore.mint.nn.functional``), ``Distributed``
(``mindspore.communication.comm_func``). Each listed name is replaced by a wrapper that,
while the session records and the thread is not already inside a recorded call, hands the
call to the recorder; otherwise it calls the original at once.

:class:`ApiHooks` keeps every (owner, name, wrapper, original) so that the Jit executor
can put the originals back while MindSpore compiles a ``@jit`` function (its parser would
otherwise try to compile our wrappers, spec section 8 defect 32 and the prototype notes)
and re-install the wrappers afterwards.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Optional

from mindspore import Tensor, mint, ops
from mindspore.mint.nn import functional as mint_functional

from msprobe.core.api_list import ApiSpec
from msprobe.core.api_list import load_api_list as read_api_list
from msprobe.core.handles import finish_wrapper, restore_attribute

DEFAULT_API_LIST = os.path.join(os.path.dirname(__file__), "support_wrap_ops.yaml")


def _comm_func() -> Any:
    from mindspore.communication import comm_func
    return comm_func


# yaml key -> (family prefix, owner resolver)
_FAMILIES: dict[str, tuple[str, Callable[[], Any]]] = {
    "ops": ("Functional", lambda: ops),
    "tensor": ("Tensor", lambda: Tensor),
    "mint.ops": ("Mint", lambda: mint),
    "mint.nn.functional": ("MintFunctional", lambda: mint_functional),
    "communication.comm_func": ("Distributed", _comm_func),
}

#: Tensor methods that change ``self`` (or write through it): ``self`` is never replaced by
#: a backward tap, or the write would land on msprobe's copy.
_INPLACE_DUNDERS = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__",
                              "__ifloordiv__", "__imod__", "__ipow__", "__imatmul__"})


def is_inplace(api: str) -> bool:
    """True for APIs that write into their first argument (``add_``, ``__iadd__``,
    ``copy_``, ``assign``, ``__setitem__``...)."""
    if api in _INPLACE_DUNDERS or api.startswith(("assign", "scatter_nd_update")):
        return True
    return api.endswith("_") and not api.endswith("__")


def load_api_list(path: Optional[str] = None) -> tuple[list[ApiSpec], list[str]]:
    """Read a MindSpore API list (``support_wrap_ops.yaml`` format; None = the packaged
    one) and resolve its names; see :func:`msprobe.core.api_list.load_api_list` (names
    missing from this MindSpore are logged at info level: the packaged list has some).

    Raises:
        ConfigError: the file cannot be read or parsed, or is not a mapping of lists.
    """
    return read_api_list(path or DEFAULT_API_LIST, _FAMILIES, framework="MindSpore", warn=False)


class ApiHooks:
    """The installed API wrappers of one recorder; a handle (``remove()`` is idempotent).

    Args:
        specs: the APIs to wrap.
        recorder: the :class:`msprobe.mindspore.recorder.Recorder` receiving the calls.
    """

    def __init__(self, specs: list[ApiSpec], recorder: Any) -> None:
        self._entries: list[tuple[Any, str, Any, Any, bool]] = []
        self._suspended = 0
        session = recorder.session
        for spec in specs:
            owner, name = spec.owner, spec.api
            own = name in vars(owner) if isinstance(owner, type) else True
            original = getattr(owner, name)
            wrapper = _make_wrapper(original, spec.family, name, recorder, session)
            try:
                setattr(owner, name, wrapper)
            except (AttributeError, TypeError):
                continue
            self._entries.append((owner, name, wrapper, original, own))

    def __len__(self) -> int:
        return len(self._entries)

    def suspend(self, owner: Any = None) -> None:
        """Put the originals back (nestable; :meth:`resume` undoes one level); ``owner``
        is accepted for symmetry with the Cell and Primitive hooks and ignored."""
        self._suspended += 1
        if self._suspended > 1:
            return
        for owner, name, wrapper, original, own in self._entries:
            if getattr(owner, name, None) is wrapper:
                if own:
                    setattr(owner, name, original)
                else:
                    delattr(owner, name)

    def resume(self) -> None:
        """Re-install the wrappers removed by the matching :meth:`suspend`."""
        if self._suspended == 0:
            return
        self._suspended -= 1
        if self._suspended:
            return
        for owner, name, wrapper, original, own in self._entries:
            current = getattr(owner, name, None)
            if current is original or (not own and current is getattr(type(owner), name, None)):
                setattr(owner, name, wrapper)

    def remove(self) -> None:
        """Restore every original (idempotent)."""
        entries, self._entries = self._entries, []
        for owner, name, wrapper, original, own in reversed(entries):
            restore_attribute(owner, name, wrapper, original if own else None)


def _make_wrapper(original: Any, family: str, api: str, recorder: Any, session: Any) -> Callable:
    key = f"{family}.{api}"
    record = recorder.record_api
    tls = session._tls
    inplace = is_inplace(api)

    def wrapper(*args, **kwargs):
        if not session.recording or getattr(tls, "busy", False) or wrapper.__msprobe_disabled__:
            return original(*args, **kwargs)
        return record(original, family, key, args, kwargs, inplace)

    return finish_wrapper(wrapper, original)
