"""MindSpore's kernel dump into the msprobe event log: rows of kind ``kernel``.

Each executed kernel of one iteration becomes one ``call`` row (``store.schema``) and its
dumped tensors its ``leaf`` rows:

==============  ==========================================================================
column          value
==============  ==========================================================================
kind            ``kernel``
step            MindSpore's iteration (the config's ``step`` selects iterations)
rank            the ``rank_{id}`` directory's id
name            ``Kernel.{graph}.{scope}.{k}``: ``scope`` the kernel's full scope name
                (``Default/network-WithLossCell/_backbone-Net/d1-Dense/MatMul-op0``;
                ``Gradients/...`` for the kernels of the backward pass), ``k`` counts the
                kernel's executions in the iteration (0 but for loops);
                ``Parameter.{graph}.{name}.{k}`` for graph parameters and inputs
api_type        the kernel type (``MatMul``, ``SGD``...) or ``Parameter``
parent          the kernel's scope without its last component (the Cell it belongs to)
io, arg         ``input`` / ``output`` and the slot (``0``, ``1``...); a ``Parameter``
                row's value is ``parameters`` / its name (a graph input, as a Cell's
                parameters are: compare never names it the origin of a divergence)
dtype, shape    from the dump (MindSpore's dtype names: ``Float32``)
statistics      float64 by :func:`msprobe.core.arrays.array_stats` over the ``.npy``
                values (the rules of every other statistic), or MindSpore's own
                statistic.csv values (``saved_data: "statistic"``, GPU/Ascend)
crc32           summary_mode ``md5``: CRC-32 of the ``.npy`` values (C order)
data_name       task ``tensor``: the ``.npy`` path relative to the dump path (the file
                stays where MindSpore wrote it); null for task ``statistics``
==============  ==========================================================================

Order (``seq``) within an iteration: the graph's execution order
(``execution_order/ms_execution_order_graph_{g}.csv``), then kernels missing from it by
dump time, then ``Parameter`` rows by name (MindSpore dumps parameters at the end of the
iteration, after the optimizer's update). ``compare`` pairs the kernels of two runs by
name (graph + scope + execution count) within a rank and step.

Markers: one ``start`` marker per rank and one ``step_end`` marker per iteration, with meta
``{"task", "level": "L2", "framework": "mindspore", "dump_data_dir": the absolute dump path,
"rank_dir": "rank_{id}", "extra_info": false}``.
"""
from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Union

import numpy as np

from msprobe.core.arrays import array_stats
from msprobe.core.checksum import crc32
from msprobe.core.filters import DataMode
from msprobe.kernel_dump.layout import (PARAMETER, STATISTIC_CSV, DumpFile, IterationDir, execution_order,
                                        iteration_dirs, parse_file_name)
from msprobe.kernel_dump.statistic_csv import read_statistic_csv
from store import schema as S
from store.fileutil import atomic_write_text, make_dirs
from store.records import Call, Leaf, Marker

__all__ = ["KERNEL", "KernelSettings", "IngestReport", "KernelDumpReader", "kernel_calls", "dump_files", "ingest_kernel_dump",
           "ingest_if_missing", "write_settings",
           "read_settings", "SETTINGS_FILE", "GRADIENTS_PREFIX"]

logger = logging.getLogger("msprobe")

#: the call kind of kernel-dump rows
KERNEL = S.KERNEL
#: scope prefix MindSpore gives the kernels of the backward pass
GRADIENTS_PREFIX = "Gradients/"
#: msprobe's reading settings of a kernel dump, beside the log: ``{dump_path}/.msprobe/kernel_dump.json``
SETTINGS_FILE = "kernel_dump.json"
TENSOR_TYPE = "mindspore.Tensor"
PARAMETERS = "parameters"


@dataclass(frozen=True)
class KernelSettings:
    """What to read from a kernel dump (from the config of the run that wrote it).

    Attributes:
        task: ``tensor`` (rows name the ``.npy`` files) or ``statistics`` (no file names).
        summary_mode: ``md5`` adds the CRC-32 of each ``.npy`` file's values.
        ranks: ranks to read; ``()`` = all.
        data_mode: config ``data_mode`` values; ``forward``/``backward`` select kernels by
            scope (``Gradients/`` = backward; parameters count as forward),
            ``input``/``output`` the tensors.
    """

    task: str = "tensor"
    summary_mode: str = "statistics"
    ranks: tuple[int, ...] = ()
    data_mode: tuple[str, ...] = ("all",)


@dataclass
class IngestReport:
    """What :func:`ingest_kernel_dump` wrote: ``calls`` kernel rows and ``tensors`` leaves
    per rank (``steps[rank]`` the iterations), and the files it could not read."""

    calls: int = 0
    tensors: int = 0
    steps: dict = field(default_factory=dict)
    skipped: list = field(default_factory=list)


def write_settings(dump_path: Union[str, os.PathLike], settings: KernelSettings) -> Path:
    """Store ``settings`` at ``{dump_path}/.msprobe/kernel_dump.json`` (for ``msprobe export``)."""
    directory = make_dirs(Path(dump_path) / S.STORE_DIR)
    target = directory / SETTINGS_FILE
    atomic_write_text(target, json.dumps({"task": settings.task, "summary_mode": settings.summary_mode,
                                          "ranks": list(settings.ranks), "data_mode": list(settings.data_mode)}))
    return target


def read_settings(dump_path: Union[str, os.PathLike]) -> KernelSettings:
    """The settings :func:`write_settings` stored, or the defaults (task tensor) when the
    dump was not written through msprobe (or the file is unreadable)."""
    try:
        doc = json.loads((Path(dump_path) / S.STORE_DIR / SETTINGS_FILE).read_text(encoding="utf-8"))
        return KernelSettings(task=str(doc["task"]), summary_mode=str(doc["summary_mode"]),
                              ranks=tuple(int(r) for r in doc["ranks"]), data_mode=tuple(doc["data_mode"]))
    except (OSError, ValueError, KeyError, TypeError):
        return KernelSettings()


# --- one iteration -----------------------------------------------------------------------
@dataclass
class _Kernel:
    op_type: str
    op_name: str            # as in the file name / csv
    occurrence: int
    first_ts: int
    leaves: list            # (io, slot, Leaf)


def _scope_map(order: list[str]) -> dict[str, tuple[int, str]]:
    """``{file-name form: (execution index, full scope name)}`` (first position wins)."""
    out: dict[str, tuple[int, str]] = {}
    for i, scope in enumerate(order):
        out.setdefault(scope.replace("/", "_"), (i, scope))
        out.setdefault(scope, (i, scope))
    return out


def _npy_leaf(path: Path, f: DumpFile, root: Path, settings: KernelSettings) -> Leaf:
    a = np.load(path, allow_pickle=False)
    st = array_stats(a)
    crc = None
    if settings.summary_mode == "md5":   # the rule of msprobe.mindspore.stats.crc32_hex
        c = a if a.dtype.kind in "fiubc" else a.astype(np.float32)
        crc = format(crc32(np.ascontiguousarray(c).view(np.uint8).reshape(-1)) & 0xFFFFFFFF, "08x")
    shape = tuple(int(d) for d in a.shape)
    data_name = path.relative_to(root).as_posix() if settings.task == "tensor" else None
    return Leaf(io=f.io, path=(f.slot,), leaf_kind=S.LEAF_TENSOR, type=TENSOR_TYPE, dtype=f.dtype, shape=shape,
                numel=int(a.size), max=st.max, min=st.min, mean=st.mean, norm=st.norm, max_finite=st.max_finite,
                min_finite=st.min_finite, crc32=crc, has_nan=st.has_nan, has_inf=st.has_inf, data_name=data_name)


def _group(items: list[tuple[str, str, str, int, int, Leaf]]) -> list[_Kernel]:
    """Kernels from ``(op_type, op_name, io, slot, timestamp, leaf)``: the k-th file (by
    time) of a kernel's (io, slot) belongs to its k-th execution."""
    by_slot: dict[tuple, list] = defaultdict(list)
    for op_type, op_name, io, slot, ts, leaf in items:
        by_slot[(op_type, op_name, io, slot)].append((ts, leaf))
    kernels: dict[tuple, _Kernel] = {}
    for (op_type, op_name, io, slot), entries in by_slot.items():
        entries.sort(key=lambda e: e[0])
        for k, (ts, leaf) in enumerate(entries):
            kern = kernels.get((op_type, op_name, k))
            if kern is None:
                kern = kernels[(op_type, op_name, k)] = _Kernel(op_type, op_name, k, ts, [])
            kern.first_ts = min(kern.first_ts, ts)
            kern.leaves.append((io, slot, leaf))
    return list(kernels.values())


def _direction(scope: str, op_type: str) -> str:
    return "backward" if op_type != PARAMETER and scope.startswith(GRADIENTS_PREFIX) else "forward"


def _iteration_calls(root: Path, it: IterationDir, scopes: dict, settings: KernelSettings,
                     modes: DataMode, skipped: list, exclude: frozenset = frozenset()) -> list[Call]:
    items = []
    csv_file = it.path / STATISTIC_CSV
    if csv_file.is_file() and str(csv_file) not in exclude:
        for r in read_statistic_csv(csv_file):
            leaf = Leaf(io=r.io, path=(r.slot,), leaf_kind=S.LEAF_TENSOR, type=TENSOR_TYPE, dtype=r.dtype,
                        shape=r.shape, numel=r.numel, max=r.max, min=r.min, mean=r.mean, norm=r.norm,
                        has_nan=r.has_nan, has_inf=r.has_inf)
            items.append((r.op_type, r.op_name, r.io, r.slot, r.timestamp or 0, leaf))
    else:
        for entry in sorted(os.scandir(it.path), key=lambda e: e.name):
            f = parse_file_name(entry.name)
            if f is None or entry.path in exclude or not entry.is_file():
                continue
            try:
                leaf = _npy_leaf(Path(entry.path), f, root, settings)
            except Exception as exc:   # noqa: BLE001 - an unreadable file (I/O, format, dtype numpy lacks) is skipped
                skipped.append(f"{entry.path}: {type(exc).__name__}: {exc}")
                continue
            items.append((f.op_type, f.op_name, f.io, f.slot, f.timestamp, leaf))
    keyed = []
    for kern in _group(items):
        is_param = kern.op_type == PARAMETER
        index, scope = (None, kern.op_name) if is_param else scopes.get(kern.op_name, (None, kern.op_name))
        if _direction(scope, kern.op_type) not in modes.directions:
            continue
        ordered = [leaf for _io, _slot, leaf in sorted(kern.leaves, key=lambda x: (x[0] != "input", x[1]))]
        if is_param:   # a parameter's value: io "parameters", keyed by its name (a graph input)
            leaves = [leaf.replace(io=PARAMETERS, path=(kern.op_name,) if i == 0 else (kern.op_name, i))
                      for i, leaf in enumerate(ordered)] if modes.allows_parameters() else []
        else:
            leaves = [leaf for leaf in ordered if leaf.io in modes.sides]
        if not leaves:
            continue
        if is_param:
            name, parent = f"{PARAMETER}.{it.graph}.{scope}.{kern.occurrence}", None
            key = (2, 0, scope, kern.occurrence)
        else:
            name = f"Kernel.{it.graph}.{scope}.{kern.occurrence}"
            parent = scope.rsplit("/", 1)[0] if "/" in scope else None
            key = (0, index, "", kern.occurrence) if index is not None else (1, kern.first_ts, scope, kern.occurrence)
        keys = tuple(io for io in ("input", "output", PARAMETERS) if any(leaf.io == io for leaf in leaves))
        keyed.append((key, Call(step=it.iteration, kind=KERNEL, name=name, api_type=kern.op_type, parent=parent,
                                keys=keys, leaves=tuple(leaves))))
    keyed.sort(key=lambda kc: kc[0])
    return [call for _, call in keyed]


def kernel_calls(dump_path: Union[str, os.PathLike], settings: KernelSettings,
                 skipped: Optional[list] = None, dirs: Optional[list[IterationDir]] = None,
                 exclude: frozenset = frozenset()) -> Iterator[tuple[IterationDir, list[Call]]]:
    """The kernel rows of every iteration directory below ``dump_path`` (see module
    docstring), one directory at a time by rank, iteration, net and graph, ranks not in
    ``settings.ranks`` left out.

    Args:
        dump_path: MindSpore's dump ``path`` (holding ``rank_{id}/``).
        settings: what to read (:class:`KernelSettings`).
        skipped: a list that receives ``"path: reason"`` for each unreadable ``.npy`` file.
        dirs: read only these iteration directories (None: all).
        exclude: paths (``str``) of files not to read: those an earlier run left in the
            iteration directories (:func:`dump_files`).
    Raises:
        ValueError: a malformed statistic.csv (:func:`read_statistic_csv`).
    """
    root = Path(dump_path).absolute()
    modes = DataMode.from_config(settings.data_mode, field="data_mode")
    scopes: dict[tuple[int, int], dict] = {}
    for it in sorted(iteration_dirs(root) if dirs is None else dirs,
                     key=lambda d: (d.rank, d.iteration, d.net, d.graph)):
        if settings.ranks and it.rank not in settings.ranks:
            continue
        if (it.rank, it.graph) not in scopes:
            scopes[(it.rank, it.graph)] = _scope_map(execution_order(root, it.rank, it.graph))
        yield it, _iteration_calls(root, it, scopes[(it.rank, it.graph)], settings, modes,
                                   skipped if skipped is not None else [], exclude)


def dump_files(dump_path: Union[str, os.PathLike]) -> frozenset:
    """Paths (``str``, absolute) of the tensor files and statistic.csv files in every
    iteration directory below ``dump_path`` now."""
    found = []
    for it in iteration_dirs(Path(dump_path).absolute()):
        found += [e.path for e in os.scandir(it.path)
                  if e.name == STATISTIC_CSV or parse_file_name(e.name) is not None]
    return frozenset(found)


class KernelDumpReader:
    """Reads a kernel dump into the event log as MindSpore writes it: each :meth:`read`
    appends the iteration directories not read before (with ``final=False`` only those
    MindSpore has finished: every one but the newest of each rank, net and graph), then
    flushes, so the log answers queries while training runs. :meth:`close` reads the rest
    and closes the log files. Rows and markers as in the module docstring.

    Args:
        dump_path: MindSpore's dump ``path``.
        settings: what to read; None = :func:`read_settings` (what the recording run stored).
        log_path: write the log under ``{log_path}/.msprobe/log/`` instead (``data_name``
            stays relative to ``dump_path``): ``msprobe compare`` reads a kernel dump
            without a log this way, leaving it untouched.
        new_files_only: leave out the files already in the iteration directories now (those
            of an earlier run into the same dump path: MindSpore writes the next run's files
            beside them, in the same ``{iteration}`` directories); a warning says how many.
    """

    def __init__(self, dump_path: Union[str, os.PathLike], settings: Optional[KernelSettings] = None, *,
                 log_path: Optional[Union[str, os.PathLike]] = None, new_files_only: bool = False) -> None:
        self.root = Path(dump_path).absolute()
        self.settings = settings if settings is not None else read_settings(dump_path)
        self.log_path = self.root if log_path is None else Path(log_path)
        self._exclude = dump_files(self.root) if new_files_only else frozenset()
        if self._exclude:
            logger.warning("msprobe: %s holds %d kernel dump files of an earlier run; they are left out of this "
                           "run's log (use a new dump_path per run)", self.root, len(self._exclude))
        self.report = IngestReport()
        self._writers: dict = {}
        self._open_step: dict[int, int] = {}
        self._done: set[Path] = set()
        self._closed = False

    def read(self, final: bool = False) -> None:
        """Append the iteration directories not read yet (``final=False``: finished ones only).

        Raises:
            ValueError: a malformed statistic.csv.
            store.errors.StoreWriteError: the log could not be written.
        """
        from store.log_writer import LogWriter

        if self._closed:
            return
        present = [d for d in iteration_dirs(self.root) if not self._exclude or self._has_new_files(d)]
        todo = [d for d in present if d.path not in self._done]
        if not final:
            newest: dict[tuple, int] = {}
            for d in present:
                key = (d.rank, d.net, d.graph)
                newest[key] = max(newest.get(key, -1), d.iteration)
            todo = [d for d in todo if d.iteration < newest[(d.rank, d.net, d.graph)]]
        n_skipped = len(self.report.skipped)
        for it, calls in kernel_calls(self.root, self.settings, self.report.skipped, dirs=todo,
                                      exclude=self._exclude):
            self._done.add(it.path)
            writer = self._writers.get(it.rank)
            if writer is None:
                writer = self._writers[it.rank] = LogWriter(self.log_path, it.rank, flush_rows=4096,
                                                            flush_interval_s=float("inf"))
                writer.append_marker(Marker(step=it.iteration, kind=S.MARKER_START, meta=self._meta(it.rank)))
            elif self._open_step[it.rank] != it.iteration:
                self._end_step(it.rank)
            self._open_step[it.rank] = it.iteration
            for call in calls:
                writer.append(call)
                self.report.tensors += len(call.leaves)
            self.report.calls += len(calls)
        self._done.update(d.path for d in todo)
        if final:
            for rank in list(self._open_step):
                self._end_step(rank)
        for writer in self._writers.values():
            writer.flush()
        for item in self.report.skipped[n_skipped:]:
            logger.warning("msprobe: kernel dump file not read: %s", item)

    def close(self) -> IngestReport:
        """Read what is left (:meth:`read` with ``final=True``), close the log files
        (idempotent) and return the :class:`IngestReport`."""
        if not self._closed:
            try:
                self.read(final=True)
            finally:
                self._closed = True
                for writer in self._writers.values():
                    writer.close()
        return self.report

    def _has_new_files(self, it: IterationDir) -> bool:
        try:
            return any(e.path not in self._exclude for e in os.scandir(it.path)
                       if e.name == STATISTIC_CSV or parse_file_name(e.name) is not None)
        except OSError:
            return False

    def _meta(self, rank: int) -> dict:
        return {"task": self.settings.task, "level": "L2", "framework": "mindspore",
                "dump_data_dir": str(self.root), "rank_dir": f"rank_{rank}", "extra_info": False}

    def _end_step(self, rank: int) -> None:
        step = self._open_step.pop(rank)
        self._writers[rank].append_marker(Marker(step=step, kind=S.MARKER_STEP_END, meta=self._meta(rank)))
        self.report.steps.setdefault(rank, []).append(step)


def ingest_kernel_dump(dump_path: Union[str, os.PathLike], settings: Optional[KernelSettings] = None, *,
                       log_path: Optional[Union[str, os.PathLike]] = None) -> IngestReport:
    """Read the whole kernel dump below ``dump_path`` into the event log under
    ``{dump_path}/.msprobe/log/`` (one log file per rank; module docstring for the rows):
    :class:`KernelDumpReader` (same arguments) closed at once.

    Returns:
        An :class:`IngestReport`.
    Raises:
        ValueError: a malformed statistic.csv.
        store.errors.StoreWriteError: the log could not be written.
    """
    return KernelDumpReader(dump_path, settings, log_path=log_path).close()


def ingest_if_missing(dump_path: Union[str, os.PathLike]) -> Optional[IngestReport]:
    """``msprobe export``'s step for a kernel dump: when ``dump_path`` holds MindSpore's
    kernel dump and no event log yet (a run that ended before ``close()``, or a kernel dump
    written without msprobe), read it in with :func:`ingest_kernel_dump`; otherwise do
    nothing and return None.

    The log is written in a temporary directory beside it and its files are moved into
    ``{dump_path}/.msprobe/log/`` only once the whole dump was read: a read that fails
    half way (a malformed statistic.csv, a full disk) leaves no partial log that a later
    ``export`` would take as the whole recording.

    Raises:
        ValueError: a malformed statistic.csv.
        store.errors.StoreWriteError: the log could not be written.
    """
    import shutil
    import tempfile

    from store import schema as S
    from store.errors import LogNotFoundError
    from store.log_reader import find_log_files

    from msprobe.kernel_dump.layout import is_kernel_dump

    if not is_kernel_dump(dump_path):
        return None
    try:
        find_log_files(dump_path)
        return None
    except LogNotFoundError:
        pass
    store_dir = Path(dump_path) / S.STORE_DIR
    store_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="ingest-", dir=store_dir))
    try:
        report = ingest_kernel_dump(dump_path, log_path=staging)
        staged = staging / S.STORE_DIR / S.LOG_DIR
        if staged.is_dir():
            log_dir = store_dir / S.LOG_DIR
            log_dir.mkdir(parents=True, exist_ok=True)
            for f in sorted(staged.iterdir()):
                os.replace(f, log_dir / f.name)
        return report
    finally:
        shutil.rmtree(staging, ignore_errors=True)
