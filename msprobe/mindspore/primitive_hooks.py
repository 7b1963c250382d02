"""Primitive instances held by Cells (family ``Primitive``, level L1/mix with a model).

Most Primitive classes define their own ``__call__``, so patching ``Primitive.__call__``
catches nothing. Instead each instance found in ``cell._primitives`` gets a private
subclass of its class whose ``__call__`` records the call as
``Primitive.{attr}.{Class}.{n}.forward`` (``attr``: the attribute name on the Cell, spec
2.1), and the original class is put back on removal. Values and gradients are unchanged:
the subclass calls the original ``__call__``.
"""
from __future__ import annotations

from typing import Any, Sequence

from mindspore import nn

from msprobe.core.handles import CallbackHandle, HandleGroup


def install_primitive_hooks(models: Sequence[nn.Cell], recorder: Any) -> HandleGroup:
    """Wrap every Primitive held by any Cell of ``models``; returns restoring handles."""
    group = HandleGroup()
    session = recorder.session
    done: set[int] = set()
    for model in models:
        for _name, cell in model.cells_and_names():
            prims = getattr(cell, "_primitives", None) or {}
            for attr, prim in list(prims.items()):
                if prim is None or id(prim) in done:
                    continue
                done.add(id(prim))
                group.add(_swap_class(prim, attr, recorder, session))
    return group


def _swap_class(prim: Any, attr: str, recorder: Any, session: Any) -> CallbackHandle:
    cls = prim.__class__
    original_call = cls.__call__
    key = f"Primitive.{attr}.{cls.__name__}"
    tls = session._tls
    side_effect = bool(getattr(prim, "attrs", {}).get("side_effect_mem", False))

    def __call__(self, *args, **kwargs):
        if not session.recording or getattr(tls, "busy", False):
            return original_call(self, *args, **kwargs)
        return recorder.record_api(lambda *a, **k: original_call(self, *a, **k), "Primitive", key,
                                   args, kwargs, side_effect)

    sub = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__,
                                       "__msprobe_original_class__": cls})
    prim.__class__ = sub

    def undo() -> None:
        if prim.__class__ is sub:
            prim.__class__ = cls

    return CallbackHandle(undo)
