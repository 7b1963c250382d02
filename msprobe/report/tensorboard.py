"""``msprobe export DUMP_PATH --tensorboard DIR``: the recording's per-step trends as
TensorBoard scalars, so they sit beside the loss curves in the TensorBoard a user runs.

One run directory per rank (``DIR/rank{R}``), one event file each, written with the
``tensorboard`` package's own event writer (``EventFileWriter`` and its ``Summary``
protocol buffers; no TensorFlow, no deep-learning framework). The global step of each
point is the recorded step. Tags:

- ``output_norm/{module}``: the L2 norm of all forward output tensors of the module in
  the step, ``sqrt(sum(Norm^2))`` (the output heat map of ``msprobe report``; a dump
  without module entries, level ``L1``, uses its API calls: ``output_norm/Functional.linear.4``);
- ``grad_norm/{module}``: the same over the gradients of the module's own parameters
  (its ``parameters_grad`` entry);
- ``nonfinite/{module}``: how many of the module's forward output tensors hold NaN or Inf;
- ``nan_tensors/all``, ``inf_tensors/all``: how many tensors of the step (every entry,
  inputs and outputs) hold NaN, Inf;
- ``max_abs/all``: the largest finite ``|Max|``/``|Min|`` over the step's tensors.

``{module}`` is the entry name without ``.forward.N``/``.parameters_grad``
(``Module.layers.0.linear1.Linear``). A NaN or infinite Norm is written as such.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Iterable, Optional, Union

from msprobe.report.data import _API_KEY, _MODULE_KEY
from store.query import connect

__all__ = ["write_tensorboard"]


def _scalar_event(tag: str, value: float, step: int):
    from tensorboard.compat.proto import event_pb2, summary_pb2

    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=float(value))])
    return event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary)


def write_tensorboard(dump_path: Union[str, os.PathLike], out: Union[str, os.PathLike], *,
                      ranks: Optional[Iterable[int]] = None, steps: Optional[Iterable[int]] = None) -> dict:
    """Write the scalars of the recording under ``dump_path`` into ``out/rank{R}/``.

    Args:
        dump_path: the dump directory (log under ``.msprobe/log/``).
        out: the TensorBoard log directory (created).
        ranks: ranks to write (None: all); other ranks' files are not read.
        steps: steps to write (None: all).
    Returns:
        ``{rank: number of scalar points written}``.
    Raises:
        LogNotFoundError: no log under ``dump_path``.
        ImportError: the ``tensorboard`` package is not installed (``pip install tensorboard``
            or ``pip install msprobe[tensorboard]``).
    """
    try:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError as exc:   # pragma: no cover - the test environment has it
        raise ImportError("msprobe export --tensorboard needs the 'tensorboard' package "
                          "(pip install tensorboard)") from exc
    con = connect(dump_path, ranks=ranks, steps=steps)
    written: dict[int, int] = {}
    try:
        has_modules = bool(con.execute("SELECT 1 FROM calls WHERE kind = 'module_forward' LIMIT 1").fetchall())
        key = _MODULE_KEY if has_modules else _API_KEY
        forward = ("api_type IN ('Module', 'Cell')" if has_modules else "api_type NOT IN ('Module', 'Cell')") + \
            " AND direction = 'forward' AND io = 'output'"
        queries = [
            f"""SELECT 'output_norm/' || {key} AS tag, step, sqrt(sum(norm * norm)) AS value, min(seq) AS seq
                FROM tensors WHERE rank = ? AND {forward} AND norm IS NOT NULL GROUP BY ALL""",
            f"""SELECT 'grad_norm/' || {_MODULE_KEY} AS tag, step, sqrt(sum(norm * norm)) AS value, min(seq) AS seq
                FROM tensors WHERE rank = ? AND name LIKE '%.parameters_grad' AND norm IS NOT NULL GROUP BY ALL""",
            f"""SELECT 'nonfinite/' || {key} AS tag, step, count(*) FILTER (WHERE has_nan OR has_inf) AS value,
                       min(seq) AS seq
                FROM tensors WHERE rank = ? AND {forward} GROUP BY ALL""",
            """SELECT 'nan_tensors/all' AS tag, step, count(*) FILTER (WHERE has_nan) AS value, 0 AS seq
               FROM tensors WHERE rank = ? GROUP BY ALL""",
            """SELECT 'inf_tensors/all' AS tag, step, count(*) FILTER (WHERE has_inf) AS value, 0 AS seq
               FROM tensors WHERE rank = ? GROUP BY ALL""",
            """SELECT 'max_abs/all' AS tag, step, max(greatest(abs(max), abs(min))) AS value, 0 AS seq
               FROM tensors WHERE rank = ? AND isfinite(max) AND isfinite(min) GROUP BY ALL""",
        ]
        ranks = [r for (r,) in con.execute("SELECT DISTINCT rank FROM calls ORDER BY rank").fetchall()]
        out = Path(out)
        for rank in ranks:
            rows = []
            for sql in queries:
                rows += con.execute(sql, [rank]).fetchall()
            rows.sort(key=lambda r: (r[1], r[3], r[0]))    # by step, then execution order
            writer = EventFileWriter(str(out / f"rank{rank}"))
            try:
                for tag, step, value, _seq in rows:
                    if value is not None:
                        writer.add_event(_scalar_event(tag, value, step))
            finally:
                writer.close()
            written[rank] = sum(1 for r in rows if r[2] is not None)
    finally:
        con.close()
    return written
