"""Tensor mode: metrics from the saved tensor values.

Values come, per side, from (in this order):

* our log's payload store (``{dump_path}/.msprobe/payload/*.safetensors``, column
  ``payload``), decoded with numpy only (bfloat16 widened to float32 exactly);
* a tensor file named by ``data_name`` in the step's ``dump_tensor_data`` directory:
  ``.npy`` with numpy (read with one ``readinto`` into a buffer each worker reuses pair
  after pair), ``.pt`` with ``torch.load(weights_only=True, mmap=True)`` when torch is
  importable (a ``.pt`` without torch counts as missing);
* a ``data_name`` relative to the dump path itself: MindSpore's kernel dump (level L2),
  whose ``.npy`` files stay in ``rank_{id}/{net}/{graph}/{iteration}/``
  (:mod:`msprobe.kernel_dump.ingest`).

Pairs stream one at a time in execution order (rank, step, ord); at most one pair's
arrays are in memory per worker. A leaf whose data cannot be read on either side gets state
``missing_data`` (its statistics e is kept for reference), never an exception.
"""
from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path
from typing import Optional

import duckdb
import numpy as np
import pyarrow as pa

from msprobe.compare.load import Side
from msprobe.compare.metrics import tensor_metrics

__all__ = ["TensorSource", "apply_tensor_metrics", "has_tensor_data", "numpy_dtype", "TENSOR_COLUMNS",
           "METRIC_COLUMNS", "pending_pairs", "measure_pairs", "metrics_table"]

TENSOR_COLUMNS = ("cosine", "euc_dist", "max_abs_err", "max_rel_err", "one_thousandth_ratio",
                  "five_thousandths_ratio")

_NP = {"float64": np.float64, "double": np.float64, "float32": np.float32, "float": np.float32,
       "float16": np.float16, "half": np.float16, "int64": np.int64, "long": np.int64, "int32": np.int32,
       "int": np.int32, "int16": np.int16, "short": np.int16, "int8": np.int8, "uint8": np.uint8,
       "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64, "bool": np.bool_,
       "complex64": np.complex64, "complex128": np.complex128}


def numpy_dtype(dtype: str):
    """numpy dtype of a torch/MindSpore/numpy dtype spelling, ``"bfloat16"`` for bfloat16.

    >>> numpy_dtype("torch.float32"), numpy_dtype("Float16"), numpy_dtype("torch.bfloat16")
    (<class 'numpy.float32'>, <class 'numpy.float16'>, 'bfloat16')

    Raises:
        ValueError: unknown dtype.
    """
    d = dtype.lower().rsplit(".", 1)[-1]
    if d in ("bfloat16", "bf16"):
        return "bfloat16"
    if d not in _NP:
        raise ValueError(f"dtype: got {dtype!r}; allowed: a float, int, bool or complex dtype")
    return _NP[d]


def _from_bytes(data: bytes, dtype: str, shape) -> np.ndarray:
    nd = numpy_dtype(dtype)
    if nd == "bfloat16":   # upper 16 bits of a float32: exact widening
        raw = np.frombuffer(data, dtype=np.uint16).astype(np.uint32) << 16
        return raw.view(np.float32).reshape(tuple(shape))
    return np.frombuffer(data, dtype=nd).reshape(tuple(shape))


#: the header numpy writes for a plain array: ``{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }``
_NPY_HEADER = re.compile(r"\{'descr': '([<>|=]?[a-zA-Z]\d*)', 'fortran_order': False, "
                         r"'shape': \((\d+(?:, \d+)*,?)?\), \}[ \n]*")


def _read_npy(path: Path, into=None) -> np.ndarray:
    """The array of a ``.npy`` file. ``into(nbytes)`` (optional) gives a reusable uint8
    buffer to read the data into (then the array is a view of it, valid until the next
    read into the same buffer); a version 1.0/2.0 file whose header is the plain one numpy
    writes for a C-order array of a simple dtype takes that path (header parsed with one
    regular expression), anything else ``np.load(allow_pickle=False)``.

    Raises:
        OSError, ValueError: unreadable, truncated or object-dtype file.
    """
    if into is not None:
        with open(path, "rb", buffering=0) as fh:
            head = fh.read(12)
            if len(head) == 12 and head[:6] == b"\x93NUMPY" and head[6] in (1, 2) and head[7] == 0:
                if head[6] == 1:
                    hlen, text = int.from_bytes(head[8:10], "little"), head[10:]
                else:
                    hlen, text = int.from_bytes(head[8:12], "little"), b""
                text += fh.read(hlen - len(text)) if hlen > len(text) else b""
                m = _NPY_HEADER.fullmatch(text[:hlen].decode("latin1")) if len(text) >= hlen else None
                dtype = np.dtype(m.group(1)) if m else None
                if dtype is not None and not dtype.hasobject and dtype.itemsize:
                    shape = tuple(int(x) for x in (m.group(2) or "").split(",") if x.strip())
                    count = math.prod(shape)
                    buf = into(count * dtype.itemsize)
                    view, got = memoryview(buf), 0
                    while got < buf.size:
                        n = fh.readinto(view[got:])
                        if not n:
                            raise ValueError(f"{path}: truncated .npy ({got} of {buf.size} data bytes)")
                        got += n
                    return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)
    return np.load(path, allow_pickle=False)


def _real(a: np.ndarray) -> np.ndarray:
    if np.iscomplexobj(a):
        return np.abs(a)
    if a.dtype == np.bool_:
        return a.astype(np.float64)
    return a


class TensorSource:
    """Reads one side's tensor values (see module docstring).

    Args:
        side: a loaded :class:`~msprobe.compare.load.Side`.
    """

    def __init__(self, side: Side) -> None:
        self.side = side
        self._payloads = None
        self._torch = importlib.util.find_spec("torch") is not None

    def _dirs(self, rank: int, step: int) -> list[Path]:
        d = self.side.data_dirs.get((rank, step))
        if d is not None:
            return [Path(d)]
        root = Path(self.side.path)
        return [root / f"step{step}" / f"rank{rank}" / "dump_tensor_data",
                root / f"step{step}" / "rank" / "dump_tensor_data", root]

    def load(self, rank: int, step: int, payload: Optional[str], data_name: Optional[str],
             into=None) -> Optional[np.ndarray]:
        """The values (numpy, real; complex → modulus) or None when unreadable.

        ``into(nbytes)`` (optional): a reusable uint8 buffer for ``.npy`` data (see
        :func:`_read_npy`); the array returned may then be a view of it."""
        if payload:
            try:
                if self._payloads is None:
                    from store.payload_writer import PayloadReader
                    self._payloads = PayloadReader(self.side.path)
                p = self._payloads.read(payload)
                return _real(_from_bytes(p.data, p.dtype, p.shape))
            except (OSError, ValueError, KeyError, Exception):   # noqa: BLE001 - any damage → missing
                pass
        if not data_name:
            return None
        for d in self._dirs(rank, step):
            f = d / data_name
            if not f.is_file():
                continue
            try:
                if f.suffix == ".npy":
                    return _real(_read_npy(f, into))
                if f.suffix == ".pt" and self._torch:
                    import torch
                    try:     # mapped, not read: the values are paged in as the metrics reach them
                        t = torch.load(f, weights_only=True, map_location="cpu", mmap=True)
                    except RuntimeError:      # legacy (non-zip) format: no mmap
                        t = torch.load(f, weights_only=True, map_location="cpu")
                    if t.dtype == torch.bfloat16:
                        t = t.float()
                    return _real(t.detach().numpy())
            except Exception:   # noqa: BLE001 - unreadable file → missing_data
                return None
        return None


def has_tensor_data(side: Side) -> bool:
    """True if some tensor leaf of ``side`` names a payload or a tensor file."""
    leaves = side.leaves
    if leaves.num_rows == 0:
        return False
    return leaves["payload"].null_count < leaves.num_rows or leaves["data_name"].null_count < leaves.num_rows


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal shape and bytes; compared in growing chunks, so a pair that differs early
    (the usual case) costs a few microseconds, not a pass over both arrays."""
    if a.shape != b.shape or a.dtype.itemsize != b.dtype.itemsize:
        return False
    va = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    vb = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    lo, chunk = 0, 4096
    while lo < va.size:
        hi = min(lo + chunk, va.size)
        if not np.array_equal(va[lo:hi], vb[lo:hi]):
            return False
        lo, chunk = hi, min(chunk * 4, 1 << 20)
    return True


def _identical_metrics(a: np.ndarray) -> dict:
    """Metrics of a pair with equal bytes, without float64 arithmetic: Cosine 1 (None for
    an all-zero or non-finite tensor, as :func:`tensor_metrics` gives), errors 0, ratios 1.
    Scans for a finite non-zero element in growing chunks (stops at the first)."""
    flat = a.reshape(-1)
    float_kind = a.dtype.kind == "f"
    lo, chunk, any_value = 0, 4096, False
    while lo < flat.size and not any_value:
        part = flat[lo:lo + chunk]
        any_value = bool(np.any((part != 0) & np.isfinite(part))) if float_kind else bool(np.any(part))
        lo, chunk = lo + chunk, min(chunk * 4, 1 << 20)
    return {"cosine": 1.0 if any_value else None, "euc_dist": 0.0, "max_abs_err": 0.0, "max_rel_err": 0.0,
            "one_thousandth_ratio": 1.0, "five_thousandths_ratio": 1.0}


_PAIRS_SQL = """
SELECT rank, step, aid, io, arg, t_payload, t_data_name, b_payload, b_data_name, t_dtype, b_dtype,
  call_kind IN ('api_backward', 'module_backward', 'parameters_grad') AS backward, ord
FROM leaf_pairs WHERE state IN ('measured', 'identical') AND t_leaf_kind = 'tensor' AND b_leaf_kind = 'tensor'
ORDER BY rank, step, ord, aid, io, arg
"""

_KEYS = ("rank", "step", "aid", "io", "arg")
METRIC_COLUMNS = _KEYS + ("state", "e") + TENSOR_COLUMNS


def _measure(ts: "TensorSource", bs: "TensorSource", item: tuple, loss_scale: float, spare=None) -> dict:
    """Metrics of one leaf pair (both arrays live only inside this call). ``spare``: a
    queue of :class:`~msprobe.compare.metrics.MetricsWorkspace` to borrow one from (its
    read buffers and float64 blocks serve the whole call)."""
    work = spare.get() if spare is not None else None
    try:
        return _measure_with(ts, bs, item, loss_scale, work)
    finally:
        if work is not None:
            spare.put(work)


def _measure_with(ts: "TensorSource", bs: "TensorSource", item: tuple, loss_scale: float, work) -> dict:
    rank, step, aid, io, arg, tp, tdn, bp, bdn, tdt, bdt, backward = item[:12]
    t_into = b_into = None
    if work is not None:
        t_into, b_into = (lambda n: work.raw("t", n)), (lambda n: work.raw("b", n))
    a = ts.load(rank, step, tp, tdn, t_into)
    b = bs.load(rank, step, bp, bdn, b_into)
    row = dict(zip(_KEYS, (rank, step, aid, io, arg)))
    if a is None or b is None or a.shape != b.shape:
        row.update(state="missing_data" if a is None or b is None else "structural",
                   e=None if a is None or b is None else float("inf"))
        return row
    if backward and loss_scale != 1.0:
        a = a.astype(np.float64) / loss_scale
    if tdt == bdt and a.dtype == b.dtype and _same_bytes(a, b):
        row.update(_identical_metrics(a), state="identical", e=0.0)
    else:
        m = tensor_metrics(a, b, work)
        row.update(m, state="nonfinite" if m["nonfinite"] else "measured")
    return row


def pending_pairs(con: duckdb.DuckDBPyConnection):
    """The tensor leaf pairs of view ``leaf_pairs`` to read (state measured/identical), in
    execution order (rank, step, ord): an iterator of tuples ``(rank, step, aid, io, arg,
    t_payload, t_data_name, b_payload, b_data_name, t_dtype, b_dtype, backward, ord)``,
    read as one Arrow table before the first is yielded, so the caller may run other
    queries on ``con`` while it iterates (a DuckDB result being fetched ends when its
    connection runs another query)."""
    rel = con.sql(_PAIRS_SQL)
    table = rel.to_arrow_table()
    for batch in table.to_batches(max_chunksize=4096):
        yield from zip(*(col.to_pylist() for col in batch.columns))


def measure_pairs(target: Side, baseline: Side, items, loss_scale: float = 1.0, workers: int = 1,
                  sources: Optional[tuple] = None) -> list[dict]:
    """Metrics rows (keys of :data:`METRIC_COLUMNS`) of the pairs ``items`` (from
    :func:`pending_pairs`), in the order given.

    With ``workers`` > 1 the pairs are measured by that many threads (reading files,
    hashing and numpy reductions release the GIL); at most ``workers`` pairs are submitted
    and not yet collected, so at most ``workers`` pairs' arrays are in memory at once, and
    results are collected in submission order: the rows are the same for any ``workers``.

    Args:
        target, baseline: the sides (for :class:`TensorSource`).
        items: iterable of pair tuples.
        loss_scale: target backward values are divided by it.
        workers: number of threads (int ≥ 1).
        sources: reuse ``(TensorSource, TensorSource)`` across calls (payload headers cached).
    """
    import queue

    from msprobe.compare.metrics import MetricsWorkspace

    ts, bs = sources or (TensorSource(target), TensorSource(baseline))
    spare: queue.Queue = queue.Queue()
    for _ in range(workers):          # one set of float64 buffers per worker, reused pair after pair
        spare.put(MetricsWorkspace())
    rows: list[dict] = []
    if workers <= 1:
        for item in items:
            rows.append(_measure(ts, bs, item, loss_scale, spare))
        return rows
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    pending: deque = deque()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="msprobe-compare") as pool:
        for item in items:
            if len(pending) >= workers:
                rows.append(pending.popleft().result())
            pending.append(pool.submit(_measure, ts, bs, item, loss_scale, spare))
        while pending:
            rows.append(pending.popleft().result())
    return rows


def metrics_table(rows: list[dict]) -> pa.Table:
    """Rows of :func:`measure_pairs` as an Arrow table (columns :data:`METRIC_COLUMNS`)."""
    def typed(k: str, v: list):
        if k in ("e",) + TENSOR_COLUMNS:
            return pa.array(v, pa.float64())
        if k in ("rank", "step"):
            return pa.array(v, pa.int32())
        return pa.array(v, pa.int64()) if k == "aid" else pa.array(v, pa.string())
    return pa.table({k: typed(k, [r.get(k) for r in rows]) for k in METRIC_COLUMNS})


def apply_tensor_metrics(con: duckdb.DuckDBPyConnection, target: Side, baseline: Side,
                         loss_scale: float = 1.0, workers: int = 1) -> int:
    """Tensor metrics of every tensor leaf pair of view ``leaf_pairs`` whose state is
    measured/identical, into table ``tensor_metrics`` (keys rank, step, aid, io, arg; then
    ``state``, ``e`` and :data:`TENSOR_COLUMNS`), which
    :func:`msprobe.compare.verdicts.leaf_verdicts_sql` lays over the statistics.

    Both sides' values are read (:class:`TensorSource`); equal dtype and equal bytes →
    ``identical``; otherwise :func:`~msprobe.compare.metrics.tensor_metrics` gives Cosine,
    EucDist, e, MaxAbsErr, MaxRelativeErr, One/Five Thousandth Err Ratio; non-finite
    mismatch → ``nonfinite``; unreadable on either side → ``missing_data``. Target
    backward values are divided by ``loss_scale``. Pairs stream in execution order
    (rank, step, ord) through :func:`measure_pairs` (``workers`` threads, bounded).

    Returns:
        the number of pairs read.
    """
    rows = measure_pairs(target, baseline, pending_pairs(con), loss_scale, workers)
    con.register("tensor_metrics_src", metrics_table(rows))
    con.execute("CREATE OR REPLACE TABLE tensor_metrics AS SELECT * FROM tensor_metrics_src")
    con.unregister("tensor_metrics_src")
    return len(rows)
