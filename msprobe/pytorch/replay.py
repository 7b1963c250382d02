"""config.json ``load``: replay recorded module inputs (the ``load`` object of upstream 26.x).

For each module forward named in ``load.modules`` (``Module.{path}.{Class}.forward.{n}``),
the tensors the module received in an earlier tensor dump replace its actual inputs, at
its forward, before the module (and msprobe's own recording hook) sees them: positional
tensor argument ``i`` by ``{entry}.input.{i}.pt`` and keyword tensor argument ``k`` by
``{entry}.kwargs.{k}.pt`` of ``{load.path}/step{N}/{rank dir}/dump_tensor_data/``, where
``N`` is the current step and the rank directory the current rank's (``rank{R}``; without
torch.distributed ``rank``, ``rank0`` or the one ``proc{pid}`` of upstream 26.x). Other
arguments are left alone. This isolates a module: its output then depends only on its
own computation, not on what ran before it.

``n`` counts the module's forward calls since the last ``step()`` (as the recording
numbers them when the whole step is recorded). ``load.step``/``load.rank`` restrict the
steps/ranks in which inputs are replaced (empty: all). A replayed tensor is a new leaf of
the autograd graph (``requires_grad`` as the argument it replaces): no gradient flows
from it to what produced the original argument. A missing file, or one whose shape or
dtype differs from the argument's, keeps the original argument and logs one warning per
entry and step; replaying never stops training.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from msprobe.core.config import LoadSpec
from msprobe.core.errors import ConfigError
from msprobe.core.guard import INSIDE
from msprobe.core.handles import HandleGroup
from msprobe.core.naming import tensor_file_name
from msprobe.pytorch.module_hooks import module_prefixes
from store.schema import TENSOR_DIR as _TENSOR_DIR

logger = logging.getLogger("msprobe")

__all__ = ["InputReplay"]


class InputReplay:
    """Replaces the inputs of the modules ``spec.modules`` by recorded ones.

    Args:
        spec: the validated ``load`` object.

    Use: :meth:`install` hooks the models (once per model list), :meth:`begin` is called
    at every ``start()`` with the current step and rank, :meth:`end_step` at ``step()``.
    """

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self._entries = frozenset(spec.modules)
        self._prefixes = {name.rsplit(".forward.", 1)[0] for name in spec.modules}
        self._counts: dict[str, int] = {}
        self._step: Optional[int] = None
        self._rank: Optional[int] = None
        self._active = False
        self._data_dir: Optional[Path] = None
        self._warned: set = set()
        #: entry names replaced since the last :meth:`end_step`
        self.replaced: set[str] = set()

    def install(self, models: Sequence[torch.nn.Module], indexed: bool) -> HandleGroup:
        """Hook the modules of ``models`` that ``load.modules`` names; returns the handles.

        Args:
            models: the model(s) passed to ``start()``, as a sequence (one model: a
                one-element sequence).
            indexed: True when the user passed a list or tuple of models: module paths
                then start with the model's index (``Module.0.layer.Linear``), as the
                recording names them (:func:`msprobe.pytorch.module_hooks.module_prefixes`).

        Raises:
            ConfigError: (field ``load.modules``) an entry names no module of ``models``
                (its ``Module.{path}.{Class}`` prefix is not one the recording would give).
        """
        found = dict(module_prefixes(models, indexed))
        for name in self.spec.modules:
            prefix = name.rsplit(".forward.", 1)[0]
            if prefix not in found:
                raise ConfigError("load.modules", name, "a forward of a module of the model passed to start()",
                                  f"the model has no module {prefix}")
        group = HandleGroup()
        for prefix in sorted(self._prefixes):
            group.add(found[prefix].register_forward_pre_hook(self._hook(prefix), with_kwargs=True, prepend=True))
        return group

    def begin(self, step: int, rank: Optional[int]) -> None:
        """Inputs are replaced from now on in step ``step`` of rank ``rank`` (None:
        without torch.distributed) if ``load.step``/``load.rank`` select them."""
        if step != self._step or rank != self._rank:
            self._step, self._rank, self._data_dir = step, rank, None
        self._active = ((not self.spec.step or step in self.spec.step)
                        and (not self.spec.rank or (rank or 0) in self.spec.rank))

    def end_step(self) -> None:
        """The step ended: forward counts restart; a configured module not replaced in
        the step is reported (a warning)."""
        if self._active and self._step is not None:
            missed = sorted(self._entries - self.replaced)
            if missed:
                logger.warning("msprobe: load.modules %s had no forward call in step %d", missed, self._step)
        self._counts.clear()
        self.replaced.clear()
        self._active = False
        self._step = None

    def _hook(self, prefix: str):
        def pre_hook(module, args, kwargs):
            n = self._counts.get(prefix, 0)
            self._counts[prefix] = n + 1
            name = f"{prefix}.forward.{n}"
            if not self._active or name not in self._entries:
                return None
            prev = INSIDE.busy
            INSIDE.busy = True  # reading the files is msprobe's own work: never recorded
            try:
                return self._replace(name, args, kwargs)
            except Exception as exc:  # noqa: BLE001 - replaying never stops training
                self._warn(name, f"inputs not replaced: {type(exc).__name__}: {exc}")
                return None
            finally:
                INSIDE.busy = prev
        return pre_hook

    def _replace(self, name: str, args: tuple, kwargs: dict) -> Optional[tuple[tuple, dict]]:
        data_dir = self._source_dir()
        if data_dir is None:
            self._warn(name, f"no step{self._step} rank directory with {_TENSOR_DIR}/ under {self.spec.path!r}")
            return None
        new_args = list(args)
        for i, value in enumerate(args):
            if isinstance(value, torch.Tensor):
                new_args[i] = self._load(name, data_dir, "input_args", i, value)
        new_kwargs = dict(kwargs)
        for key, value in kwargs.items():
            if isinstance(value, torch.Tensor):
                new_kwargs[key] = self._load(name, data_dir, "input_kwargs", key, value)
        self.replaced.add(name)
        return tuple(new_args), new_kwargs

    def _load(self, name: str, data_dir: Path, io: str, key: Any, current: torch.Tensor) -> torch.Tensor:
        """The recorded tensor of slot ``io``/``key`` of ``name``, on ``current``'s device;
        ``current`` itself (and one warning) when its file is missing or differs in
        shape or dtype."""
        path = data_dir / tensor_file_name(name, "module_forward", io, (key,), "pt")
        if not path.is_file():
            self._warn(name, f"{str(path)!r} is missing; the argument is kept")
            return current
        loaded = torch.load(path, map_location=current.device, weights_only=True)
        if not isinstance(loaded, torch.Tensor) or loaded.shape != current.shape or loaded.dtype != current.dtype:
            what = (f"shape {list(loaded.shape)} dtype {loaded.dtype}" if isinstance(loaded, torch.Tensor)
                    else type(loaded).__name__)
            self._warn(name, f"{str(path)!r} holds {what}, the argument has shape {list(current.shape)} "
                             f"dtype {current.dtype}; the argument is kept")
            return current
        if current.requires_grad and loaded.is_floating_point():
            loaded.requires_grad_(True)
        return loaded

    def _source_dir(self) -> Optional[Path]:
        """``{load.path}/step{N}/{rank dir}/dump_tensor_data`` of the current step and rank."""
        if self._data_dir is not None:
            return self._data_dir
        step_dir = Path(self.spec.path) / f"step{self._step}"
        if self._rank is not None:
            names = [f"rank{self._rank}"]
        else:
            try:
                procs = sorted(d for d in os.listdir(step_dir) if d.startswith("proc") and d[4:].isdigit())
            except OSError:
                procs = []
            names = ["rank", "rank0"] + procs[:1]
        for dir_name in names:
            candidate = step_dir / dir_name / _TENSOR_DIR
            if candidate.is_dir():
                self._data_dir = candidate
                return candidate
        return None

    def _warn(self, name: str, what: str) -> None:
        key = (name, self._step)
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("msprobe: load: %s in step %s: %s", name, self._step, what)
