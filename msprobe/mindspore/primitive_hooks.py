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



class PrimitiveHooks:
    """The swapped Primitive instances of one recorder; a handle (``remove()`` idempotent).

    ``suspend(owner)``/``resume()`` give the Primitives inside ``owner`` (all when None)
    their own class back while MindSpore compiles and runs a ``@jit`` graph.
    """

    def __init__(self, models: Sequence[nn.Cell], recorder: Any) -> None:
        session = recorder.session
        self._swaps: dict[int, tuple[Any, type, type]] = {}
        self._owner_of: dict[int, list[int]] = {}
        self._suspended: list[list[int]] = []
        for model in models:
            for _name, cell in model.cells_and_names():
                prims = getattr(cell, "_primitives", None) or {}
                for attr, prim in list(prims.items()):
                    if prim is None or id(prim) in self._swaps:
                        continue
                    cls = prim.__class__
                    sub = _subclass(cls, attr, recorder, session)
                    prim.__class__ = sub
                    self._swaps[id(prim)] = (prim, cls, sub)
                    self._owner_of.setdefault(id(cell), []).append(id(prim))

    def __len__(self) -> int:
        return len(self._swaps)

    def suspend(self, owner: Any = None) -> None:
        """Give the Primitives inside ``owner`` (None = all) their own class back."""
        if owner is None:
            keys = list(self._swaps)
        else:
            keys = [k for _n, c in owner.cells_and_names() for k in self._owner_of.get(id(c), ())]
        done = []
        for key in keys:
            prim, cls, sub = self._swaps[key]
            if prim.__class__ is sub:
                prim.__class__ = cls
                done.append(key)
        self._suspended.append(done)

    def resume(self) -> None:
        """Undo the matching :meth:`suspend`."""
        if self._suspended:
            for key in self._suspended.pop():
                if key in self._swaps:
                    prim, cls, sub = self._swaps[key]
                    if prim.__class__ is cls:
                        prim.__class__ = sub

    def remove(self) -> None:
        """Put every original class back (idempotent)."""
        for prim, cls, sub in self._swaps.values():
            if prim.__class__ is sub:
                prim.__class__ = cls
        self._swaps.clear()
        self._owner_of.clear()
        self._suspended.clear()


def install_primitive_hooks(models: Sequence[nn.Cell], recorder: Any) -> PrimitiveHooks:
    """Wrap every Primitive held by any Cell of ``models``; returns the handle."""
    return PrimitiveHooks(models, recorder)


def _subclass(cls: type, attr: str, recorder: Any, session: Any) -> type:
    original_call = cls.__call__
    key = f"Primitive.{attr}.{cls.__name__}"
    tls = session._tls

    def __call__(self, *args, **kwargs):
        if not session.recording or getattr(tls, "busy", False):
            return original_call(self, *args, **kwargs)
        side_effect = bool(getattr(self, "attrs", {}).get("side_effect_mem", False))
        return recorder.record_api(lambda *a, **k: original_call(self, *a, **k), "Primitive", key,
                                   args, kwargs, side_effect)

    return type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__,
                                       "__msprobe_original_class__": cls})
