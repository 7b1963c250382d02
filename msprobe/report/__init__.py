"""``msprobe report``: one self-contained HTML file that shows a recording.

:func:`write_report` builds it from the SQL views (:mod:`msprobe.report.data`) and draws
it with inline JavaScript (:mod:`msprobe.report.page`): overview and first NaN/Inf per
rank, the model graph of the chosen step (nested modules, call order, a node's values),
step × module heat maps of output and parameter-gradient Norms, the largest movers,
the module tree of the chosen step, the largest values. ``<div id="notices">`` at the
top holds notices about the input. Imports no deep-learning framework.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional, Union

from msprobe.report.data import collect
from msprobe.report.page import render

__all__ = ["write_report"]

_BODY = """<h1 id='title'>msprobe report</h1>
<div id='notices'></div>
<nav><a href='#s-overview'>overview</a><a href='#s-graph'>model graph</a><a href='#s-trends'>trends</a>
<a href='#s-tree'>module tree</a><a href='#s-largest'>largest values</a>
<label>rank <select id='rank'></select></label> <label>step <select id='step'></select></label></nav>
<h2 id='s-overview'>Overview</h2><div id='overview'></div>
<h2 id='s-graph'>Model graph</h2><div id='graph-section'></div>
<h2 id='s-trends'>Trends</h2><div id='trends'></div>
<h2 id='s-tree'>Module tree</h2><div id='tree'></div>
<h2 id='s-largest'>Largest values</h2><div id='largest'></div>"""


def write_report(
    dump_path: Union[str, os.PathLike], out: Union[str, os.PathLike], *,
    progress: Optional[Callable[[str], None]] = None, notices: Optional[list] = None, **limits,
) -> Path:
    """Write the report of the recording under ``dump_path`` to the file ``out``.

    Args:
        dump_path: the dump directory (log under ``.msprobe/log/``).
        out: the HTML file to write (its directory is created).
        progress: called with each part's name as it starts.
        notices: a list that gets one line per part of the log not read as data (also
            shown at the top of the page; :meth:`store.log_reader.LogContents.notices`).
        limits: ``threshold``, ``jump``, ``max_rows``, ``max_steps``, ``max_tree``,
            ``movers``, ``ranks``, ``steps`` of :func:`msprobe.report.data.collect`.
    Returns:
        ``out`` as a Path.
    Raises:
        LogNotFoundError: no log under ``dump_path``.
        ValueError: a bad limit (see :func:`collect`).
    """
    data = collect(dump_path, progress=progress, **limits)
    if notices is not None:
        notices.extend(data["skipped"])
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(render(f"msprobe report: {dump_path}", _BODY, data, "dump.js"), encoding="utf-8")
    os.replace(tmp, out)
    return out
