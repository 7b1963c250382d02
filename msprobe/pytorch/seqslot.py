"""Keep ``torch.Tensor`` from turning into a sequence when ``__getitem__`` is wrapped.

Assigning a Python function to ``torch.Tensor.__getitem__`` makes CPython fill the type's
``sq_item`` slot besides ``mp_subscript``, and deleting the attribute again does not clear
it. From then on ``PySequence_Check(tensor)`` is true, and PyTorch's C++ code that reads
nested sequences treats every tensor as one: ``torch.tensor([torch.tensor(False),
torch.tensor(True)])`` calls ``len()`` of a 0-d tensor and raises ``TypeError``. Indexing
from Python goes through ``mp_subscript`` only, so :func:`saved_sq_item` /
:func:`restore_sq_item` put back the ``sq_item`` values a type and its subclasses had
before, after the attribute is set and after it is restored.

The slot is reached through the documented C layout of ``PyTypeObject`` (``tp_as_sequence``
is its 14th pointer-sized field in release builds) and ``PySequenceMethods`` (``sq_item``
is the 4th); the layout is checked against ``tp_name`` first, and where it does not match
nothing is touched.
"""
from __future__ import annotations

import ctypes
from typing import Any

_PTR = ctypes.sizeof(ctypes.c_void_p)
_TP_NAME = 3          # PyObject_VAR_HEAD is 3 fields
_TP_AS_SEQUENCE = 13  # ob_refcnt, ob_type, ob_size, tp_name, tp_basicsize, tp_itemsize, tp_dealloc,
                      # tp_vectorcall_offset, tp_getattr, tp_setattr, tp_as_async, tp_repr, tp_as_number
_SQ_ITEM = 3          # sq_length, sq_concat, sq_repeat


def _field(address: int, index: int) -> ctypes.c_void_p:
    return ctypes.c_void_p.from_address(address + index * _PTR)


def _sq_item_cell(cls: type) -> "ctypes.c_void_p | None":
    """The ``sq_item`` slot of ``cls`` as a writable ctypes cell, or None where the layout
    is not the expected one or ``cls`` has no sequence methods."""
    address = id(cls)
    name = _field(address, _TP_NAME).value
    if not name or ctypes.string_at(name).decode("utf-8", "replace").rsplit(".", 1)[-1] != cls.__name__:
        return None
    methods = _field(address, _TP_AS_SEQUENCE).value
    if not methods:
        return None
    return _field(methods, _SQ_ITEM)


def _family(cls: type) -> list[type]:
    out, todo = [], [cls]
    while todo:
        c = todo.pop()
        if c not in out:
            out.append(c)
            todo.extend(c.__subclasses__())
    return out


def saved_sq_item(cls: Any) -> list[tuple[type, int]]:
    """``(type, sq_item value)`` of ``cls`` and its subclasses (empty where ``cls`` is not a
    type or the layout check fails)."""
    if not isinstance(cls, type):
        return []
    out = []
    for c in _family(cls):
        cell = _sq_item_cell(c)
        if cell is not None:
            out.append((c, cell.value or 0))
    return out


def restore_sq_item(saved: list[tuple[type, int]]) -> None:
    """Write the ``sq_item`` values of :func:`saved_sq_item` back."""
    for c, value in saved:
        cell = _sq_item_cell(c)
        if cell is not None:
            cell.value = value or None
