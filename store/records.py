"""Typed records the log writer accepts: one immutable record type per row kind (:class:`Leaf`
a tuple, the others frozen, slotted dataclasses).

The recorders (``msprobe.core.recorder`` and the adapters) build these, the writer turns them into
columns of :data:`store.schema.LOG_SCHEMA`. Nothing here knows a deep-learning framework:
dtypes and types are plain strings (``"torch.float32"``, ``"Float16"``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Optional

from store.schema import LEAF_FIELDS  # the fields of a Leaf, in the order of its tuple


def _fast_init(cls: type) -> type:
    """Give the frozen, slotted dataclass ``cls`` an ``__init__`` with the same signature
    (keyword-only, same defaults) that stores each field through its slot descriptor.

    The ``__init__`` that ``dataclass`` generates for a frozen class calls
    ``object.__setattr__`` once per field; storing through the slots' descriptors makes
    a record cheaper to build (used for :class:`Call`, one per recorded
    call; :class:`Leaf` is a tuple and needs none of this). Nothing else changes:
    instances are as frozen as before.

    Raises:
        TypeError: a field has a ``default_factory`` (not supported here).
    """
    names: dict = {}
    params, body = [], []
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"_fast_init: field {cls.__name__}.{f.name} has a default_factory")
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            names[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
        names[f"_s_{f.name}"] = cls.__dict__[f.name].__set__
        body.append(f"    _s_{f.name}(self, {f.name})\n")
    exec(f"def __init__(self, *, {', '.join(params)}):\n{''.join(body)}", names)  # noqa: S102
    init = names["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    cls.__init__ = init
    return cls


_new_tuple = tuple.__new__


class Leaf(tuple):
    """One argument leaf of a call (see ``store.schema`` row kind ``leaf``): an immutable
    tuple of :data:`LEAF_FIELDS`, each also readable as an attribute (``leaf.max``).

    Built with keywords, ``Leaf(io=..., path=..., leaf_kind=..., max=...)`` (fields not
    given are None), or on the recording hot path with :func:`make_leaf` from a tuple of
    all the fields in :data:`LEAF_FIELDS` order (about 0.2 against 3 us: the recorder
    builds one per recorded tensor, and the log writer reads the columns of a batch with
    one ``zip(*leaves)``). :meth:`replace` returns a copy with some fields changed.
    Equality and hashing are those of the tuple of fields.

    Args:
        io: top-level key of the dump.json entry (``input_args``, ``input_kwargs``,
            ``output``, ``parameters``, ``input``; a parameter name in a
            ``parameters_grad`` entry; ``""`` for a debug save).
        path: components below ``io``: ``int`` list index, ``str`` dict key; ``()`` when
            the leaf is the whole value.
        leaf_kind: one of ``store.schema.LEAF_KINDS``.
        type: record ``type`` (``"torch.Tensor"``, ``"int"``...); None for null leaves.
        dtype, shape, numel: tensor metadata (shape a tuple of ints, ``()`` for 0-dim).
        max, min, mean, norm: statistics as float64 (bool tensors: 1.0/0.0); None = null.
        max_finite, min_finite: ``Max_except_inf_nan``/``Min_except_inf_nan``; None when
            not applicable.
        crc32: 8 lowercase hex digits (dump.json ``md5``) or None.
        requires_grad: None where the framework has no such flag.
        has_nan, has_inf: whether the tensor holds NaN / ±Inf.
        data_name: tensor file name for task ``tensor``; None otherwise.
        payload: payload reference (``shard:key``) for task ``tensor``; None otherwise.
        value_json: for ``leaf_kind == "value"``: the complete JSON record text.
    """

    __slots__ = ()

    def replace(self, **changes: Any) -> "Leaf":
        """A copy with the fields named in ``changes`` set to their values.

        Raises:
            TypeError: a name in ``changes`` is not a field of :data:`LEAF_FIELDS`.
        """
        values = list(self)
        for name, value in changes.items():
            index = _LEAF_INDEX.get(name)
            if index is None:
                raise TypeError(f"Leaf.replace: no field {name!r}; fields: {', '.join(LEAF_FIELDS)}")
            values[index] = value
        return _new_tuple(Leaf, values)

    def __repr__(self) -> str:
        return "Leaf(" + ", ".join(f"{name}={value!r}" for name, value in zip(LEAF_FIELDS, self)) + ")"

    def __reduce__(self) -> tuple:
        return make_leaf, (tuple(self),)


def _leaf_new() -> Any:
    """``Leaf.__new__``: keyword-only arguments ``io``, ``path``, ``leaf_kind`` (required)
    and the other :data:`LEAF_FIELDS` (default None), stored in that order. Generated from
    the table, so that the tuple order is spelled once; as fast as a written-out one."""
    params = ", ".join(name if i < 3 else f"{name}=None" for i, name in enumerate(LEAF_FIELDS))
    names = {"_new_tuple": _new_tuple}
    exec(f"def __new__(cls, *, {params}):\n    return _new_tuple(cls, ({', '.join(LEAF_FIELDS)},))\n",  # noqa: S102
         names)
    new = names["__new__"]
    new.__qualname__ = "Leaf.__new__"
    new.__module__ = __name__
    return new


Leaf.__new__ = _leaf_new()
_LEAF_INDEX = {name: i for i, name in enumerate(LEAF_FIELDS)}
for _i, _name in enumerate(LEAF_FIELDS):
    setattr(Leaf, _name, property(itemgetter(_i), doc=f"Field {_i} of the leaf tuple ({_name})."))
del _i, _name


def make_leaf(values: tuple) -> Leaf:
    """The :class:`Leaf` holding ``values``: all the fields, in :data:`LEAF_FIELDS` order
    (the recording hot path's constructor: no keyword parsing).

    Raises:
        ValueError: ``values`` does not hold exactly ``len(LEAF_FIELDS)`` items.
    """
    if len(values) != _NFIELDS:
        raise ValueError(f"make_leaf: need {_NFIELDS} values in LEAF_FIELDS order, got {len(values)}")
    return _new_tuple(Leaf, values)


_NFIELDS = len(LEAF_FIELDS)
#: the fields after ``leaf_kind`` of a null leaf (all None): ``make_leaf((io, path,
#: "none") + NULL_TAIL)`` is :func:`null_leaf` without the call
NULL_TAIL = (None,) * (_NFIELDS - 3)


def null_leaf(io: str, path: tuple) -> Leaf:
    """The leaf of a ``None`` value or a missing gradient under ``io`` at ``path``
    (``leaf_kind`` ``none``, every other field None)."""
    return _new_tuple(Leaf, (io, path, "none") + NULL_TAIL)


@_fast_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """One dump.json entry (row kind ``call``) with its leaves.

    Args:
        step: step number the entry belongs to.
        kind: one of ``store.schema.CALL_KINDS``.
        name: dump.json key, e.g. ``Functional.linear.0.forward``.
        api_type: family prefix (``Functional``, ``Tensor``, ``Module``, ``Cell``...).
        parent: construct.json parent, or None.
        stack_id: id of an interned stack (see :class:`Stack`), or None.
        is_recompute: PyTorch forward entries only; None elsewhere.
        keys: top-level keys of the entry, in dump.json order.
        leaves: the argument leaves.
    """

    step: int
    kind: str
    name: str
    api_type: str
    parent: Optional[str] = None
    stack_id: Optional[int] = None
    is_recompute: Optional[bool] = None
    keys: tuple[str, ...] = ()
    leaves: tuple[Leaf, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Stack:
    """An interned call stack: ``frames`` innermost first, each one upstream-style string
    ``"File {path}, line {n}, in {func}, \\n {source}"``; ``stack_id`` a stable int64."""

    stack_id: int
    frames: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Marker:
    """A session marker (``start``, ``stop``, ``step_end``) with its metadata: a dict of
    JSON-serialisable values holding at least ``task``, ``level``, ``framework``,
    ``dump_data_dir`` and ``rank_dir``."""

    step: int
    kind: str
    meta: dict
