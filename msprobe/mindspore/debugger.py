"""``PrecisionDebugger`` for MindSpore PyNative: the user API (seeds "MindSpore 场景的精度数据采集").

Typical use::

    debugger = PrecisionDebugger(config_path="./config.json")
    grad_fn = mindspore.value_and_grad(forward_fn, None, optimizer.parameters)
    for data, label in dataset:
        debugger.start(net)          # recording on for this step
        loss, grads = grad_fn(data, label)
        optimizer(grads)
        debugger.stop()              # recording off; files written
        debugger.step()              # step finished: step{N}/rank/ complete, counter N+1

Each debugger owns one :class:`msprobe.core.session.Session`; two debuggers share no state
(spec section 9, fix 22). The most recently constructed one is the target of the static
:meth:`PrecisionDebugger.save` (level ``debug``). Level ``L2`` in ``GRAPH_MODE`` configures
MindSpore's own kernel dump instead (:mod:`msprobe.mindspore.graph_dump`), read into the
event log at :meth:`PrecisionDebugger.step` and :meth:`PrecisionDebugger.close` (or
interpreter exit) by :mod:`msprobe.kernel_dump.ingest`. Level ``L0`` in ``GRAPH_MODE`` on
the CPU backend records Cells through pyfunc ops compiled into the graph
(:mod:`msprobe.mindspore.graph_cells`); ``start(model)`` must then come before the first
call that compiles the graph.
"""
from __future__ import annotations

import atexit
import logging
import os
import warnings
import weakref
from pathlib import Path
from typing import Any, ClassVar, Optional, Sequence

import mindspore as ms
from mindspore import nn

from msprobe.core.config import Config, load_config
from msprobe.core.errors import ConfigError
from msprobe.core.handles import HandleGroup
from msprobe.core.naming import safe_component
from msprobe.core.npy_payload import write_npy
from msprobe.core.session import Session
from msprobe.mindspore.api_hooks import ApiHooks, load_api_list
from msprobe.mindspore.cell_hooks import CellHooks, install_cell_hooks
from msprobe.mindspore.debug_session import DebugSession
from msprobe.mindspore.grad_end import install_grad_end
from msprobe.mindspore.jit_hooks import install_jit_hook
from msprobe.mindspore.primitive_hooks import PrimitiveHooks, install_primitive_hooks
from msprobe.mindspore.recorder import Recorder
from store.schema import TENSOR_DIR

logger = logging.getLogger("msprobe")

_MS_DIR = os.path.dirname(ms.__file__)
_MODEL_LEVELS = ("L0", "mix")
_API_LEVELS = ("L1", "mix")


def current_rank() -> tuple[Optional[int], str]:
    """``(rank, rank_dir)``: the global rank and ``rank{R}`` once
    ``mindspore.communication.init()`` ran, else ``(None, "rank")`` (spec 1.1)."""
    try:
        from mindspore.communication.management import GlobalComm, get_rank
        if GlobalComm.INITED:
            r = int(get_rank())
            return r, f"rank{r}"
    except Exception:
        pass
    return None, "rank"


def _as_models(model: Any, level: str) -> tuple[list[nn.Cell], bool]:
    """Validate ``model`` → ``(models, indexed)``; raises ConfigError for a bad type."""
    if isinstance(model, nn.Cell):
        return [model], False
    if isinstance(model, (list, tuple)) and model and all(isinstance(m, nn.Cell) for m in model):
        return list(model), True
    raise ConfigError("model", model, "a mindspore.nn.Cell or a non-empty list/tuple of mindspore.nn.Cell",
                      detail=f"level {level} records Cells")


class PrecisionDebugger:
    """Records a MindSpore PyNative training run (spec section 6.2, with section 9 fixes).

    Args:
        config_path: path of a config.json (spec section 5); None = the shipped default.
        task: ``"statistics"``, ``"tensor"`` or ``"structure"``; overrides the file.
        dump_path: output directory; overrides the file.
        level: ``"L0"``, ``"L1"``, ``"mix"``, ``"debug"`` (PyNative) or ``"L2"``
            (GRAPH_MODE only); overrides the file.
        step: steps to record (ints, integer strings and ``"a-b"`` ranges); overrides the file.

    Raises:
        ConfigError: any invalid value, naming the field, the value and what is allowed;
            level L2 in PyNative mode, or L1/mix/debug in GRAPH_MODE, or L0 in GRAPH_MODE on
            a backend other than CPU (naming MindSpore's TensorDump op where the backend
            lacks it, :mod:`msprobe.mindspore.graph_levels`).
    """

    _latest: ClassVar[Optional["weakref.ref[PrecisionDebugger]"]] = None

    def __init__(self, config_path: Optional[str] = None, task: Optional[str] = None,
                 dump_path: Optional[str] = None, level: Optional[str] = None,
                 step: Optional[Sequence[Any]] = None) -> None:
        self.config: Config = load_config(config_path, task=task, dump_path=dump_path, level=level,
                                          step=step, framework="mindspore")
        graph_mode = ms.get_context("mode") == ms.GRAPH_MODE
        self.kernel_dump: Optional[Path] = None
        self._api_hooks: Optional[ApiHooks] = None
        self._other_handles: Optional[HandleGroup] = None
        self._model_handles: Optional[CellHooks] = None
        self._prim_handles: Optional[PrimitiveHooks] = None
        self._hooked_models: list[weakref.ref] = []  # the Cells hooked (weak: a dropped Cell is not kept alive)
        self._silent_warned = False
        self._deprecation_warned = False
        self._save_counts: dict[str, int] = {}
        self.last_model: Any = None  # the model of the latest start(model); start() reuses it
        self.kernel_report = None  # GRAPH_MODE L2: the msprobe.kernel_dump.ingest.IngestReport of close()
        self._kernel_reader = None
        #: GRAPH_MODE level L0 (CPU): Cells recorded through pyfunc ops (msprobe.mindspore.graph_cells)
        self.graph_cells = graph_mode and self.config.level == "L0"
        if self.config.level == "L2" or graph_mode:
            from msprobe.mindspore.graph_dump import configure_kernel_dump
            from msprobe.mindspore.graph_levels import check_graph_mode_level
            self.session = None
            self.recorder = None
            if not graph_mode:
                raise ConfigError("level", "L2", ("L0", "L1", "mix", "debug"),
                                  detail="PyNative mode; for kernel dump (L2) call "
                                         "mindspore.set_context(mode=mindspore.GRAPH_MODE) before PrecisionDebugger")
            check_graph_mode_level(self.config.level)
        if self.config.level == "L2":
            self.kernel_dump = configure_kernel_dump(self.config, ms.get_context("device_target"))
            from msprobe.kernel_dump.ingest import KernelDumpReader
            self._kernel_reader = KernelDumpReader(self.config.dump_path, new_files_only=True)
            atexit.register(_close_at_exit, weakref.ref(self))
            return
        # task tensor: tensors go to the payload store at record time; the exporter writes
        # the .npy files (mapping.csv for long names), live and in `msprobe export`
        writer = write_npy if self.config.task == "tensor" else None
        data_dir = (lambda d: os.path.abspath(os.path.join(d, TENSOR_DIR))) if writer else None
        if self.config.level == "debug":
            self.session = DebugSession(self.config, exclude_dirs=(_MS_DIR,), dump_data_dir=data_dir,
                                        write_tensor=writer)
        else:
            self.session = Session(self.config, framework="mindspore", exclude_dirs=(_MS_DIR,),
                                   dump_data_dir=data_dir, write_tensor=writer, tensor_ext="npy")
        if self.graph_cells:
            from msprobe.mindspore.graph_cells import GraphCellRecorder
            self.recorder = GraphCellRecorder(self.session)
        else:
            self.recorder = Recorder(self.session)
        if self.config.level == "debug":
            rank, rank_dir = current_rank()
            self.session.start(rank, rank_dir)
            self._other_handles = HandleGroup()
            self._other_handles.add(install_grad_end(self.recorder.backward_end))
        PrecisionDebugger._latest = weakref.ref(self)
        atexit.register(_close_at_exit, weakref.ref(self))

    # --- user API -------------------------------------------------------------------------
    def start(self, model: Any = None) -> None:
        """Start (or resume) recording the current step.

        Args:
            model: a ``mindspore.nn.Cell`` or list/tuple of Cells. Required at L0/mix (once:
                later ``start()`` calls reuse it); at L1 it adds the Primitive calls of its
                Cells (spec 6.2). In GRAPH_MODE (L0, CPU) its hooks are compiled into the
                graph: call ``start(model)`` before the first call of the network (or of
                the ``TrainOneStepCell`` around it); a graph compiled earlier records nothing.

        Raises:
            ConfigError: level L0/mix without a model, or a model of the wrong type; in
                GRAPH_MODE (L0), a Parameter of the model that already holds a forward hook.
        """
        level = self.config.level
        if self.session is None or level == "debug":
            return
        models: list[nn.Cell] = []
        indexed = False
        if model is None:
            model = self.last_model
        if level in _MODEL_LEVELS and model is None:
            raise ConfigError("model", None, "a mindspore.nn.Cell or a list/tuple of them",
                              detail=f"level {level} records Cells: pass start(model)")
        if model is not None:
            models, indexed = _as_models(model, level)
            self.last_model = model
        rank, rank_dir = current_rank()
        if self.graph_cells:
            # the hooks must be in place when the graph compiles, whether or not this step is recorded
            if not _same_models(self._hooked_models, models) and not self.session.finished:
                from msprobe.mindspore.graph_cells import GraphCellHooks
                if self._model_handles is not None:
                    self._model_handles.remove()
                    self._model_handles = None
                self._model_handles = GraphCellHooks(models, indexed, self.recorder)
                self._hooked_models = [weakref.ref(m) for m in models]
            self.session.start(rank, rank_dir)
            return
        if not self.session.start(rank, rank_dir):
            return
        if self._other_handles is None:
            self._other_handles = HandleGroup()
            if level in _API_LEVELS:
                specs, _unknown = load_api_list()
                self._api_hooks = ApiHooks(specs, self.recorder)
                self._other_handles.add(self._api_hooks)
                self._other_handles.add(install_jit_hook(self.recorder, _JitGuard(self)))
            self._other_handles.add(install_grad_end(self.recorder.backward_end))
        if models:
            if not _same_models(self._hooked_models, models):
                for group in (self._model_handles, self._prim_handles):
                    if group is not None:
                        group.remove()
                self._model_handles = self._prim_handles = None
                if level in _MODEL_LEVELS:
                    self._model_handles = install_cell_hooks(models, indexed, self.recorder)
                if level in _API_LEVELS:
                    self._prim_handles = install_primitive_hooks(models, self.recorder)
                self._hooked_models = [weakref.ref(m) for m in models]

    def stop(self) -> None:
        """Stop recording forward calls; the step's files are written. Backward calls of
        forwards recorded in this step are still recorded until :meth:`step`."""
        if self.session is not None and self.config.level != "debug":
            self._sync_graph()
            self.session.stop()

    def _sync_graph(self) -> None:
        """GRAPH_MODE L0: wait for the running graph's pyfunc ops before recording stops."""
        if self.graph_cells and self.session.recording:
            self.recorder.sync()
            if not self.recorder.arrivals and not self._silent_warned:
                self._silent_warned = True
                logger.warning("msprobe: step %d recorded nothing: no Cell of the model ran through msprobe's hooks "
                               "in GRAPH_MODE. The hooks are compiled into the graph: call debugger.start(net) "
                               "before the first call that compiles the graph (the network, or the "
                               "TrainOneStepCell around it); a graph compiled earlier records nothing",
                               self.session.step)

    def forward_backward_dump_end(self) -> None:
        """Deprecated alias of :meth:`stop` (warns once)."""
        if not self._deprecation_warned:
            self._deprecation_warned = True
            warnings.warn("forward_backward_dump_end() is deprecated; use stop()", DeprecationWarning, stacklevel=2)
        self.stop()

    def step(self) -> None:
        """Finish the step: ``step{N}/{rank}/`` is written completely (by the writer process,
        not waited for: :meth:`wait_files`) and the step advances to N+1.
        GRAPH_MODE (level L2): read the iterations MindSpore has finished dumping (all but
        the newest) into the event log."""
        if self._kernel_reader is not None:
            self._read_kernel_dump(final=False)
        if self.session is not None and self.config.level != "debug":
            self._sync_graph()
            self.session.end_step(before_export=self.recorder.flush_pending)
            if self.session.finished:
                self._remove_recording_hooks()

    def _remove_recording_hooks(self) -> None:
        """Remove the API, Primitive, Cell and gradient-end hooks (the next ``start()``
        that records installs them again): :meth:`step` does so after the last step of
        the config's ``step`` list, when nothing can be recorded any more."""
        for handles in (self._prim_handles, self._model_handles, self._other_handles):
            if handles is not None:
                handles.remove()
        self._api_hooks = self._other_handles = self._model_handles = self._prim_handles = None
        self._hooked_models = []

    @staticmethod
    def save(variable: Any, name: str, save_backward: bool = True) -> None:
        """Level ``debug``: record ``variable`` as ``{name}.{k}`` in ``{dump_path}/{rank}/debug.json``
        (``k`` counts the saves of ``name``) and, with ``save_backward``, its gradient as
        ``{name}_grad.{k}`` when a gradient computation reaches it (spec 6.1/6.2).

        Args:
            variable: a ``mindspore.Tensor``, list, tuple, dict, int, float or str (nested).
            name: the entry name (str).
            save_backward: also record gradients (bool).

        Raises:
            ConfigError: ``name`` not a str or ``save_backward`` not a bool.
        """
        if not isinstance(name, str) or not name:
            raise ConfigError("name", name, "a non-empty string")
        if not isinstance(save_backward, bool):
            raise ConfigError("save_backward", save_backward, "true, false")
        ref = PrecisionDebugger._latest
        dbg = ref() if ref is not None else None
        if dbg is None or dbg.session is None or dbg.config.level != "debug" or dbg.config.task == "structure":
            return
        k = dbg._save_counts.get(name, 0)
        dbg._save_counts[name] = k + 1
        if not dbg.session.open_step(dbg.session.step):
            return
        dbg.recorder.save(variable, safe_component(name), k, save_backward)

    def wait_files(self, timeout: Optional[float] = None) -> bool:
        """Wait at most ``timeout`` s (None: as long as it takes) for the files of every
        ``stop()``/``step()`` so far; False when the time passed first
        (:meth:`msprobe.core.session.Session.wait_files`)."""
        return self.session.wait_files(timeout)

    def close(self) -> None:
        """Remove every hook and close the event log (idempotent). GRAPH_MODE (level L2):
        read MindSpore's kernel dump into the event log (:mod:`msprobe.kernel_dump.ingest`;
        :attr:`kernel_report` says what was read); a failure is logged, never raised."""
        self._read_kernel_dump()
        if self.session is None:
            return
        if self.session.recording:
            self._sync_graph()
            self.session.stop()
        if self.config.level == "debug":
            self.session.stop()
        self._remove_recording_hooks()
        self.session.close()

    def _read_kernel_dump(self, final: bool = True) -> None:
        """Read MindSpore's kernel dump into the log (``final``: all of it, then close the
        log); a failure is logged, never raised into the training script."""
        reader = self._kernel_reader
        if reader is None:
            return
        try:
            if final:
                self._kernel_reader = None
                reader.close()
            else:
                reader.read(final=False)
        except Exception as exc:  # never fail the training script
            logger.error("msprobe: reading MindSpore's kernel dump into the log failed: %s", exc)
        self.kernel_report = reader.report

    def __enter__(self) -> "PrecisionDebugger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _same_models(refs: list, models: Sequence[nn.Cell]) -> bool:
    """Whether ``refs`` (weak references) name exactly the Cells ``models``, in order."""
    return len(refs) == len(models) and all(r() is m for r, m in zip(refs, models))


class _JitGuard:
    """Suspends a debugger's API wrappers, Cell hooks and Primitive wrappers around one
    ``@jit`` graph call (nestable)."""

    def __init__(self, debugger: PrecisionDebugger) -> None:
        self._ref = weakref.ref(debugger)
        self._active: list[list[Any]] = []

    def suspend(self, owner: Any) -> None:
        dbg = self._ref()
        parts = [] if dbg is None else [h for h in (dbg._api_hooks, dbg._model_handles, dbg._prim_handles)
                                        if h is not None]
        for part in parts:
            part.suspend(owner)
        self._active.append(parts)

    def resume(self) -> None:
        if self._active:
            for part in reversed(self._active.pop()):
                part.resume()


def _close_at_exit(ref: "weakref.ref[PrecisionDebugger]") -> None:
    dbg = ref()
    if dbg is not None:
        dbg._read_kernel_dump()
    if dbg is None or dbg.session is None:
        return
    try:
        if dbg.session.recording or dbg.config.level == "debug":
            dbg._sync_graph()
            dbg.session.stop()
        dbg.session.close()
    except Exception as exc:  # never fail the interpreter exit
        logger.error("msprobe: final flush failed: %s", exc)
