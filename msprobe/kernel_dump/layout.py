"""MindSpore's GRAPH_MODE kernel dump on disk: directories, ``.npy`` file names, execution order.

Layout (MindSpore's end-to-end dump, CPU/GPU and Ascend ms_backend; the MindSpore
tutorial "Using Dump in the Graph Mode")::

    {path}/rank_{rank}/{net_name}/{graph_id}/{iteration}/
        {op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}.{input|output}.{slot}.{format}.{dtype}.npy
        statistic.csv                       # saved_data "statistic" (GPU/Ascend)
    {path}/rank_{rank}/execution_order/ms_execution_order_graph_{graph_id}.csv
    {path}/rank_{rank}/graphs/

``op_name`` is the kernel's full scope name with ``/`` replaced by ``_``
(``Default/network-WithLossCell/_backbone-Net/d1-Dense/MatMul-op0`` →
``Default_network-WithLossCell__backbone-Net_d1-Dense_MatMul-op0``). The execution-order
file holds a header line and then the full scope names, one per line, in the order the
graph's kernels are scheduled. Graph parameters and graph inputs are dumped as
``Parameter.{name}.…output.0…`` files at the end of the iteration, holding the values after
the iteration (after the optimizer's update).

Nothing here imports MindSpore: ``msprobe export`` reads a kernel dump without it.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Union

__all__ = ["DumpFile", "IterationDir", "parse_file_name", "iteration_dirs", "execution_order", "is_kernel_dump",
           "STATISTIC_CSV", "PARAMETER"]

STATISTIC_CSV = "statistic.csv"
PARAMETER = "Parameter"
_RANK_DIR = re.compile(r"^rank_(\d+)$")
_INT = re.compile(r"^\d+$")


@dataclass(frozen=True, slots=True)
class DumpFile:
    """One tensor file of a kernel dump (fields as in the file name, see module docstring).

    Attributes:
        op_type: kernel type (``MatMul``) or ``Parameter``.
        op_name: scope name as in the file name (``/`` replaced by ``_``), or the parameter name.
        task_id, stream_id: MindSpore's ids (strings, as written).
        timestamp: the dump time stamp (int, microseconds).
        io: ``input`` or ``output``.
        slot: the input/output index (int).
        fmt: the device format (``DefaultFormat``...).
        dtype: MindSpore's dtype name (``Float32``, ``Int64``, ``Bool``...).
    """

    op_type: str
    op_name: str
    task_id: str
    stream_id: str
    timestamp: int
    io: str
    slot: int
    fmt: str
    dtype: str


def parse_file_name(name: str) -> Optional[DumpFile]:
    """The fields of a kernel-dump ``.npy`` file name, or None when ``name`` is not one.

    >>> parse_file_name("MatMul.Default_net_MatMul-op0.0.0.17966.input.1.DefaultFormat.Float32.npy").slot
    1
    """
    if not name.endswith(".npy"):
        return None
    parts = name[:-4].rsplit(".", 7)
    if len(parts) != 8:
        return None
    head, task_id, stream_id, timestamp, io, slot, fmt, dtype = parts
    if io not in ("input", "output") or not _INT.match(slot) or not _INT.match(timestamp) or "." not in head:
        return None
    op_type, op_name = head.split(".", 1)
    if not op_type or not op_name:
        return None
    return DumpFile(op_type=op_type, op_name=op_name, task_id=task_id, stream_id=stream_id,
                    timestamp=int(timestamp), io=io, slot=int(slot), fmt=fmt, dtype=dtype)


@dataclass(frozen=True, slots=True)
class IterationDir:
    """One ``rank_{rank}/{net}/{graph}/{iteration}`` directory (``path``)."""

    rank: int
    net: str
    graph: int
    iteration: int
    path: Path


def _int_dirs(parent: Path) -> list[tuple[int, Path]]:
    try:
        entries = sorted(os.scandir(parent), key=lambda e: e.name)
    except OSError:
        return []
    return sorted((int(e.name), Path(e.path)) for e in entries if e.is_dir() and _INT.match(e.name))


def iteration_dirs(dump_path: Union[str, os.PathLike]) -> Iterator[IterationDir]:
    """Every iteration directory below ``dump_path``, by rank, net, graph, iteration."""
    root = Path(dump_path)
    try:
        ranks = sorted((int(m.group(1)), Path(e.path)) for e in os.scandir(root)
                       if e.is_dir() and (m := _RANK_DIR.match(e.name)))
    except OSError:
        return
    for rank, rank_dir in ranks:
        for net in sorted(e.name for e in os.scandir(rank_dir) if e.is_dir()
                          and e.name not in ("execution_order", "graphs", ".dump_metadata")):
            for graph, graph_dir in _int_dirs(rank_dir / net):
                for iteration, it_dir in _int_dirs(graph_dir):
                    yield IterationDir(rank, net, graph, iteration, it_dir)


def is_kernel_dump(dump_path: Union[str, os.PathLike]) -> bool:
    """Whether ``dump_path`` holds at least one iteration directory of a kernel dump."""
    return next(iteration_dirs(dump_path), None) is not None


def execution_order(dump_path: Union[str, os.PathLike], rank: int, graph: int) -> list[str]:
    """The full scope names of graph ``graph``'s kernels in execution order (``[]`` when
    MindSpore wrote no execution-order file for it)."""
    f = Path(dump_path) / f"rank_{rank}" / "execution_order" / f"ms_execution_order_graph_{graph}.csv"
    try:
        lines = f.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    return [line.strip() for line in lines[1:] if line.strip()]
