"""The ``Aten`` family (spec sections 2.1, 7.1): ``torch.ops.aten`` operators called from Python.

A packet call ``torch.ops.aten.mm(a, b)`` is recorded as ``Aten.mm.{n}.forward``; an overload
call ``torch.ops.aten.add.Tensor(a, b)`` as ``Aten.add.Tensor.{n}.forward``. Operators that
PyTorch dispatches internally (``torch.add`` reaching ``aten::add.Tensor`` in C++) never pass
through ``torch.ops.aten`` in Python and are not recorded.

Why proxies and not plain wrapper functions (spec section 8 item 26, section 9 fixes 26-29):
modules that PyTorch imports lazily (``torch._dynamo`` and the ``torch.distributed.tensor``
op strategies it pulls in, first imported by e.g. ``optimizer.step()`` or
``torch.utils.checkpoint``) read ``torch.ops.aten.X`` while our hooks are installed, use
``aten.mm.default`` attributes, ``isinstance(op, OpOverload)`` checks and dictionaries keyed
by operators. A plain function in place of the packet fails there
(``AttributeError: 'function' object has no attribute 'default'`` here; upstream's template
object gave ``KeyError: AtenOPTemplate()``). :class:`AtenPacketProxy` and
:class:`AtenOverloadProxy` therefore forward every attribute to the real operator, report the
real class through ``__class__`` (so ``isinstance`` holds) and hash and compare equal to it
(so dictionary lookups with either object find the same entry). ``type(proxy) is
OpOverload`` is still False; code testing exact types sees a proxy only while hooks are
installed and only for the listed operators. Proxies that torch stored in its own tables
while hooks were installed stay there after ``close()`` but pass every call straight through.

Why the family ships EMPTY (opt-in) in ``support_wrap_ops.yaml`` (observed crash; the cause
below is our reading of PyTorch, not proven: a lone ``TorchDispatchMode`` around
``x * 2`` with ``aten: [mul]`` did not crash): PyTorch's C++ dispatcher,
the first time it hands an operator to Python (any ``TorchDispatchMode``: FakeTensor,
FSDP2, ``torch.compile``, tests counting syncs; tensor subclasses), looks the Python
object up as ``torch.ops.aten.{name}.{overload}`` and CACHES it per operator for the life of
the process. If a proxy is installed at that moment, the cached object is our proxy, not an
``OpOverload``, and the process dies: with torch 2.13 ``Fatal Python error: Segmentation
fault`` in ``torch/_library/simple_registry.py`` ``find_torch_dispatch_rule`` (seen with
``tests/pytorch/test_sync_free.py`` while the whole aten list was installed). The cache
outlives ``close()``. So list aten operators only for runs where no dispatch mode or tensor
subclass touches those operators while recording.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from msprobe.pytorch.compiled import is_compiling

FAMILY = "Aten"


def aten_namespace() -> Any:
    """``torch.ops.aten`` (the owner whose packet attributes are replaced)."""
    return torch.ops.aten


class _Proxy:
    """Shared behaviour: transparent attribute access, class, hash and equality."""

    def __init__(self, original: Any, key: str, record: Callable, session: Any, gate: "_Proxy | None" = None):
        d = object.__getattribute__(self, "__dict__")
        d["__msprobe_original__"] = original
        d["_key"] = key
        d["_record"] = record
        d["_session"] = session
        d["_gate"] = gate  # the packet proxy whose disabled flag also governs this overload
        d["__msprobe_disabled__"] = False

    @property
    def __class__(self):  # noqa: D401 - isinstance(proxy, OpOverload) holds
        return type(self.__msprobe_original__)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["__msprobe_original__"], name)

    def __hash__(self) -> int:
        return hash(self.__msprobe_original__)

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, _Proxy):
            other = other.__dict__["__msprobe_original__"]
        return self.__msprobe_original__ == other

    def __ne__(self, other: Any) -> bool:
        return not self.__eq__(other)

    def __repr__(self) -> str:
        return repr(self.__msprobe_original__)

    def __str__(self) -> str:
        return str(self.__msprobe_original__)

    def _disabled(self) -> bool:
        d = self.__dict__
        return d["__msprobe_disabled__"] or (d["_gate"] is not None and d["_gate"].__dict__["__msprobe_disabled__"])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        d = self.__dict__
        original, session = d["__msprobe_original__"], d["_session"]
        if is_compiling() or not session.recording or getattr(session._tls, "busy", False) or self._disabled():
            return original(*args, **kwargs)
        return d["_record"](original, FAMILY, d["_key"], args, kwargs)


class AtenOverloadProxy(_Proxy):
    """Stands for one ``OpOverload`` (``torch.ops.aten.add.Tensor``); calls are recorded as
    ``Aten.{op}.{overload}``."""


class AtenPacketProxy(_Proxy):
    """Stands for one ``OpOverloadPacket`` (``torch.ops.aten.add``); calls are recorded as
    ``Aten.{op}``, and its overload attributes are :class:`AtenOverloadProxy` objects."""

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        value = getattr(d["__msprobe_original__"], name)
        if isinstance(value, torch._ops.OpOverload) and not name.startswith("_"):
            cache = d.setdefault("_overloads", {})
            proxy = cache.get(name)
            if proxy is None:
                proxy = AtenOverloadProxy(value, f"{d['_key']}.{name}", d["_record"], d["_session"], gate=self)
                cache[name] = proxy
            return proxy
        return value


def make_aten_proxy(original: Any, api: str, record: Callable, session: Any) -> AtenPacketProxy:
    """A proxy for the packet ``torch.ops.aten.{api}`` recording through ``record``
    (:meth:`Recorder.record_api`) while ``session`` records.

    Raises:
        TypeError: ``original`` is not an ``OpOverloadPacket``.
    """
    if not isinstance(original, torch._ops.OpOverloadPacket):
        raise TypeError(f"torch.ops.aten.{api} is not an operator packet: {type(original).__name__}")
    return AtenPacketProxy(original, f"{FAMILY}.{api}", record, session)
