"""Functions held by reference: rebinding the references to wrapped originals.

The API wrappers replace ``torch.nn.functional.gelu`` and the other listed names in their
owners (:mod:`msprobe.pytorch.api_hooks`). Code that took the function before that keeps
the original: ``from torch.nn.functional import gelu`` (a module global), Hugging Face's
``ACT2FN["gelu"]`` (``GELUActivation.act = nn.functional.gelu``, an attribute of a module
instance) or ``functools.partial(nn.functional.gelu, approximate="tanh")``. Its calls
would not be recorded.

:class:`References` rebinds, while the wrappers are installed, every such reference it
can reach to the wrapper, so the call is recorded under the wrapper's documented name
(``Functional.gelu.{n}.forward``):

* module globals of every imported module outside ``torch`` (and msprobe itself), scanned
  at the first ``start()`` and, for modules imported since, at each later one;
* attributes of the model's modules (``vars(module)``), at each ``start(model)``, and of
  their classes, once per class; a ``functools.partial`` of an original is replaced by
  the same partial of the wrapper, and a ``staticmethod`` of one by a ``staticmethod`` of
  the wrapper.

Nothing is done per call. A later ``start()`` is cheap when nothing changed: the module
scan is skipped while ``sys.modules`` has as many entries as at the last scan and the same
module object under the same last name (an import adds at the end; a module replaced under
a name that is not the last is found at the next start() after an import), and a model
module's ``vars()`` is searched only where one of its values is an original or a
``functools.partial`` (both tested by identity, in C, over the values). Comparing every
entry of ``sys.modules`` instead cost ~0.4 ms per ``start()`` inside a training loop (2,000
modules: a cache miss per module object).

Each rebinding is undone when the wrappers are removed (the original is put back where
the slot still holds the wrapper; a wrapper another debugger put there stays). References
this cannot reach (closures, default arguments, local variables, lists and dicts) keep
calling the original and are not recorded.
"""
from __future__ import annotations

import functools
import itertools
import operator
import sys
import types
from typing import Any, Iterable, Optional

import torch

from msprobe.core.handles import CallbackHandle, HandleGroup

#: packages not scanned: torch's own references (its internals call the originals; the
#: listed names in their owners are wrapped already) and msprobe's
_SKIPPED = ("torch", "msprobe", "store", "functorch", "torchgen")
_SKIPPED_PREFIXES = tuple(p + "." for p in _SKIPPED)


def _skipped(name: str) -> bool:
    return name in _SKIPPED or name.startswith(_SKIPPED_PREFIXES)


def _unwrapped(fn: Any) -> Any:
    """The function under a chain of msprobe wrappers that are switched off."""
    while getattr(fn, "__msprobe_disabled__", False) and getattr(fn, "__msprobe_original__", None) is not None:
        fn = fn.__msprobe_original__
    return fn


class References:
    """Rebinds references to wrapped originals (module docstring).

    Args:
        targets: ``id(original) -> (original, wrapper)`` of every wrapped API (the
            originals as found in their owners when wrapped; a chain of another
            debugger's wrappers counts as an original too).
        group: the handles restoring each rebinding are added here.
    """

    def __init__(self, targets: dict[int, tuple[Any, Any]], group: HandleGroup) -> None:
        self._targets = targets
        self._group = group
        # module name -> the module object scanned (held: a module loaded again under its
        # name is a new object even where it takes the freed one's address)
        self._scanned: dict[str, Any] = {}
        # sys.modules at the last scan: its size and its last entry
        self._size = -1
        self._last: tuple = ()
        self._classes: set[int] = set()  # ids of the classes scanned (kept alive by _kept)
        self._kept: list[type] = []
        self._types: dict[int, type] = {}  # id -> module class whose whole MRO was scanned or skipped

    def scan(self, models: Iterable[torch.nn.Module] = ()) -> int:
        """Rebind the references in modules imported since the last scan and in the
        attributes of ``models``' modules and their classes; returns how many were rebound."""
        if not self._targets:
            return 0
        count = self._scan_modules()
        classes: dict[int, type] = {}
        for model in models:
            for m in model.modules():
                d = getattr(m, "__dict__", None)
                if isinstance(d, dict) and self._may_hold(d):
                    count += self._rebind_dict(d, m)
                tp = type(m)
                if id(tp) in self._types:
                    continue
                self._types[id(tp)] = tp
                for cls in tp.__mro__:
                    if id(cls) not in self._classes and not _skipped(cls.__module__ or ""):
                        classes.setdefault(id(cls), cls)
        for cls in classes.values():  # each class once
            self._classes.add(id(cls))
            self._kept.append(cls)
            count += self._rebind_class(cls)
        return count

    def _scan_modules(self) -> int:
        """Rebind the module globals of the modules imported (or replaced in
        ``sys.modules``) since the last scan; returns how many were rebound."""
        modules = sys.modules
        if len(modules) == self._size and self._last:
            name, mod = self._last
            if modules.get(name, self) is mod and next(reversed(modules)) == name:
                return 0  # nothing imported since (see the module docstring)
        items = list(modules.items())
        self._size = len(items)
        self._last = items[-1] if items else ()
        count = 0
        for name, mod in items:
            if mod is None or self._scanned.get(name) is mod:
                continue
            self._scanned[name] = mod
            if _skipped(name) or not isinstance(mod, types.ModuleType):
                continue
            d = getattr(mod, "__dict__", None)
            if isinstance(d, dict):
                count += self._rebind_dict(d, mod)
        return count

    def _may_hold(self, d: dict) -> bool:
        """Whether a value of ``d`` may be rebound: an original, or a ``functools.partial``
        (of an original or not)."""
        values = d.values()
        return (not self._targets.keys().isdisjoint(map(id, values))
                or any(map(operator.is_, map(type, values), itertools.repeat(functools.partial))))

    def _replacement(self, value: Any) -> Optional[Any]:
        """The wrapper (or a partial of it) to put in place of ``value``, or None."""
        hit = self._targets.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
        if type(value) is functools.partial:
            hit = self._targets.get(id(value.func))
            if hit is not None and hit[0] is value.func:
                return functools.partial(hit[1], *value.args, **value.keywords)
        return None

    def _rebind_dict(self, d: dict, owner: Any) -> int:
        count = 0
        for key, value in list(d.items()):
            if not isinstance(key, str) or key.startswith("__"):
                continue
            new = self._replacement(value)
            if new is None:
                continue
            d[key] = new
            self._group.add(CallbackHandle(functools.partial(_restore_item, d, key, new, value)))
            count += 1
        return count

    def _rebind_class(self, cls: type) -> int:
        count = 0
        for key, value in list(vars(cls).items()):
            if key.startswith("__"):
                continue
            if isinstance(value, staticmethod):
                inner = self._replacement(value.__func__)
                new = None if inner is None else staticmethod(inner)
            else:
                new = self._replacement(value)
            if new is None:
                continue
            if not isinstance(value, (types.FunctionType, staticmethod)):
                # a builtin or partial does not bind to the instance; the wrapper would
                new = staticmethod(new)
            try:
                setattr(cls, key, new)
            except (AttributeError, TypeError):
                continue
            self._group.add(CallbackHandle(functools.partial(_restore_class, cls, key, new, value)))
            count += 1
        return count


def _restore_item(d: dict, key: str, new: Any, old: Any) -> None:
    if d.get(key) is new:
        d[key] = _original_of(old)


def _restore_class(cls: type, key: str, new: Any, old: Any) -> None:
    if vars(cls).get(key) is new:
        setattr(cls, key, _original_of(old))


def _original_of(old: Any) -> Any:
    """``old`` with the switched-off msprobe wrappers under it removed (for a partial, a
    new partial of the function under them)."""
    if type(old) is functools.partial:
        func = _unwrapped(old.func)
        return old if func is old.func else functools.partial(func, *old.args, **old.keywords)
    return _unwrapped(old)
