"""Outputs in OUT: summary.json, tensors/calls/alignment as CSV and Parquet, report.html."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Union

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

__all__ = ["write_outputs", "EarlyTables", "TableSink", "console_summary", "is_compare_output", "query_outputs"]

TABLES = ("tensors", "calls", "alignment")


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def _table_sql(result, name: str, opts) -> str:
    """The query giving output table ``name`` (cut at each rank's first origin with
    ``--first-only``)."""
    if opts.first_only and name in ("calls", "tensors", "alignment"):
        limits = {r["rank"]: (r["first_origin"]["step"], r["first_origin"]["name"])
                  for r in result.summary["ranks"] if r["first_origin"]}
        if limits:
            cond = " OR ".join(
                f"(rank = {rank} AND (step < {s} OR (step = {s} AND ord <= (SELECT ord FROM calls WHERE rank = {rank} "
                f"AND step = {s} AND t_name = '{n.replace(chr(39), chr(39) * 2)}'))))" for rank, (s, n) in limits.items())
            others = ", ".join(str(r) for r in limits)
            return f"SELECT * FROM {name} WHERE {cond} OR rank NOT IN ({others})"
    return f"SELECT * FROM {name}"


def _table(result, name: str, opts) -> pa.Table:
    sql = _table_sql(result, name, opts)
    held = getattr(result, "arrow", {}).get(name)
    if held is not None and sql == f"SELECT * FROM {name}":
        return held
    rel = result.con.sql(sql)
    return rel.to_arrow_table()


def _csv_safe(table: pa.Table) -> pa.Table:
    cols = []
    for col in table.columns:
        if pa.types.is_list(col.type) or pa.types.is_struct(col.type):
            col = pa.array([None if v is None else json.dumps(v) for v in col.to_pylist()], pa.string())
        cols.append(col)
    return pa.table(cols, names=table.column_names)


class EarlyTables:
    """Writes a table (the CSV/Parquet formats of ``opts``) on a helper thread as soon as
    the engine has it final (``alignment`` after the alignment, ``tensors`` after the leaf
    metrics), while the later stages still run; :func:`write_outputs`
    then moves the files into place (they are written under a hidden temporary name, so
    a comparison that fails later leaves no new table beside an older summary.json).
    Nothing is written early with ``first_only`` (the cut needs the summary).

    Args:
        out: the OUT directory (created on the first table).
        opts: :class:`msprobe.compare.options.CompareOptions`.
    Use: pass the object as ``on_table`` to :func:`msprobe.compare.engine.run_compare`,
    then as ``early`` to :func:`write_outputs`; :meth:`discard` in a ``finally``.
    """

    def __init__(self, out: Union[str, os.PathLike], opts) -> None:
        self.out = Path(out)
        self.opts = opts
        self._jobs: dict = {}        # final path -> (temporary path, future)

    def __call__(self, name: str, table) -> None:
        """Engine callback: table ``name`` (one of :data:`TABLES`) is final; start writing it.
        ``table``: a ``pyarrow.Table``, or a function returning one (called only when written)."""
        from concurrent.futures import ThreadPoolExecutor

        formats = [f for f in ("parquet", "csv") if f in self.opts.formats]
        if self.opts.first_only or name not in TABLES or not formats:
            return
        if callable(table):
            table = table()
        self.out.mkdir(parents=True, exist_ok=True)
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="msprobe-compare-early")
        for fmt in formats:
            tmp = self.out / f".{name}.{fmt}.tmp"
            if fmt == "parquet":
                job = pool.submit(pq.write_table, table, tmp)
            else:
                job = pool.submit(lambda t=table, p=tmp: pacsv.write_csv(_csv_safe(t), p))
            self._jobs[self.out / f"{name}.{fmt}"] = (tmp, job)
        pool.shutdown(wait=False)

    def pending(self, path: Path) -> bool:
        """True when ``path`` is being written early."""
        return Path(path) in self._jobs

    def finish(self, path: Path) -> bool:
        """Wait for the early file that becomes ``path`` and move it there; False when
        ``path`` was not written early."""
        tmp, job = self._jobs.pop(Path(path), (None, None))
        if job is None:
            return False
        job.result()
        os.replace(tmp, path)
        return True

    def discard(self) -> None:
        """Wait for and remove early files not moved into place (a failed comparison)."""
        for tmp, job in self._jobs.values():
            try:
                job.result()
            except Exception:  # noqa: BLE001 - the comparison's own error is what the caller sees
                pass
            tmp.unlink(missing_ok=True)
        self._jobs.clear()


class TableSink:
    """The tables ``tensors``, ``calls`` and ``alignment`` of a comparison made one step at
    a time (:mod:`msprobe.compare.stepwise`), appended step after step to their Parquet
    file (:class:`pyarrow.parquet.ParquetWriter`, one row group or more per step) and, with
    format ``csv``, their CSV file (:class:`pyarrow.csv.CSVWriter`, one header): the files
    :func:`write_outputs` would write, without the run's tables in memory.

    The files are written under hidden temporary names in ``out`` and moved into place by
    :meth:`finish` (called by :func:`write_outputs`), so a comparison that fails leaves no
    new table beside an older summary.json. The Parquet files back the result's DuckDB
    views ``tensors``, ``calls``, ``alignment`` (which the report and the xlsx workbook
    read): without format ``parquet`` or without ``out`` they go to a temporary directory,
    removed with this object. With ``out`` and only format ``summary`` nothing is written
    (no output needs a table; the result has no such views).

    Args:
        out: the OUT directory (created), or None.
        opts: :class:`msprobe.compare.options.CompareOptions` (its ``formats``).
        keep: False: without ``out`` nothing is written either (no result tables wanted).
    """

    def __init__(self, out: "Union[str, os.PathLike, None]", opts, keep: bool = True) -> None:
        import shutil
        import tempfile
        import weakref

        self.out = Path(out) if out is not None else None
        #: whether the tables are written at all
        self.kept = keep if self.out is None else bool({"csv", "parquet", "html", "xlsx"} & set(opts.formats))
        keep = self.out is not None and "parquet" in opts.formats     # in OUT, else in a temporary directory
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
        self._spill = None if keep or not self.kept else tempfile.mkdtemp(prefix="msprobe-compare-")
        if self._spill is not None:
            weakref.finalize(self, shutil.rmtree, self._spill, True)
        self.parquet = {name: (self.out / f".{name}.parquet.tmp" if keep else Path(self._spill) / f"{name}.parquet")
                        for name in TABLES} if self.kept else {}
        self.csv = {name: self.out / f".{name}.csv.tmp" for name in TABLES} \
            if self.out is not None and "csv" in opts.formats else {}
        self._final = {name: self.out / f"{name}.parquet" for name in TABLES} if keep else {}
        self._writers: dict = {}
        self._schemas: dict = {}

    def append(self, name: str, table: pa.Table) -> None:
        """Append the rows of ``table`` (one step's rows of table ``name``); the first call
        of a table fixes its schema, later tables are cast to it.

        Raises:
            pyarrow.ArrowInvalid: a later step's table cannot be cast to the first schema."""
        if not self.kept:
            return
        schema = self._schemas.setdefault(name, table.schema)
        if not table.schema.equals(schema):
            table = table.cast(schema)
        if name not in self._writers:
            writers = [pq.ParquetWriter(self.parquet[name], schema)]
            if name in self.csv:
                writers.append(pacsv.CSVWriter(self.csv[name], _csv_safe(table.slice(0, 0)).schema))
            self._writers[name] = writers
        parquet, *csv = self._writers[name]
        parquet.write_table(table)
        for writer in csv:
            writer.write_table(_csv_safe(table))

    def close(self) -> None:
        """Close the writers (the files are complete)."""
        for writers in self._writers.values():
            for writer in writers:
                writer.close()
        self._writers.clear()

    def views(self, con) -> None:
        """(Re)define views ``tensors``, ``calls``, ``alignment`` on the DuckDB connection
        ``con`` over the Parquet files where they now are (none when nothing is kept)."""
        for name in TABLES if self.kept else ():
            path = self._final.get(name) if self._final.get(name, Path()).is_file() else self.parquet[name]
            con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM read_parquet('"
                        + str(path).replace("'", "''") + "')")

    def pending(self, path: Path) -> bool:
        """True when ``path`` (a table file in OUT) is written by this sink."""
        return Path(path) in set(self._final.values()) | {self.out / f"{n}.csv" for n in self.csv}

    def finish(self, con=None) -> list[Path]:
        """Move the files into place in OUT (after :meth:`close`) and, with ``con``, point
        its views at them; returns the files now in OUT."""
        moved = []
        for name in TABLES if self.kept else ():
            for tmp, final in ((self.parquet[name], self._final.get(name)),
                               (self.csv.get(name), self.out / f"{name}.csv" if name in self.csv else None)):
                if final is not None and tmp is not None and tmp.is_file():
                    os.replace(tmp, final)
                    moved.append(final)
        if con is not None:
            self.views(con)
        return moved

    def discard(self) -> None:
        """Close the writers and remove the files not moved into place (a failed comparison)."""
        try:
            self.close()
        finally:
            for path in list(self.csv.values()) + ([] if not self._final else list(self.parquet.values())):
                path.unlink(missing_ok=True)


def write_outputs(result, out: Union[str, os.PathLike], opts, early: "EarlyTables | None" = None) -> list[Path]:
    """Write the selected formats into ``out`` (created); returns the files written.
    ``early``: tables already being written by an :class:`EarlyTables` are only moved into place.

    Raises:
        CompareInputError: ``xlsx`` requested without openpyxl installed, or over
            Excel's row limit (:mod:`msprobe.compare.xlsx`).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    path = out / "summary.json"
    tmp = out / ".summary.json.tmp"
    tmp.write_text(json.dumps(_jsonable(result.summary), indent=1, allow_nan=False))
    os.replace(tmp, path)
    written.append(path)
    if "csv" in opts.formats or "parquet" in opts.formats:
        from concurrent.futures import ThreadPoolExecutor

        # the writers release the GIL: the three tables' files are written in parallel
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="msprobe-compare-out") as pool:
            jobs = []
            sink = getattr(result, "sink", None)
            if sink is not None:        # written step by step: moved into place only
                sink.finish(result.con)
            for name in TABLES:
                todo = [fmt for fmt in ("parquet", "csv") if fmt in opts.formats
                        and not (early is not None and early.pending(out / f"{name}.{fmt}"))
                        and not (sink is not None and sink.pending(out / f"{name}.{fmt}"))]
                table = _table(result, name, opts) if todo else None
                if "parquet" in todo:
                    jobs.append(pool.submit(pq.write_table, table, out / f"{name}.parquet"))
                if "csv" in todo:
                    jobs.append(pool.submit(pacsv.write_csv, _csv_safe(table), out / f"{name}.csv"))
                written.extend(out / f"{name}.{fmt}" for fmt in ("parquet", "csv") if fmt in opts.formats)
                del table
            for job in jobs:
                job.result()
            if early is not None:
                for name in TABLES:
                    for fmt in ("parquet", "csv"):
                        early.finish(out / f"{name}.{fmt}")
    if "html" in opts.formats:
        from msprobe.compare.report import write_html

        written.append(write_html(result, out / "report.html", parquet="parquet" in opts.formats))
    if "xlsx" in opts.formats:
        from msprobe.compare.xlsx import write_xlsx

        written.extend(write_xlsx(result, out, result.summary.get("mode", "statistics")))
    return written


def console_summary(summary: dict) -> str:
    """A few lines for the terminal: the verdict and, per rank, the first origin."""
    lines = [f"verdict: {summary['verdict']} (mode {summary.get('mode')})"]
    if summary.get("verdict_of_compared"):
        lines[0] += f"; what was compared is {summary['verdict_of_compared']}"
    for reason in summary.get("incomplete") or ():
        lines.append(f"not compared: {reason}")
    for r in summary["ranks"]:
        c = r["counts"]
        lines.append(f"rank {r['rank']}: pass {c['pass']}, propagated {c['propagated']}, "
                     f"origin {c['origin']}, unpaired {c['unpaired']}")
        for key, label in (("first_origin", "first origin"), ("first_diverged", "first diverged (earlier)")):
            f = r.get(key)
            if f:
                where = f" in {f['module']}" if f.get("module") else ""
                lines.append(f"  {label}: {f['name']} (step {f['step']}, {f['direction']}){where}: {f['reason']}")
                if f.get("stack"):
                    lines.append(f"    at {_frame_line(f['stack'][0])}")
    g = summary.get("global_origin")
    if g and len(summary["ranks"]) > 1:
        lines.append(f"global origin: rank {g['rank']} {g['name']} (step {g['step']}, {g['direction']})")
    for side, names in (summary.get("unmatched") or {}).items():
        if names:
            lines.append(f"unmatched {side} names: {', '.join(names)}")
    for note in summary.get("notes", []):
        lines.append(f"note: {note}")
    return "\n".join(lines)


def _table_files(path: Union[str, os.PathLike]) -> dict:
    """``{table: file}`` of the :data:`TABLES` a compare OUT directory holds, the Parquet
    file where there is one, else the CSV file."""
    p = Path(path)
    out = {}
    for name in TABLES:
        for fmt in ("parquet", "csv"):
            if (p / f"{name}.{fmt}").is_file():
                out[name] = p / f"{name}.{fmt}"
                break
    return out


def is_compare_output(path: Union[str, os.PathLike]) -> bool:
    """True when ``path`` is an OUT directory of ``msprobe compare`` (summary.json and
    tables in Parquet or CSV)."""
    return (Path(path) / "summary.json").is_file() and bool(_table_files(path))


def query_outputs(path: Union[str, os.PathLike], sql: str) -> pa.Table:
    """Run ``sql`` over the tables ``tensors``, ``calls``, ``alignment`` of a compare OUT
    directory (read-only, like :func:`store.query.query`): their Parquet files, or the CSV
    files where a table was written as CSV only (column types as DuckDB's ``read_csv``
    infers them).

    Raises:
        store.errors.QueryError: the SQL is invalid or fails.
    """
    import duckdb

    from store.errors import QueryError

    con = duckdb.connect(":memory:")
    try:
        for name, file in _table_files(path).items():
            reader = "read_parquet" if file.suffix == ".parquet" else "read_csv"
            con.execute(f"CREATE TABLE {name} AS SELECT * FROM {reader}(?)", [str(file)])
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        try:
            rel = con.sql(sql)
            if rel is None:
                return pa.table({})
            return rel.to_arrow_table()
        except duckdb.Error as exc:
            raise QueryError(f"query failed: {exc}") from exc
    finally:
        con.close()


def _frame_line(frame: str) -> str:
    """One stack.json frame (``"File F, line N, in f, \\n code"``, spec 3.5) on one line:
    ``"File F, line N, in f: code"`` (without the code when the source was not found)."""
    head, _, code = frame.partition("\n")
    head = head.rstrip().rstrip(",")
    code = code.strip()
    return f"{head}: {code}" if code else head
