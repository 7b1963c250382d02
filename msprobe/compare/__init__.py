"""``msprobe compare``: find where two recorded runs start to disagree.

Modules, one job each: :mod:`~msprobe.compare.load` (both sides into Arrow/DuckDB),
:mod:`~msprobe.compare.dumpjson` (streaming upstream dump.json importer),
:mod:`~msprobe.compare.myers` and :mod:`~msprobe.compare.align` (call matching),
:mod:`~msprobe.compare.metrics` (per-leaf metrics), :mod:`~msprobe.compare.verdicts`
(leaf/call verdicts), :mod:`~msprobe.compare.engine` (pipeline, first divergence),
:mod:`~msprobe.compare.outputs` (summary.json, CSV/Parquet, report.html).
"""
from __future__ import annotations

import os
from typing import Optional, Sequence, Union

from msprobe.compare.errors import CompareError, CompareInputError

__all__ = ["compare", "CompareError", "CompareInputError"]


def compare(target: Union[str, os.PathLike], baseline: Union[str, os.PathLike], *,
            out: Optional[Union[str, os.PathLike]] = None, mode: str = "auto", tol="strict",
            loss_scale: float = 1.0, rank=None, step=None, first_only: bool = False,
            formats: Optional[Sequence[str]] = None, mapping=None, rank_map=None, workers: int = 1,
            progress=None, keep_tables: bool = True):
    """Compare two dumps; returns a :class:`msprobe.compare.engine.CompareResult`.

    Args:
        target, baseline: our dump paths, upstream ``step*/rank*`` directories (any
            level) or ``dump.json`` files.
        out: directory for summary.json and the other outputs; None writes nothing.
        mode: ``auto`` (tensor when both sides hold tensor data, else statistics),
            ``md5``, ``statistics`` or ``tensor`` (:mod:`msprobe.compare.tensordata`).
        tol: ``strict``, ``loose``, ``bitwise`` or ``"DTYPE=RTOL,..."``; or a dict.
        loss_scale: target backward values are divided by it.
        rank, step: selections (``"0,2-3"``, an int or a list).
        first_only: stop at each rank's first origin: outputs keep only calls up to it,
            and tensor mode reads tensor pairs only until it is known
            (:mod:`msprobe.compare.firstonly`; counts then cover the calls read).
        formats: subset of summary, csv, parquet, html, xlsx.
        mapping: a mapping YAML path (ours or one of upstream's four formats), a dict, or
            a list of these merged in order (:mod:`msprobe.compare.mapping`).
        rank_map: ``"0:1,1:0"`` or ``{0: 1, 1: 0}``: TARGET rank → BASELINE rank (others
            pair by id; :func:`msprobe.compare.options.parse_rank_map`).
        workers: tensor mode: threads reading and measuring leaf pairs (1-256); at most
            that many pairs are in memory, and the results are the same for any value.
        progress: None or ``f(stage)``, called as each stage ends (``"outputs"`` last
            when ``out`` is given).
        keep_tables: False: a comparison made one step at a time keeps no table for the
            result when ``out`` is None (only ``summary``; ``msprobe compare`` without
            ``-o``); the comparison of every step at once keeps its tables in any case.
    Result attributes: ``.summary``, ``.first`` ({rank: first origin}), ``.tensors``,
    ``.calls``, ``.alignment`` (DuckDB relations), ``.exit_code``. Two of our dump paths
    with several steps are compared one step (or group of steps) at a time
    (:mod:`msprobe.compare.stepwise`): the relations then read the Parquet files written
    step by step (under OUT with format ``parquet``, else in a temporary directory); with
    ``out`` and ``formats=["summary"]`` no table is kept and the relations are absent.
    Raises:
        CompareInputError: bad input (missing path, empty or malformed dump, bad option).
    """
    from msprobe.compare.engine import run_compare
    from msprobe.compare.options import CompareOptions
    from msprobe.compare.outputs import EarlyTables, write_outputs

    opts = CompareOptions.build(mode=mode, tol=tol, loss_scale=loss_scale, rank=rank, step=step,
                                first_only=first_only, formats=formats, mapping=mapping, rank_map=rank_map,
                                workers=workers)
    early = EarlyTables(out, opts) if out is not None else None
    try:
        result = run_compare(target, baseline, opts, on_table=early, progress=progress, out=out,
                             keep_tables=keep_tables)
        if out is not None:
            write_outputs(result, out, opts, early=early)
            if progress is not None:
                progress("outputs")
    finally:
        if early is not None:
            early.discard()
    return result


class _CallableModule(__import__("types").ModuleType):
    """Lets ``msprobe.compare(target, baseline, **options)`` call :func:`compare` while
    ``msprobe.compare`` stays the package (``msprobe.compare.engine`` ...)."""

    def __call__(self, target, baseline, **options):
        return compare(target, baseline, **options)


__import__("sys").modules[__name__].__class__ = _CallableModule
