"""The recording session: start/stop/step state machine shared by all adapters.

One :class:`Session` per ``PrecisionDebugger``; it owns the step counter, the call
counters, the filters, the stack interner and the log writer, so two debuggers share
nothing. Adapters (``msprobe.pytorch``, ``msprobe.mindspore``) install hooks that build
:class:`store.records.Call` events and hand them to :meth:`Session.emit`.

Semantics (spec section 6.1, seeds "start/stop/step"):

* ``start()`` turns forward recording on when the current step and the rank are
  selected; ``{dump_path}/step{N}/{rank_dir}/`` gets skeleton files. The files of every
  export are written by the rank's writer process (:mod:`store.writer_client`), not
  waited for (:meth:`Session.wait_files`, ``close()`` and ``MSPROBE_WAIT_FILES=1`` wait).
* ``stop()`` turns forward recording off and exports what the step holds so far.
  Backward events of forwards recorded in this step are still accepted until ``step()``
  (a ``stop()`` before ``loss.backward()`` followed by ``step()`` keeps the backward data).
* Only the process that created the session records: in a forked child (a DataLoader
  worker forked while recording) recording is off and nothing reaches the log.
* ``step()`` exports the step (again, now complete), fsyncs the log, advances the step
  counter and resets the call counters. Events of a finished step arriving later are
  dropped, so that ``msprobe export`` over the log reproduces the live layout exactly.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional


from msprobe.core.arrow_pool import prefer_system_pool
from msprobe.core.config import Config
from msprobe.core.errors import ConfigError
from msprobe.core.filters import DataMode, NameList
from msprobe.core.guard import INSIDE
from msprobe.core.naming import CallCounter, free_file_name, tensor_file_name, unique_file_names
from msprobe.core.stack import StackInterner
from store import schema
from store.log_names import (COMPRESSION_ALLOWED, COMPRESSION_ENV, SEGMENT_ALLOWED, SEGMENT_ENV, log_compression,
                             other_process_logs, segment_bytes)
from store.records import Call, Marker, Stack
from store.writer_client import WriterClient, WriterGone
from store.writer_process import EXPORT, message_record

if TYPE_CHECKING:  # these load pyarrow: imported where the log is written in this process
    from store.export import StepFiles, TensorFileWriter
    from store.log_writer import LogWriter
    from store.payload_writer import PayloadReader, PayloadWriter

logger = logging.getLogger("msprobe")

#: environment variable: ``inprocess`` writes the log and the step files in the training
#: process instead of a writer process (docs/architecture.md)
WRITER_ENV = "MSPROBE_WRITER"
#: environment variable: ``1`` makes ``stop()`` and ``step()`` wait until the step's files
#: are written (docs/pytorch.md, "When the files are written")
WAIT_ENV = "MSPROBE_WAIT_FILES"


def _warn_earlier_logs(dump_path, rank: int) -> None:
    """Warn once when ``dump_path`` already holds a log of ``rank`` written by another
    process (an earlier run, or another run pointed at the same path): the log reader
    joins every log file, so the recordings would mix. One directory listing, when the
    session opens its log; never raises (an unreadable directory: no warning)."""
    try:
        earlier = len(other_process_logs(dump_path, rank))
    except Exception:  # a check must never stop recording
        return
    if earlier:
        logger.warning(
            "msprobe: dump_path %r already holds %d earlier log%s of rank %d (written by another "
            "process, e.g. a previous run); this run's log is added beside %s: the SQL views "
            "(msprobe query: both runs' rows side by side), msprobe "
            "export and msprobe compare will include the earlier run's rows, "
            "while the step directories show only the newest run. Use a new dump_path, or delete the "
            "old one.",
            str(dump_path), earlier, "" if earlier == 1 else "s", rank, "it" if earlier == 1 else "them")


class Session:
    """State of one recording session.

    Args:
        config: the validated configuration.
        framework: ``"pytorch"`` or ``"mindspore"`` (dump.json ``framework``).
        exclude_dirs: framework package directories dropped from stack.json.
        dump_data_dir: callable ``(step_dir: Path) -> str | None`` giving dump.json's
            ``dump_data_dir`` for a step directory (None for task statistics).
        write_tensor: task ``tensor``: the adapter's tensor-file callback (``.pt``/``.npy``)
            handed to the exporter; payloads are stored only when it is given.
        tensor_ext: file extension of tensor files (``"pt"``, ``"npy"``), for ``data_name``.
    """

    def __init__(
        self,
        config: Config,
        *,
        framework: str,
        exclude_dirs: tuple[str, ...] = (),
        dump_data_dir: Callable[[Path], Optional[str]] | None = None,
        write_tensor: TensorFileWriter | None = None,
        tensor_ext: str = "pt",
    ) -> None:
        self.config = config
        self.framework = framework
        self.step = 0
        self.recording = False
        self.failed = False
        self.finished = False
        self.rank: int | None = None
        self.rank_dir = "rank"
        #: number of ranks of the job (torch.distributed world size); None without one
        self.world_size: int | None = None
        self.api_counter = CallCounter()
        self.module_counter = CallCounter()
        self.data_mode = DataMode.from_config(config.data_mode)
        self.name_list = NameList(config.list)
        self.stacks = StackInterner(exclude_dirs)
        self._dump_data_dir = dump_data_dir or (lambda _d: None)
        self._meta_key: tuple | None = None  # meta(): the key and the dict built for it
        self._meta: dict = {}
        # the log and the step files: a writer process (``_client``), or in this process
        # (``_writer`` and ``_files``: task tensor, MSPROBE_WRITER=inprocess, or after the
        # writer process ended)
        self._client: WriterClient | None = None
        self._writer: LogWriter | None = None
        self._files: StepFiles | None = None
        self._from_log_step: int | None = None  # a step whose files come from the log (after a fall-back)
        self._stacks: dict[int, tuple[str, ...]] = {}
        self._opened_step: int | None = None
        self._lock = threading.RLock()
        self._tls = INSIDE  # the "busy" flag, shared by all sessions (msprobe.core.guard)
        self.local = threading.local()  # this session's per-thread state (module stacks)
        self.disabled = False
        self._last_step = config.last_step
        self._pid = os.getpid()
        os.register_at_fork(after_in_child=functools.partial(_forget_in_child, weakref.ref(self)))
        self._write_tensor = write_tensor
        self._tensor_ext = tensor_ext
        try:  # read once, before training starts: a bad value is a ConfigError here
            self._segment_bytes = segment_bytes()
        except ValueError as exc:
            raise ConfigError(SEGMENT_ENV, os.environ.get(SEGMENT_ENV), SEGMENT_ALLOWED,
                              "an environment variable (docs/query.md, Log segments)") from exc
        try:
            self._compression = log_compression()
        except ValueError as exc:
            raise ConfigError(COMPRESSION_ENV, os.environ.get(COMPRESSION_ENV), COMPRESSION_ALLOWED,
                              "an environment variable (docs/query.md, Log compression)") from exc
        self._payloads: PayloadWriter | None = None
        self._payload_reader: PayloadReader | None = None
        # tensor file names given out in the step (one dump_tensor_data directory): name ->
        # (entry, io, path) of its leaf, and back (see _named)
        self._file_owner: dict[str, tuple] = {}
        self._file_of: dict[tuple, str] = {}
        self._rank_warned = False
        self._rerun_checked = False  # the earlier-run check ran (see _warn_earlier_logs)
        self._flush_hooks: list[Callable[[], None]] = []
        self._dirty = True  # entries arrived since the last export of the step
        self._emitted = False  # a call of this step went to the log since end_step

    def reconfigure(self, config: Config, *, dump_data_dir: Callable[[Path], Optional[str]] | None = None,
                    write_tensor: TensorFileWriter | None = None) -> None:
        """Use ``config`` from now on (config.json re-read under ``dump_enable``, see
        :mod:`msprobe.core.reload`): filters, selected steps, task and tensor files. Called
        between steps only (no step open); the step counter, the log and what was recorded
        stay. The flush hooks are dropped (the adapter's new recorder adds its own).

        Raises:
            ValueError: a step is open, or ``config`` has another ``dump_path``.
        """
        if self._opened_step == self.step:
            raise ValueError("Session.reconfigure: a step is open; call it between steps")
        if config.dump_path != self.config.dump_path:
            raise ValueError("Session.reconfigure: dump_path cannot change")
        self.config = config
        self.data_mode = DataMode.from_config(config.data_mode)
        self.name_list = NameList(config.list)
        self._last_step = config.last_step
        self.finished = self._last_step is not None and self.step > self._last_step
        self._dump_data_dir = dump_data_dir or (lambda _d: None)
        self._write_tensor = write_tensor
        self._flush_hooks = []
        if write_tensor is not None and self._client is not None:
            # tensor files are staged in this process: from the next start() the log is too
            with self._lock:
                self._store("close")
                self._client = None

    def add_flush_hook(self, fn: Callable[[], None]) -> None:
        """Register ``fn`` to run before every export and at close (adapters resolve entries
        whose statistics are still pending on a device there)."""
        self._flush_hooks.append(fn)

    def _run_flush_hooks(self) -> None:
        for fn in self._flush_hooks:
            fn()

    # --- per-thread "inside the tool" flag ---------------------------------------------
    @property
    def busy(self) -> bool:
        """True while this thread runs msprobe's own code or a recorded call (calls made
        inside are not recorded: only the outermost API call appears, spec 2.1)."""
        return getattr(self._tls, "busy", False)

    @busy.setter
    def busy(self, value: bool) -> None:
        self._tls.busy = value

    # --- selection ------------------------------------------------------------------------
    def step_selected(self) -> bool:
        return not self.config.step or self.step in self.config.step

    def rank_selected(self) -> bool:
        if not self.config.rank:
            return True
        return (self.rank or 0) in self.config.rank

    def accepts(self, name: str) -> bool:
        """The ``list`` filter: substring match on the entry name (spec 5.5)."""
        return self.name_list.matches(name)

    def open_step(self, step: int) -> bool:
        """True if events of ``step`` are still accepted (it is the current, unexported step)."""
        return not (self.failed or self.disabled) and self._opened_step == step and step == self.step

    # --- state machine ------------------------------------------------------------------------
    def disable(self) -> None:
        """Stop recording for good after an internal error; what was recorded is still
        exported at the next stop()/step()."""
        self.disabled = True
        self.recording = False

    def internal_error(self, exc: BaseException) -> None:
        """An adapter's own code failed: log it once, with its traceback, and stop
        recording (:meth:`disable`); the training run is never interrupted."""
        if not self.disabled:
            logger.error("msprobe: internal error, recording stopped: %s: %s", type(exc).__name__, exc,
                         exc_info=exc)
        self.disable()

    def module_stack(self) -> list:
        """This thread's stack of module/Cell forwards in progress (adapters push frames)."""
        stack = getattr(self.local, "frames", None)
        if stack is None:
            stack = self.local.frames = []
        return stack

    def start(self, rank: int | None, rank_dir: str, world_size: int | None = None) -> bool:
        """Turn recording on for the current step if it and the rank are selected.

        Args:
            rank: the global rank, None without a process group.
            rank_dir: ``rank{R}`` or ``rank`` (spec 1.1).
            world_size: the number of ranks of the job, None without a process group; it
                goes into the markers' ``meta`` (``world_size``), where the ``replicas``
                view reads the default rank group (store.replicas).

        Returns True if recording is now on."""
        if self.failed or self.finished or self.disabled or os.getpid() != self._pid:
            return False
        if self._last_step is not None and self.step > self._last_step:
            self.finished = True
            return False
        self.rank, self.rank_dir, self.world_size = rank, rank_dir, world_size
        if rank is None and not self.rank_selected() and not self._rank_warned:
            self._rank_warned = True
            logger.warning("msprobe: rank filter %s excludes this process: torch.distributed is not "
                           "initialised, so it counts as rank 0 (spec section 9, fix 18); nothing is recorded",
                           list(self.config.rank))
        if not self.rank_selected() or not self.step_selected():
            self.recording = False
            return False
        with self._lock:
            if self._writer is None and self._client is None:
                if not self._rerun_checked:
                    self._rerun_checked = True
                    _warn_earlier_logs(self.config.dump_path, self.rank or 0)
                self._open_store()
            if self._payloads is None and self._write_tensor is not None:
                from store.payload_writer import PayloadReader, PayloadWriter

                # tensor files are staged by the writer thread while the step runs; the
                # export moves them into place (shards this process wrote: no hash pass)
                self._payloads = PayloadWriter(self.config.dump_path, self.rank or 0,
                                               stage=(self._write_tensor, self._tensor_ext))
                self._payload_reader = PayloadReader(self.config.dump_path, verify=False,
                                                     stage=self._payloads.staging,
                                                     before_read=self._payloads.wait_written)
            first_start = self._opened_step != self.step
            self._opened_step = self.step
            self._store("append_marker", Marker(step=self.step, kind=schema.MARKER_START, meta=self.meta()))
            if first_start:
                self._export()
        if first_start:
            self._wait_if_asked()
        self.recording = not self.failed
        return self.recording

    def stop(self) -> None:
        """Turn forward recording off and export what the step holds so far."""
        self.recording = False
        if not self._store_open() or self._opened_step != self.step or self.failed:
            return
        self._run_flush_hooks()
        with self._lock:
            self._store("append_marker", Marker(step=self.step, kind=schema.MARKER_STOP, meta=self.meta()))
            self._export()
        self._wait_if_asked()

    def end_step(self, before_export: Callable[[], None] | None = None) -> None:
        """Finish the step: export it, fsync the log, advance the counter, reset counters.

        Args:
            before_export: called first (adapters emit pending backward entries there).
        """
        self.recording = False
        if before_export is not None:
            before_export()
        self._run_flush_hooks()
        ended = False
        with self._lock:
            if self._store_open() and self._opened_step == self.step and not self.failed:
                self._store("append_marker", Marker(step=self.step, kind=schema.MARKER_STEP_END, meta=self.meta()))
                self._export()
                # fsync in the background; rows flushed after the export (the step_end
                # marker) are not kept; the next step's exporter starts empty
                self._store("end_step", self.step)
                if self._from_log_step == self.step:
                    self._from_log_step = None
                ended = True
            if self.config.level != "debug":  # debug level: one directory for the whole run
                self._file_owner = {}
                self._file_of = {}
            self._opened_step = None
            self._dirty = True
            self._emitted = False
            self.step += 1
            self.api_counter.reset()
            self.module_counter.reset()
        if self._last_step is not None and self.step > self._last_step:
            self.finished = True
        if ended:
            self._wait_if_asked()

    def wait_files(self, timeout: float | None = None) -> bool:
        """Wait until the files of every ``stop()`` and ``step()`` so far are written and
        everything recorded is in the log (the writer process writes them while training
        goes on). Returns False when ``timeout`` (s) passed first; True at once when the
        files are written in this process.
        """
        with self._lock:
            client = self._client
        if client is None:
            return True
        try:
            return client.wait(timeout)
        except WriterGone as gone:
            with self._lock:
                self._fall_back(gone)
            return True
        except Exception as exc:  # noqa: BLE001 - a write fault of the writer process
            if not self.failed:
                self._write_failed(exc)
            return True

    def close(self) -> None:
        """Hand over what is pending, wait for the writer process to write the files and
        close the log (at most 300 s), or close the log written here (idempotent)."""
        self._run_flush_hooks()
        with self._lock:
            if self._client is not None:
                self._store("close")
                self._client = None
            if self._writer is not None:
                try:
                    self._writer.close()
                except Exception as exc:  # never raise into training at exit
                    logger.error("msprobe: closing the event log failed: %s", exc)
                self._writer = None
            if self._payloads is not None:
                try:
                    self._payloads.close()
                except Exception as exc:
                    if not self.failed:  # the failure that stopped recording was logged then
                        logger.error("msprobe: closing the tensor payload store failed: %s", exc)
                self._payloads = None

    # --- tensor payloads (task tensor) --------------------------------------------------
    @property
    def stores_tensors(self) -> bool:
        """True when tensors are stored (task ``tensor`` with a tensor-file callback)."""
        return self._write_tensor is not None

    def put_payload(self, data: bytes, dtype: str, shape: tuple[int, ...]) -> str | None:
        """Store one tensor's bytes; returns the payload reference (None when not stored:
        no tensor task, not started, or the store failed; the failure is logged once)."""
        if self._payloads is None or self.failed:
            return None
        return self._guard(self._payloads.put, data, dtype, shape)

    # --- events -----------------------------------------------------------------------------
    def emit(self, call: Call) -> None:
        """Append one entry to the log if its step is still open and the log is not closed
        (nothing is written after :meth:`close`). Leaves holding a payload get their
        ``data_name`` (spec 2.2) here."""
        if not self.open_step(call.step) or os.getpid() != self._pid:
            return
        with self._lock:
            if not self.open_step(call.step) or not self._store_open():
                # step() ended it while this thread waited for the lock, or close() closed
                # the log (gradients of a graph built while recording arrive after close())
                return
            if self._payloads is not None and any(leaf.payload is not None for leaf in call.leaves):
                call = dataclasses.replace(call, leaves=self._named(call))
            for sid, frames in self.stacks.drain():
                self._stacks[sid] = frames
                self._store("append_stack", Stack(stack_id=sid, frames=frames))
            self._store("append", call)
            self._dirty = True
            self._emitted = True

    def _named(self, call: Call) -> tuple:
        """``call.leaves`` with a ``data_name`` (spec 2.2) on each leaf that holds a payload
        and has none yet: distinct within the entry (:func:`unique_file_names`) and from
        the names other leaves of the step got (entries emitted leaf by leaf, such as
        ``{name}_grad.{k}`` and ``parameters_grad``, and entries whose names sanitise alike,
        such as modules ``x/y`` and ``x_y``), so that no file holds another leaf's tensor.
        A leaf recorded again in the step (same entry, io and path: an accumulated
        parameter gradient) keeps its name; its record and its file are replaced."""
        leaves = list(call.leaves)
        todo = [i for i, leaf in enumerate(leaves) if leaf.payload is not None and leaf.data_name is None]
        named = [leaf.data_name for leaf in leaves if leaf.data_name is not None]  # kept as they are
        names = self._file_names(call.name, call.kind, [(leaves[i].io, leaves[i].path) for i in todo], named)
        for i, name in zip(todo, names):
            leaves[i] = leaves[i].replace(data_name=name)
        return tuple(leaves)

    def reserve_file_names(self, entry: str, kind: str, slots: list) -> None:
        """Give the leaves ``slots`` (``(io, path)`` pairs, in leaf order) of ``entry`` their
        tensor file names now, for an entry whose leaves arrive one by one later (a debug
        save's ``{name}_grad.{k}``): they get the names the whole entry would get at once,
        whatever order they arrive in. A no-op unless tensors are stored."""
        if self._payloads is None:
            return
        with self._lock:
            self._file_names(entry, kind, slots, [])

    def _file_names(self, entry: str, kind: str, slots: list, named: list) -> list:
        """The file names of the leaves ``slots`` (``(io, path)``) of ``entry`` (see
        :meth:`_named`; ``named``: names the entry's other leaves already have), registered
        for the step."""
        names = unique_file_names(
            named + [tensor_file_name(entry, kind, io, path, self._tensor_ext) for io, path in slots])[len(named):]
        own = set(named).union(names)
        owner, file_of = self._file_owner, self._file_of
        out = []
        for (io, path), name in zip(slots, names):
            key = (entry, io, tuple(path))
            known = file_of.get(key)
            if known is not None:
                name = known
            elif owner.get(name, key) != key:  # another leaf of the step has this name
                name = free_file_name(name, lambda n: n in own or n in owner)
                own.add(name)
            owner[name] = key
            file_of[key] = name
            out.append(name)
        return out

    def meta(self) -> dict:
        """The markers' and the export's ``meta`` of the current step (``task``, ``level``,
        ``framework``, ``dump_data_dir``, ``rank_dir``, ``extra_info``, and ``world_size`` and
        ``ranks`` where known). Built once per step, rank directory and config (a start, stop
        and step_end marker and two exports ask for it each step); callers do not change it."""
        key = (self.step, self.rank_dir, self.world_size, self.config, self._dump_data_dir)
        if self._meta_key == key:
            return self._meta
        step_dir = self.step_dir()
        meta = {
            "task": self.config.task,
            "level": self.config.level,
            "framework": self.framework,
            "dump_data_dir": self._dump_data_dir(step_dir),
            "rank_dir": self.rank_dir,
            "extra_info": self.config.extra_info,
        }
        if self.world_size is not None:
            meta["world_size"] = self.world_size
        if self.config.rank:  # only these ranks record: readers expect no log of the others
            meta["ranks"] = sorted(self.config.rank)
        self._meta_key, self._meta = key, meta
        return meta

    def step_dir(self, step: int | None = None) -> Path:
        return Path(self.config.dump_path) / f"step{self.step if step is None else step}" / self.rank_dir

    # --- internals ---------------------------------------------------------------------------
    def _open_store(self) -> None:
        """Start the rank's writer process, or open the log in this process (task
        ``tensor``: its staged tensor files are this process's; ``MSPROBE_WRITER=inprocess``;
        a writer process that cannot start)."""
        if self._write_tensor is None and os.environ.get(WRITER_ENV, "process") != "inprocess":
            try:
                self._client = WriterClient(self.config.dump_path, self.rank or 0, segment_bytes=self._segment_bytes,
                                            compression=self._compression)
                return
            except WriterGone as exc:
                logger.warning("msprobe: the writer process could not start (%s); the log and the step "
                               "files are written in the training process", exc.__cause__ or exc)
        self._writer, self._files = _log_here(self.config.dump_path, self.rank or 0, self._segment_bytes,
                                              self._compression)

    def _store_open(self) -> bool:
        return self._client is not None or self._writer is not None

    def _store(self, method: str, *args) -> None:
        """Call ``method`` of the writer process's client, or of the log writer here
        (``end_step`` and ``close`` map to their in-process equivalents). A writer process
        that ended is replaced by writing here (:meth:`_fall_back`); a write fault stops
        recording (:meth:`_guard`). Under ``_lock``."""
        if self.failed:
            return
        if self._client is not None:
            try:
                getattr(self._client, method)(*args)
                return
            except WriterGone as gone:
                self._fall_back(gone)
                if method in ("append", "append_stack", "append_marker", "export"):
                    # a record: among the messages the fall-back wrote; an export: _export
                    # goes on with the in-process export of the step
                    return
                if method in ("end_step", "close") and self._opened_step == self.step:
                    # the step's last export request went to the writer process that died
                    self._guard(self._export_from_log)
            except Exception as exc:  # noqa: BLE001 - a write fault reported by the writer process
                if not self.failed:
                    self._write_failed(exc)
                return
        if self._writer is None:
            return
        if method == "end_step":
            self._guard(self._files.end_step, *args)
        elif method == "close":
            pass  # close() closes the log writer
        else:
            self._guard(getattr(self._writer, method), *args)

    def _fall_back(self, gone: WriterGone) -> None:
        """The writer process ended: say so once, open the log here, write every record it
        had not acknowledged, and take the current step's files from the log files (the
        writer process wrote part of the step). Under ``_lock``."""
        logger.error("msprobe: the writer process ended (exit status %s); the log and the step files are "
                     "written in the training process from now on; nothing recorded is lost", gone.status)
        self._client = None
        self._writer, self._files = _log_here(self.config.dump_path, self.rank or 0, self._segment_bytes,
                                              self._compression)
        for sid, frames in self._stacks.items():
            self._guard(self._writer.append_stack, Stack(stack_id=sid, frames=frames))
        exported = set()  # steps whose files the writer process was asked for
        for message in gone.messages:
            record = message_record(message)
            if isinstance(record, Call):
                self._guard(self._writer.append, record)
            elif isinstance(record, Stack):
                self._guard(self._writer.append_stack, record)
            elif isinstance(record, Marker):
                self._guard(self._writer.append_marker, record)
            elif message[0] == EXPORT:
                exported.add(message[1])
        exported.discard(self.step)
        if exported:  # ended steps whose files the writer process may not have written
            self._guard(self._export_from_log, sorted(exported))
        self._from_log_step = self.step
        self._dirty = True  # the writer process may not have written the step's files

    def _wait_if_asked(self) -> None:
        """``MSPROBE_WAIT_FILES=1``: ``stop()`` and ``step()`` return once the files are written."""
        if os.environ.get(WAIT_ENV, "") not in ("", "0"):
            self.wait_files()

    def _export(self) -> None:
        """Write (or have the writer process write) the step's files from the rows logged so
        far. While no call of the step was recorded (the start() skeleton) only the log is
        flushed (the start marker is a recovery point) and the skeleton files are written."""
        if not self._store_open() or self.failed or not self._dirty:
            return  # the files on disk already hold everything of this step
        self._dirty = False
        if self._client is not None:
            self._store("export", self.step, self.meta(), self._emitted)
            if self._client is not None:
                return
        if self._from_log_step == self.step:
            self._guard(self._export_from_log)
            return
        # the export reads the staged tensor files; the shards are written meanwhile, and
        # are on disk when stop()/step() returns
        if self._payloads is not None and self._emitted:
            self._guard(functools.partial(self._payloads.flush, shards=False))
        self._guard(functools.partial(self._files.export, self.step, self.meta(), self._emitted,
                                      payloads=self._payload_reader, write_tensor=self._write_tensor))
        if self._payloads is not None and self._emitted:
            self._guard(self._payloads.wait_written)

    def _export_from_log(self, steps: list | None = None) -> None:
        """The files of ``steps`` (default: the current step) from the log files
        (:func:`store.export.export_log`): after a fall-back, part of them is in the writer
        process's log only."""
        from store.export import export_log

        steps = [self.step] if steps is None else steps
        self._writer.flush()
        for step in steps:
            self._writer.drop_step_rows(step)
        export_log(self.config.dump_path, ranks=[self.rank or 0], steps=steps)

    def _guard(self, fn, *args):
        """Run a store call; on failure log one clear error and stop recording for good."""
        if self.failed:
            return None
        try:
            return fn(*args)
        except Exception as exc:
            self._write_failed(exc)
            return None

    def _write_failed(self, exc: BaseException) -> None:
        """A store write failed (here or in the writer process): log one clear error and
        stop recording for good."""
        self.failed = True
        self.recording = False
        logger.error(
            "msprobe: recording stopped after an I/O error (%s: %s); data written before stays readable in %s",
            type(exc).__name__, exc, os.fspath(self.config.dump_path),
        )


def _log_here(dump_path, rank: int, segment: int = 0, compression: Optional[str] = None) -> tuple:
    """``(LogWriter, StepFiles)`` writing the log (segments of ``segment`` bytes, 0: one
    file; IPC ``compression`` None, ``"lz4"`` or ``"zstd"``) and the step files in this
    process (imported here: they load pyarrow, which a process handing its records to a writer
    process never needs; Arrow's pool is the system allocator when still open,
    msprobe.core.arrow_pool)."""
    prefer_system_pool()
    from store.log_writer import LogWriter
    from store.export import StepFiles

    writer = LogWriter(dump_path, rank, segment_bytes=segment, compression=compression)
    return writer, StepFiles(writer, dump_path)


def _forget_in_child(ref: "weakref.ref[Session]") -> None:
    """After ``fork()`` in the child (a DataLoader worker started while recording): the
    session records nothing there. Only the process that created a session records; the
    child's calls are neither recorded nor written into the parent's log."""
    session = ref()
    if session is not None:
        session.recording = False
