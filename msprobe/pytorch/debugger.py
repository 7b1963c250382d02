"""``PrecisionDebugger`` for PyTorch: the user API (seeds "PyTorch 场景的精度数据采集").

Typical use::

    debugger = PrecisionDebugger(config_path="./config.json")
    for data, label in loader:
        debugger.start(model)      # recording on for this step
        loss = criterion(model(data), label)
        loss.backward()
        debugger.stop()            # recording off; files written
        debugger.step()            # step finished: step{N}/rank/ complete, counter N+1

Each debugger owns one :class:`msprobe.core.session.Session`; a second debugger shares no
state with the first (spec section 9, fix 22). The most recently constructed one is the
target of the static ``PrecisionDebugger.save`` (level ``debug``).
"""
from __future__ import annotations

import atexit
import logging
import os
import warnings
import weakref
from pathlib import Path
from typing import Any, ClassVar, Optional, Sequence

import torch

from msprobe.core.bench import BenchBaseline, BenchSelector
from msprobe.core.config import Config, load_config
from msprobe.core.errors import ConfigError, MsprobeError
from msprobe.core.handles import HandleGroup
from msprobe.core.reload import ConfigWatcher
from msprobe.core.risk import recorded_at
from msprobe.core.session import Session
from msprobe.pytorch.api_hooks import install_api_hooks, load_api_list
from msprobe.pytorch.autograd_guard import install_autograd_guard
from msprobe.core.naming import safe_component
from msprobe.pytorch.debug_save import DebugSaver
from msprobe.pytorch.module_hooks import hook_module, install_module_hooks
from msprobe.pytorch.payload import write_pt
from msprobe.pytorch.recorder import Recorder
from msprobe.pytorch.references import References
from msprobe.pytorch.replay import InputReplay
from store.schema import TENSOR_DIR

logger = logging.getLogger("msprobe")

_TORCH_DIR = os.path.dirname(torch.__file__)
_MODEL_LEVELS = ("L0", "mix")
_API_LEVELS = ("L1", "mix")


def _current_rank() -> tuple[Optional[int], str, Optional[int]]:
    """``(rank, rank_dir, world_size)``: the global rank, ``rank{R}`` and the world size
    when torch.distributed is initialised, else ``(None, "rank", None)`` (spec section 1.1)."""
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        r = dist.get_rank()
        return r, f"rank{r}", dist.get_world_size()
    return None, "rank", None


def _dump_data_dir(dump_path: str, level: str):
    """dump.json ``dump_data_dir``: the configured path kept as written (relative stays
    relative), e.g. ``./dump/step0/rank/dump_tensor_data``; level debug:
    ``./dump/rank/dump_tensor_data`` (spec 1.1, 1.2)."""
    def of(step_dir: Path) -> str:
        if level == "debug":
            return os.path.join(dump_path, step_dir.name, TENSOR_DIR)
        return os.path.join(dump_path, step_dir.parent.name, step_dir.name, TENSOR_DIR)
    return of


def _as_models(model: Any, level: str, why: Optional[str] = None) -> tuple[list[torch.nn.Module], bool]:
    """Validate ``model`` → ``(models, indexed)``; raises ConfigError for a bad type
    (``why`` the model is needed goes into its detail; default: the level records modules)."""
    if isinstance(model, torch.nn.Module):
        return [model], False
    if isinstance(model, (list, tuple)) and model and all(isinstance(m, torch.nn.Module) for m in model):
        return list(model), True
    raise ConfigError("model", model, "a torch.nn.Module or a non-empty list/tuple of torch.nn.Module",
                      detail=why or f"level {level} records modules")


def _structure(models: list[torch.nn.Module]) -> list:
    """Every module of ``models`` (``modules()`` order, per model) each followed by its own
    parameters: what the module and parameter-gradient hooks were installed on. A module or
    parameter added, removed or replaced since (an adapter attached, ``m.weight =
    nn.Parameter(...)``) changes it."""
    out: list = []
    for model in models:
        for m in model.modules():
            out.append(m)
            out.extend(p for p in m._parameters.values() if p is not None)
    return out


def _modules_of(model: Any) -> list[torch.nn.Module]:
    """``model`` as a list of modules where it is a module or a list/tuple of them, else []."""
    if isinstance(model, torch.nn.Module):
        return [model]
    if isinstance(model, (list, tuple)):
        return [m for m in model if isinstance(m, torch.nn.Module)]
    return []


class PrecisionDebugger:
    """Records a PyTorch training run (spec section 6.1, with the fixes of section 9).

    Args:
        config_path: path of a config.json (spec section 5); None = the shipped default.
        task: ``"statistics"``, ``"tensor"`` or ``"structure"``; overrides the file.
        dump_path: output directory; overrides the file.
        level: ``"L0"``, ``"L1"``, ``"mix"`` or ``"debug"``; overrides the file.
        model: a ``torch.nn.Module`` or list/tuple of them (L0/mix); ``start(model)`` overrides.
        step: list of steps to record (ints and ``"a-b"`` ranges); overrides the file.

    Raises:
        ConfigError: any invalid value, naming the field, the value and what is allowed,
            before any training code runs.
    """

    _latest: ClassVar[Optional["weakref.ref[PrecisionDebugger]"]] = None

    def __init__(self, config_path: Optional[str] = None, task: Optional[str] = None,
                 dump_path: Optional[str] = None, level: Optional[str] = None,
                 model: Any = None, step: Optional[Sequence[Any]] = None) -> None:
        self.config: Config = load_config(config_path, task=task, dump_path=dump_path, level=level,
                                          step=step, framework="pytorch")
        if self.config.level == "L2":
            raise ConfigError("level", "L2", "L0, L1, mix, debug",
                              detail="kernel dump (L2) needs Ascend hardware and is not supported by msprobe for PyTorch")
        if model is not None:
            _as_models(model, self.config.level)
        self.model = model
        self.session = Session(self.config, framework="pytorch", exclude_dirs=(_TORCH_DIR,), tensor_ext="pt",
                               **_tensor_files(self.config))
        # tensor.bench_path: the baseline is read once, here (a bad one is a ConfigError now)
        self._bench = (BenchSelector(BenchBaseline(self.config.bench_path), self.config.diff_nums)
                       if self.config.bench_path is not None else None)
        self.recorder = Recorder(self.session, self._bench)
        # load: recorded module inputs replayed (msprobe.pytorch.replay)
        self._replay = InputReplay(self.config.load) if self.config.load is not None else None
        self._replay_handles: Optional[HandleGroup] = None
        self._replay_models: list[weakref.ref] = []
        self._api_handles: Optional[HandleGroup] = None
        self._references: Optional[References] = None
        self._model_handles: Optional[HandleGroup] = None
        self._hooked_structure: list[weakref.ref] = []  # _structure() of the hooked models
        self._dump_module_handles: Optional[HandleGroup] = None
        self._dump_grad_handles = HandleGroup()
        self._dump_grad_hooked: set[tuple[int, str, int]] = set()  # (module, prefix, recorder) ids hooked
        self._deprecation_warned = False
        self._saver = DebugSaver(self.recorder)
        #: API-list names not found in this PyTorch (reported, not fatal); levels L1/mix
        self.unknown_apis: list[str] = []
        self._api_specs = None
        self._load_api_specs()
        # dump_enable: config.json is re-read while the job runs (msprobe.core.reload)
        self._watcher: Optional[ConfigWatcher] = None
        self._staged: Optional[Config] = None
        if self.config.dump_enable is not None and config_path is not None:
            def load_again() -> Config:
                return _same_run(self.config, load_config(config_path, task=task, dump_path=dump_path, level=level,
                                                          step=step, framework="pytorch"))
            self._watcher = ConfigWatcher(config_path, load_again, self.config)
        PrecisionDebugger._latest = weakref.ref(self)
        atexit.register(_close_at_exit, weakref.ref(self))
        if self.config.level == "debug":  # {dump_path}/{rank_dir}/debug.json from now on (spec 1.2)
            self.session.start(*_current_rank())

    def _load_api_specs(self) -> None:
        """The APIs to hook at levels L1/mix: the API list, less what ``risk_level`` leaves
        out (those are not hooked at all: msprobe.core.risk)."""
        self._api_specs = None
        if self.config.level in _API_LEVELS:
            specs, self.unknown_apis = load_api_list(self.config.api_list)
            self._api_specs = [spec for spec in specs if recorded_at(self.config.risk_level, spec.family, spec.api)]

    def _poll_config(self) -> None:
        """dump_enable: take a changed config.json (:class:`ConfigWatcher`), and apply it
        when no step is open (at ``start()`` of a new step or after ``step()``)."""
        if self._watcher is None:
            return
        # looked at every 0.5 s while recording is switched on, every 3 s while off
        new = self._watcher.poll(self.config.dump_enable is not False and not self.session.finished)
        if new is not None:
            self._staged = new
        if self._staged is None or self.session._opened_step == self.session.step:
            return
        config, self._staged = self._staged, None
        try:
            self._reconfigure(config)
        except Exception as exc:  # never into training: the recorder stops, the run goes on
            self.recorder.internal_error(exc)

    def _reconfigure(self, config: Config) -> None:
        """Use ``config`` (level, task, steps, filters, ...) from the next ``start()`` on:
        the hooks are removed and installed again at ``start()`` by a new recorder."""
        self.recorder.drain()
        self.recorder.flush_deferred()
        self._remove_recording_hooks()
        self.config = config
        self.session.reconfigure(config, **_tensor_files(config))
        if self._bench is not None:
            self._bench.limit = config.diff_nums
        self.recorder = Recorder(self.session, self._bench)
        self._saver = DebugSaver(self.recorder)
        self._load_api_specs()

    # --- user API -------------------------------------------------------------------------
    def start(self, model: Any = None) -> None:
        """Start (or resume) recording the current step. The first call installs the hooks;
        a later one installs the module and parameter hooks again where the model, or a
        module or parameter in it, is not the one hooked (:func:`_structure`).

        Args:
            model: overrides the constructor's model (levels L0/mix need one).

        Raises:
            ConfigError: level L0/mix without a model, or a model of the wrong type.
        """
        self._poll_config()
        level = self.config.level
        if self._replay is not None:
            self._start_replay(model if model is not None else self.model)
            if not self.config.load.dump_after_load:
                return
        if level == "debug" or self.config.dump_enable is False:
            return
        model = model if model is not None else self.model
        models: list[torch.nn.Module] = []
        indexed = False
        if level in _MODEL_LEVELS:
            if model is None:
                raise ConfigError("model", None, "a torch.nn.Module or a list/tuple of them",
                                  detail=f"level {level} records modules: pass model to PrecisionDebugger(...) or start(model)")
            models, indexed = _as_models(model, level)
        rank, rank_dir, world_size = _current_rank()
        self.recorder.leaves.memo.clear()
        if not self.session.start(rank, rank_dir, world_size):
            return
        if self._api_handles is None:
            self._api_handles = HandleGroup()
            self._api_handles.add(install_autograd_guard(self.session, after=self._after_backward,
                                                         before=self._before_backward))
            if level in _API_LEVELS:
                targets: dict = {}
                self._api_handles.add(install_api_hooks(self._api_specs, self.recorder, targets))
                self._references = References(targets, self._api_handles)
        if models:
            # hooks again where the models, or a module or parameter in them, changed since
            # they were installed (weak references: a removed module is not kept alive)
            structure = _structure(models)
            hooked = self._hooked_structure
            if len(hooked) != len(structure) or any(r() is not o for r, o in zip(hooked, structure)):
                if self._model_handles is not None:
                    self._model_handles.remove()
                self._model_handles = install_module_hooks(models, indexed, self.recorder)
                self._hooked_structure = [weakref.ref(o) for o in structure]
        if self._references is not None:  # functions held by reference (msprobe.pytorch.references)
            with self.recorder.guarded():
                self._references.scan(models or _modules_of(model))
        self._before_backward()

    def _start_replay(self, model: Any) -> None:
        """``load``: hook ``model``'s modules named in ``load.modules`` (again when the
        model changed) and replay from the current step on."""
        why = "load replays module inputs: pass model to PrecisionDebugger(...) or start(model)"
        if model is None:
            raise ConfigError("model", None, "a torch.nn.Module or a list/tuple of them", detail=why)
        models, indexed = _as_models(model, self.config.level, why)
        hooked = [ref() for ref in self._replay_models]
        if len(hooked) != len(models) or any(a is not b for a, b in zip(hooked, models)):
            handles = self._replay.install(models, indexed)
            if self._replay_handles is not None:
                self._replay_handles.remove()
            self._replay_handles = handles
            self._replay_models = [weakref.ref(m) for m in models]
        self._replay.begin(self.session.step, _current_rank()[0])

    def _before_backward(self) -> None:
        """A backward pass starts (and at ``start()``): parameters that require grad since
        the hooks were installed get their gradient hooks (msprobe.pytorch.grad_hooks)."""
        recorder = self.recorder
        if len(recorder.frozen):
            with recorder.guarded():
                recorder.frozen.sweep()

    def _after_backward(self) -> None:
        """A backward pass returned. Under torch.distributed, DDP's reducer has allreduced the
        gradient buckets in C++ during it (no Python call, no version bump): statistics of
        gradients recorded before that are not reused after it (msprobe.pytorch.stats_memo)."""
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            self.recorder.leaves.memo.clear()

    def stop(self) -> None:
        """Stop recording forward calls; the step's files are written. Backward calls of
        forwards recorded in this step are still recorded until :meth:`step`.
        A no-op at level debug (debug.json is written by :meth:`close` and at exit)."""
        if self.config.level == "debug":
            return
        self.recorder.drain()
        self.recorder.leaves.memo.clear()
        self.session.stop()
        self._poll_config()

    @staticmethod
    def save(variable: Any, name: str, save_backward: bool = True) -> None:
        """Level debug: record ``variable`` as ``{name}.{k}`` in debug.json, and with
        ``save_backward`` its gradients as ``{name}_grad.{k}`` (seeds "save"; spec 6.1,
        fix 15). Records into the most recently constructed debugger; a no-op when there
        is none or its level is not ``debug``.

        Args:
            variable: tensor, dict, list, tuple, int, float, str or None (nested freely);
                anything else is skipped with a warning.
            name: the entry name (``k`` counts the calls with this name).
            save_backward: also record the gradients of the saved tensors.

        Raises:
            ConfigError: ``name`` is not a non-empty str or ``save_backward`` not a bool.
        """
        dbg = PrecisionDebugger._latest() if PrecisionDebugger._latest is not None else None
        if dbg is None or dbg.config.level != "debug":
            return
        dbg._saver.save(variable, name, save_backward)

    def forward_backward_dump_end(self) -> None:
        """Deprecated alias of :meth:`stop` (warns once)."""
        if not self._deprecation_warned:
            self._deprecation_warned = True
            warnings.warn("forward_backward_dump_end() is deprecated; use stop()", DeprecationWarning, stacklevel=2)
        self.stop()

    def module_dump(self, module: torch.nn.Module, name: str) -> None:
        """Record only ``module`` until :meth:`module_dump_end`, as one entry per call named
        ``Module.{name}.{Class}.forward.{n}`` (and ``.backward.{n}``, ``.parameters_grad``);
        its children and the APIs called inside it, and every other API or module, are
        not recorded in between (seeds "module_dump"; spec section 9 fix 23).

        Args:
            module: the ``torch.nn.Module`` to record.
            name: the user's name for it (sanitised for file names).

        Raises:
            ConfigError: ``module`` is not an ``nn.Module`` or ``name`` is not a non-empty str.
        """
        if not isinstance(module, torch.nn.Module):
            raise ConfigError("module", module, "a torch.nn.Module", detail="module_dump(module, name)")
        if not isinstance(name, str) or not name:
            raise ConfigError("name", name, "a non-empty string", detail="module_dump(module, name)")
        self.module_dump_end()
        if self.session.finished:  # past the last step: nothing is recorded, nothing is hooked
            return
        prefix = f"Module.{safe_component(name)}.{type(module).__name__}"
        self._dump_module_handles = HandleGroup()
        # the parameter-gradient hooks stay until the last step: once per module, name and recorder
        key = (id(module), prefix, id(self.recorder))
        grad_group = None if key in self._dump_grad_hooked else self._dump_grad_handles
        self._dump_grad_hooked.add(key)
        hook_module(module, prefix, self.recorder, self._dump_module_handles, grad_group)
        self.recorder.exclusive = prefix

    def module_dump_end(self) -> None:
        """End the :meth:`module_dump` window; recording resumes normally (idempotent).
        The module's parameter-gradient hooks stay until the last step (or :meth:`close`),
        so a backward run after this call still records its ``parameters_grad``."""
        self.recorder.exclusive = None
        if self._dump_module_handles is not None:
            self._dump_module_handles.remove()
            self._dump_module_handles = None

    def step(self) -> None:
        """Finish the step: ``step{N}/{rank}/`` is written completely (by the writer process,
        not waited for: :meth:`wait_files`) and the step advances to N+1.
        A no-op at level debug."""
        if self.config.level == "debug":
            return
        if self._replay is not None:
            self._replay.end_step()
        self.session.end_step(before_export=self.recorder.flush_pending)
        if self.session.finished:
            try:
                self._remove_all_hooks()
            except Exception as exc:  # never into training
                self.recorder.internal_error(exc)
        self._poll_config()

    def _remove_recording_hooks(self) -> None:
        """Remove the API wrappers, the autograd guard and the module and parameter hooks;
        the next ``start()`` that records installs them again. After the last step of the
        config's ``step`` list nothing can be recorded any more, so :meth:`step` removes
        them then: the rest of the run calls torch's own functions (a config.json reload
        that selects later steps installs them again)."""
        for handles in (self._api_handles, self._model_handles):
            if handles is not None:
                handles.remove()
        self._api_handles = self._model_handles = None
        self._references = None
        self._hooked_structure = []

    def _remove_all_hooks(self) -> None:
        """:meth:`_remove_recording_hooks`, then the :meth:`module_dump` window and
        module_dump's parameter-gradient hooks: what step() of the last step and
        :meth:`close` remove (``load``'s replay hooks follow ``load.step`` and stay)."""
        self._remove_recording_hooks()
        self.module_dump_end()
        self._dump_grad_handles.remove()
        self._dump_grad_hooked.clear()

    def wait_files(self, timeout: Optional[float] = None) -> bool:
        """Wait until the files of every ``stop()`` and ``step()`` so far are written (the
        rank's writer process writes them while training goes on; ``close()`` waits too).

        Args:
            timeout: seconds to wait at most; None waits as long as it takes.
        Returns:
            True when the files are written, False when ``timeout`` passed first.
        """
        return self.session.wait_files(timeout)

    def close(self) -> None:
        """Remove every hook and close the event log (idempotent)."""
        self.recorder.drain()
        if self.session.recording:
            self.session.stop()
        self._remove_all_hooks()
        if self._replay_handles is not None:
            self._replay_handles.remove()
        self._replay_handles = None
        self._replay_models = []
        self.session.close()

    def __enter__(self) -> "PrecisionDebugger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _tensor_files(config: Config) -> dict:
    """The Session's ``dump_data_dir`` and ``write_tensor`` for ``config``: set for task
    tensor and for task statistics with a ``tensor_list`` (the entries it names keep their
    full tensors), None otherwise."""
    if config.task == "tensor" or config.tensor_list:
        return {"dump_data_dir": _dump_data_dir(config.dump_path, config.level), "write_tensor": write_pt}
    return {"dump_data_dir": None, "write_tensor": None}


def _same_run(old: Config, new: Config) -> Config:
    """``new`` if a running debugger built with ``old`` can switch to it (dump_enable);
    raises ConfigError for what cannot change while the job runs: ``dump_path``,
    ``async_dump``, ``api_list``, ``load``, ``tensor.bench_path``, and level ``debug`` (or ``L2``) on either side."""
    for field in ("dump_path", "async_dump", "api_list", "load", "bench_path"):
        if getattr(new, field) != getattr(old, field):
            raise ConfigError(field, getattr(new, field), repr(getattr(old, field)),
                              detail="it cannot change while the job runs (dump_enable)")
    if new.level != old.level and "debug" in (new.level, old.level) or new.level == "L2":
        raise ConfigError("level", new.level, "L0, L1, mix", detail=f"the job runs at level {old.level}")
    return new


def _latest_debugger() -> PrecisionDebugger:
    dbg = PrecisionDebugger._latest() if PrecisionDebugger._latest is not None else None
    if dbg is None:
        raise MsprobeError("no PrecisionDebugger exists: construct one before module_dump()")
    return dbg


def module_dump(module: torch.nn.Module, name: str) -> None:
    """:meth:`PrecisionDebugger.module_dump` of the most recently constructed debugger.

    Raises:
        MsprobeError: no debugger exists. ConfigError: bad ``module`` or ``name``.
    """
    _latest_debugger().module_dump(module, name)


def module_dump_end() -> None:
    """:meth:`PrecisionDebugger.module_dump_end` of the most recently constructed debugger."""
    _latest_debugger().module_dump_end()


def _close_at_exit(ref: "weakref.ref[PrecisionDebugger]") -> None:
    dbg = ref()
    if dbg is None:
        return
    try:
        dbg.recorder.drain()
        if dbg.session.recording:
            dbg.session.stop()
        dbg.session.close()
    except Exception as exc:  # never fail the interpreter exit
        logger.error("msprobe: final flush failed: %s", exc)
