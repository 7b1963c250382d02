"""Self-contained ``report.html``: per rank, each call's largest e (log scale, inline SVG)
along execution order, coloured by verdict, forward/backward bands, unpaired calls and the
first divergence marked; then the first 50 non-pass calls with module paths and stacks."""
from __future__ import annotations

import html
import math
from pathlib import Path

__all__ = ["write_html"]

COLOURS = {"pass": "#4caf50", "propagated": "#f0b400", "origin": "#d32f2f", "unpaired": "#7e57c2"}
_BACKWARD = ("api_backward", "module_backward", "parameters_grad")


def _svg(calls: list[dict], first: str | None) -> str:
    width, height, pad = 900, 220, 30
    n = max(len(calls), 1)
    es = [c["e"] for c in calls if c["e"] not in (None, 0) and math.isfinite(c["e"])]
    lo = math.log10(min(es)) if es else -12
    hi = math.log10(max(es)) if es else 0
    hi = max(hi, lo + 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    for i, c in enumerate(calls):  # backward band
        if c["kind"] in _BACKWARD:
            x = pad + i * (width - 2 * pad) / n
            parts.append(f'<rect x="{x:.1f}" y="0" width="{(width - 2 * pad) / n + 0.5:.1f}" height="{height}" fill="#eef3fb"/>')
    for i, c in enumerate(calls):
        x = pad + (i + 0.5) * (width - 2 * pad) / n
        e = c["e"]
        if e is None or e == 0:
            y = height - pad
        elif math.isinf(e):
            y = pad / 2
        else:
            y = height - pad - (math.log10(e) - lo) / (hi - lo) * (height - 2 * pad)
        colour = COLOURS.get(c["verdict"], "#999")
        title = html.escape(f"{c['t_name'] or c['b_name']}: {c['verdict']}, e={e}")
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"><title>{title}</title></circle>')
        if first and c["t_name"] == first:
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="{height}" stroke="#d32f2f" stroke-dasharray="4"/>')
    parts.append(f'<text x="2" y="12" font-size="10">e 1e{hi:.0f}</text><text x="2" y="{height - 4}" font-size="10">e ≤ 1e{lo:.0f}</text>')
    parts.append("</svg>")
    return "".join(parts)


def write_html(result, path: Path) -> Path:
    """Write the report to ``path`` (no external resources); returns ``path``."""
    summary = result.summary
    body = [f"<h1>msprobe compare: {html.escape(summary['verdict'])}</h1>",
            "<p>Legend: " + " ".join(f'<span style="color:{c}">● {v}</span>' for v, c in COLOURS.items())
            + ' · shaded: backward · dashed line: first origin</p>']
    for r in summary["ranks"]:
        rank = r["rank"]
        rows = result.con.execute(
            "SELECT t_name, b_name, kind, verdict, e, reason, module, step FROM calls WHERE rank = ? ORDER BY step, ord",
            [rank]).fetchall()
        calls = [dict(zip(("t_name", "b_name", "kind", "verdict", "e", "reason", "module", "step"), row)) for row in rows]
        first = r["first_origin"]["name"] if r["first_origin"] else None
        body.append(f"<h2>rank {rank}</h2><p>{html.escape(str(r['counts']))}</p>")
        for key in ("first_origin", "first_diverged"):
            f = r.get(key)
            if f:
                body.append(f"<p><b>{key.replace('_', ' ')}</b>: {html.escape(f['name'])} "
                            f"({html.escape(str(f['module']))}) — {html.escape(str(f['reason']))}</p>"
                            f"<pre>{html.escape(chr(10).join(f['stack']))}</pre>")
        body.append(_svg(calls, first))
        bad = [c for c in calls if c["verdict"] != "pass"][:50]
        body.append("<table border=1 cellspacing=0><tr><th>step</th><th>target</th><th>baseline</th>"
                    "<th>verdict</th><th>e</th><th>module</th><th>reason</th></tr>")
        for c in bad:
            body.append("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in (
                c["step"], c["t_name"], c["b_name"], c["verdict"], c["e"], c["module"], c["reason"])) + "</tr>")
        body.append("</table>")
    text = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>msprobe compare</title></head><body>"
            + "".join(body) + "</body></html>")
    path.write_text(text, encoding="utf-8")
    return path
