"""``torch.compile``: what the hooks must know about compiled regions.

While ``torch.compile`` traces (Dynamo, then AOTAutograd and the backend),
:func:`is_compiling` is True; every msprobe hook and API wrapper then only passes the
call through, and it tests this *before* reading any of its own state, so Dynamo traces
exactly the call of the original (no guard on msprobe's state, no graph break, the same
graph as without msprobe). A compiled region therefore runs without msprobe's code in it;
docs/pytorch.md, section "torch.compile", says what is recorded around it. With config
``compiled_regions: "inside"`` they also add a recording op to the graph
(:mod:`msprobe.pytorch.compiled_record`).

:func:`is_fake` tells tensors without readable values (``FakeTensor``, and
``FunctionalTensor`` or other wrappers around one) that a recorder may meet outside a
compiled region, e.g. under a user's ``FakeTensorMode``: their leaves get dtype and shape
only (:meth:`msprobe.pytorch.leaves.LeafBuilder.tensor_leaf`).

Calls that the compiled code's runtime makes eagerly (AOTAutograd copying a gradient into
the layout its backward graph expects) are not calls of the user's and are not recorded:
an API wrapper does not record a call whose caller's module (``__name__`` of the calling
frame's globals) is in one of :data:`COMPILER_PACKAGES`.
"""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import is_fake as _is_fake

#: ``torch.compiler.is_compiling`` (torch >= 2.3; Dynamo folds a call of it to the constant
#: True while tracing, and torch sets it for the whole compile session); False on older torch
is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)

#: packages of torch.compile's machinery: Dynamo, AOTAutograd, Inductor
#: (``torch.func``'s transforms, also under ``torch._functorch``, call user functions: not listed)
COMPILER_PACKAGES = ("torch._dynamo", "torch._functorch._aot_autograd", "torch._functorch.aot_autograd",
                     "torch._inductor")


def is_fake(t: torch.Tensor) -> bool:
    """Whether ``t`` (any tensor) is, or wraps, a ``FakeTensor``: it has a dtype and a shape
    but no values (its data pointer cannot be read)."""
    try:
        return bool(_is_fake(t))
    except Exception:
        return False
