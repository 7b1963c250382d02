"""Which intercepted API calls may write memory of their tensor arguments.

The statistics memo (:mod:`msprobe.pytorch.stats_memo`) keeps the statistics of recently
recorded tensors across API calls. Every in-place PyTorch operation bumps the version
counter of the tensor it writes, and the memo checks that counter; what the counter misses
is a write through an *alias with its own counter* (``x.data.mul_(3)`` writes ``x``'s
memory but bumps only ``x.data``'s counter). Such a write is an in-place call on the alias,
so a call is treated as a possible writer when:

* its name is PyTorch's in-place spelling: a trailing underscore (``Tensor.add_``,
  ``Torch.relu_``, ``Torch._foreach_mul_``), an augmented-assignment or item-assignment
  method (``Tensor.__iadd__``, ``Tensor.__setitem__``);
* it is given an ``out`` tensor, by keyword or positionally (``torch.norm(x, 2, 0, False,
  o)``, ``F.normalize(x, 2.0, 0, 1e-12, o)``), or its ``inplace`` parameter is true
  (``F.relu(x, inplace=True)``, ``F.dropout(x, 0.1, True, True)``);
* it is a batch or instance normalization (``F.batch_norm``, ``Torch.batch_norm``,
  ``Torch.native_batch_norm``, ``F.instance_norm``...): in training it updates
  ``running_mean``/``running_var`` in place *without* bumping their versions;
* it is an ``Aten`` operator (``torch.ops.aten``; overload names do not follow the
  spelling reliably) — every entry is then forgotten.

In-place APIs outside the API list (``torch._foreach_add_``, ``torch._fused_adam_``,
``Tensor.apply_``...) are not recorded but still forget what they may write
(:func:`msprobe.pytorch.api_hooks.install_api_hooks`); fused optimizers bump no version.

Other calls (``F.linear``, ``Tensor.view``, ``Torch.matmul``...) only read their arguments.
"""
from __future__ import annotations

import inspect
from typing import Any, Optional

#: :func:`write_rule` results
READS = 0          # the call only reads its arguments
WRITES_ARGS = 1    # it may write memory of its tensor arguments (forget those)
WRITES_ANY = 2     # it may write anything (forget everything)


class WriteRule:
    """How one API may write its arguments (see the module docstring).

    Args:
        family: the API family (``Tensor``, ``Torch``, ``Functional``, ``Aten``...).
        name: the API name within the family (``add_``, ``linear``...).
        original: the wrapped callable (its ``inplace`` parameter is looked up).
    """

    __slots__ = ("always", "inplace_pos", "out_pos")

    def __init__(self, family: str, name: str, original: Any) -> None:
        self.always: Optional[int] = None
        self.inplace_pos: Optional[int] = None
        self.out_pos: Optional[int] = None
        if family == "Aten":
            self.always = WRITES_ANY
        elif _inplace_name(name):
            self.always = WRITES_ARGS
        else:
            self.inplace_pos = _position(original, "inplace")
            self.out_pos = _position(original, "out")

    def check(self, args: tuple, kwargs: dict) -> int:
        """READS, WRITES_ARGS or WRITES_ANY for one call with ``args``/``kwargs``."""
        if self.always is not None:
            return self.always
        if kwargs and (kwargs.get("out") is not None or _true(kwargs.get("inplace"))):
            return WRITES_ARGS
        pos = self.inplace_pos
        if pos is not None and len(args) > pos and _true(args[pos]):
            return WRITES_ARGS
        pos = self.out_pos
        if pos is not None and len(args) > pos and args[pos] is not None:
            return WRITES_ARGS
        return READS


def _true(flag: Any) -> bool:
    """An ``inplace`` value that asks for in-place (anything but None/False/0 counts)."""
    return not (flag is None or flag is False or (type(flag) is int and flag == 0))


#: augmented-assignment methods (``__invert__``, ``__int__``, ``__index__`` only read)
_AUGMENTED = frozenset(f"__i{op}__" for op in ("add", "sub", "mul", "matmul", "truediv", "div", "floordiv",
                                              "mod", "pow", "lshift", "rshift", "and", "or", "xor"))
#: normalizations that update running statistics in place without bumping their versions
_RUNNING_STATS = ("batch_norm", "instance_norm")


def _inplace_name(name: str) -> bool:
    if name.startswith("__") and name.endswith("__"):
        return name in _AUGMENTED or name in ("__setitem__", "__setstate__")
    return name.endswith("_") or any(n in name for n in _RUNNING_STATS)


def _position(original: Any, name: str) -> Optional[int]:
    """Positional index of the parameter ``name`` (``inplace``, ``out``) of ``original``
    (None: none, or no signature available; given by keyword it is checked separately)."""
    try:
        params = list(inspect.signature(original).parameters.values())
    except (TypeError, ValueError):
        return None
    for i, p in enumerate(params):
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            return None
        if p.name == name:
            return i
    return None
