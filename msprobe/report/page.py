"""One self-contained HTML page: the data as JSON in ``<script id="msprobe-data">``, the
style and the drawing code inline (``page.css``, ``page.js``, ``graph.js``, one page script
of this package, and the graph layout library ``vendor/dagre.min.js`` with its licence),
nothing fetched from the network."""
from __future__ import annotations

import html
import json
from importlib import resources
from typing import Any

__all__ = ["render", "DAGRE_VERSION"]

#: The vendored @dagrejs/dagre (npm, MIT licence in ``vendor/dagre.LICENSE``): the layered
#: layout of the model graph (``graph.js``). ``vendor/dagre.min.js`` is the npm tarball's
#: ``dist/dagre.min.js`` without its two trailing comment lines (the pointer to
#: ``dagre.min.js.LEGAL.txt``, whose licence the page carries inline, and the source-map
#: URL, which a page opened from disk would try to fetch); its SHA-256 is
#: :data:`DAGRE_SHA256`.
DAGRE_VERSION = "3.1.4"
DAGRE_SHA256 = "6839d80e8fc3602a1b56274533f4e0b83379915394d022806d0634d1688b26f4"


def _resource(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _script_json(data: Any) -> str:
    """``data`` as JSON that cannot end its ``<script>`` element early (``</`` escaped)."""
    text = json.dumps(data, allow_nan=False, separators=(",", ":"), default=str)
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def render(title: str, body: str, data: Any, script: str) -> str:
    """The page's HTML text.

    Args:
        title: the ``<title>`` (escaped here).
        body: HTML of the ``<body>`` (trusted: written by this package).
        data: JSON-ready value (no NaN/Infinity floats: see :func:`msprobe.report.data.plain`).
        script: file name of the page script in this package (``dump.js``, ``compare.js``),
            which runs after ``page.js`` and reads the data.
    Raises:
        ValueError: ``data`` holds a NaN or infinite float.
    """
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{_resource('page.css')}</style></head><body>"
            f"{body}<div id='tooltip'></div>"
            f"<script type='application/json' id='msprobe-data'>{_script_json(data)}</script>"
            f"<script>/*! @dagrejs/dagre {DAGRE_VERSION}\n{_resource('vendor/dagre.LICENSE')}*/\n"
            f"{_resource('vendor/dagre.min.js')}</script>"
            f"<script>{_resource('page.js')}\n{_resource('graph.js')}\n{_resource(script)}</script></body></html>\n")
