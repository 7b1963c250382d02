"""Level ``debug``: ``PrecisionDebugger.save(variable, name, save_backward=True)``
(seeds "save"; spec sections 1.2, 2.1, 2.2, 6.1 with section 9 fix 15).

Each call with the same ``name`` counts ``k`` = 0, 1, ...; the variable is recorded under
``{name}.{k}`` in ``{dump_path}/{rank_dir}/debug.json``. Tensors, nested dicts, lists and
tuples, int, float, bool, str and None are recorded like call arguments (spec 3.3). With
``save_backward``, ``{name}_grad.{k}`` holds the same structure, all ``null`` at first;
a hook on each saved tensor that requires grad fills its slot with the gradient when
backward reaches it (unused branches stay ``null``). Task ``tensor`` writes
``{name}.{k}.tensor.{index path}.pt`` (``y.0.tensor.pt`` for a top-level tensor).
"""
from __future__ import annotations

import logging
from typing import Any, Iterator, Optional

import torch

from msprobe.core.errors import ConfigError
from msprobe.core.naming import CallCounter
from msprobe.core.values import walk
from msprobe.pytorch.leaves import is_structseq
from store import schema
from store.records import Call, Leaf

logger = logging.getLogger("msprobe")

SAVE_TYPES = (torch.Tensor, dict, list, tuple, int, float, str, type(None))


class DebugSaver:
    """Records ``save`` calls of one debugger.

    Args:
        recorder: the debugger's :class:`msprobe.pytorch.recorder.Recorder`.
    """

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder
        self.counter = CallCounter()

    def save(self, variable: Any, name: str, save_backward: bool = True) -> None:
        """Record ``variable`` as ``{name}.{k}`` (see the module docstring).

        Raises:
            ConfigError: ``name`` is not a non-empty str or ``save_backward`` not a bool.
        """
        if not isinstance(name, str) or not name:
            raise ConfigError("name", name, "a non-empty string", detail="PrecisionDebugger.save")
        if not isinstance(save_backward, bool):
            raise ConfigError("save_backward", save_backward, "True, False", detail="PrecisionDebugger.save")
        if not isinstance(variable, SAVE_TYPES):
            logger.warning("msprobe: save(%r): a %s is not saved; allowed: tensor, dict, list, tuple, int, "
                           "float, str, None", name, type(variable).__name__)
            return
        rec = self.recorder
        s = rec.session
        if not s.recording or s.failed:
            return
        with rec.guarded():
            k = self.counter.next(name)
            entry = f"{name}.{k}"
            leaves: list[Leaf] = []
            rec.leaves.for_entry(entry)
            rec.leaves.leaves("", variable, leaves)
            rec.emit(Call(step=s.step, kind=schema.DEBUG_SAVE, name=entry, api_type="debug", leaves=tuple(leaves)))
            if save_backward:
                grad_entry = f"{name}_grad.{k}"
                nulls = tuple(Leaf(io="", path=leaf.path, leaf_kind=schema.LEAF_NONE) for leaf in leaves)
                # file names of the gradients as the saved tensors' (leaf order), whatever
                # order backward delivers them in
                s.reserve_file_names(grad_entry, schema.DEBUG_SAVE,
                                     [("", leaf.path) for leaf in leaves if leaf.leaf_kind == schema.LEAF_TENSOR])
                rec.emit(Call(step=s.step, kind=schema.DEBUG_SAVE, name=grad_entry, api_type="debug", leaves=nulls))
                for path, t in _tensors(variable, ()):
                    if t.requires_grad:
                        t.register_hook(self._grad_hook(grad_entry, path, s.step))

    def _grad_hook(self, entry: str, path: tuple, step: int):
        rec = self.recorder

        def hook(grad: torch.Tensor) -> None:
            with rec.guarded():
                rec.leaves.for_entry(entry)
                leaf = rec.leaves.tensor_leaf("", path, grad)
                rec.emit(Call(step=step, kind=schema.DEBUG_SAVE, name=entry, api_type="debug", leaves=(leaf,)))
            return None

        return hook


def _tensors(value: Any, path: tuple) -> Iterator[tuple[tuple, torch.Tensor]]:
    """``(path, tensor)`` of every tensor in ``value``, with the leaf paths of
    :class:`msprobe.pytorch.leaves.LeafBuilder` (the same walk: list index int, dict key,
    namedtuple or dataclass field str), so that each gradient fills its own slot."""
    for p, v, kind in walk(value, leaf_kind=_tensor_kind, record=_no_record, as_list=is_structseq, path=path):
        if kind == schema.LEAF_TENSOR:
            yield p, v


def _tensor_kind(value: Any) -> Optional[str]:
    return schema.LEAF_TENSOR if isinstance(value, torch.Tensor) else None


def _no_record(value: Any) -> dict:
    return {}
