#!/usr/bin/env python
"""Regenerate the screenshots of docs/report.md (PNG files in docs/img/).

Usage: ``python tools/report_screenshots.py [--out docs/img] [--work DIR] [--steps 8]``

Records four runs (each in its own process, ``--steps`` steps, into
``WORK/KIND/dump_path``):

- ``example``: ``examples/char_lm.py`` as it ships;
- ``nan``: the NaN hunt: a tiny Llama (``transformers.LlamaForCausalLM``, 2 decoder
  layers, hidden size 64) trained on the example's text with ``rms_norm_eps=0`` and
  ``pad_token_id`` set; the batch of step :data:`NAN_STEP` is the first to hold padding
  (the last 4 tokens of its first sequence). The padding token's embedding row is zero,
  so layer 0's ``input_layernorm`` takes ``rsqrt(0) = inf`` there, the product
  ``0 * inf`` is NaN and the loss is NaN from that step on (:func:`record_llama_nan`);
- ``gelu``: the example with the encoder layers' activation GELU (``F.gelu(x)``, exact
  erf form);
- ``gelu_tanh``: the same with GELU's tanh approximation (``F.gelu(x, approximate="tanh")``):
  a GELU variant changed between two runs.

The GELU replacement is installed before the debugger is created, so the recorder wraps
it like the original (the entries keep the name ``Functional.gelu.N``).
It writes ``msprobe report ./dump_path`` pages of ``example`` and ``nan`` (in their folders,
so the pages are titled ``./dump_path``), runs ``msprobe compare`` of ``gelu_tanh`` (target)
against ``gelu`` (baseline), opens the pages in headless
Chromium (``tests/report/chromium_page.py``, the DevTools helper of the browser tests;
needs the ``chromium`` binary and ``websocket-client``), clicks and hovers where a
picture needs it, and writes each picture clipped to its section. In the pages, the
checkout's path in stack frames is replaced by :data:`CHECKOUT` and the installed packages'
directory by :data:`SITE_PACKAGES` before they are opened.
PNGs are re-encoded with Pillow and reduced to a 256-colour palette when larger than
:data:`MAX_BYTES`.
The dumps and pages stay in ``--work`` (a new temporary directory by default).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "report"))

#: The step whose batch is the first with padding: the ``nan`` run's loss is NaN from it on.
NAN_STEP = 4
#: A picture larger than this (bytes) is reduced to a 256-colour palette.
MAX_BYTES = 60_000
WIDTH, HEIGHT = 1400, 900
#: how the pictures write the checkout's path in stack frames (as docs/query.md does)
CHECKOUT = "/path/to/msprobe/"
#: how the pictures write the installed packages' directory (``purelib``)
SITE_PACKAGES = "/path/to/site-packages/"


def record_llama_nan(steps: int, dump_path: str) -> list[float]:
    """Train the NaN hunt's tiny Llama ``steps`` AdamW steps with recording (default config:
    statistics, level mix) into ``dump_path``; returns the loss of each step (NaN from
    :data:`NAN_STEP` on). Batches: 8 windows of 32 characters of the example's text
    (:func:`char_lm.make_batches`); token ids are characters, the padding id one past them."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import char_lm
    from msprobe.pytorch import PrecisionDebugger

    char_lm.seed_everything()
    text = char_lm.load_text()
    vocab = char_lm.make_vocab(text)
    batches = char_lm.make_batches(text, vocab, steps, batch_size=8, seq_len=32)
    pad = len(vocab)
    config = LlamaConfig(vocab_size=pad + 1, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         rms_norm_eps=0.0, pad_token_id=pad, bos_token_id=None, eos_token_id=None, use_cache=False)
    model = LlamaForCausalLM(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    with PrecisionDebugger(dump_path=dump_path) as debugger:
        for step, (x, _) in enumerate(batches):
            if step == NAN_STEP:
                x = x.clone()
                x[0, -4:] = pad
            labels = x.masked_fill(x == pad, -100)
            debugger.start(model)
            loss = model(input_ids=x, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            debugger.stop()
            debugger.step()
            losses.append(loss.item())
    return losses


def record(kind: str, dump_path: str, steps: int) -> None:
    """Record the run ``kind`` (``nan``, ``gelu``, ``gelu_tanh``) of ``steps`` steps into
    ``dump_path``."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT / "examples"))
    if kind == "nan":
        record_llama_nan(steps, dump_path)
        return
    import char_lm

    layer_init = torch.nn.TransformerEncoderLayer.__init__
    approximate = {"gelu": "none", "gelu_tanh": "tanh"}[kind]

    def gelu(x):   # F.gelu looked up at each call: the recorder's wrapper records it
        return F.gelu(x, approximate=approximate)

    def init(self, *args, **kwargs):
        kwargs["activation"] = gelu
        layer_init(self, *args, **kwargs)

    torch.nn.TransformerEncoderLayer.__init__ = init
    try:
        char_lm.train(steps, dump_path)
    finally:
        torch.nn.TransformerEncoderLayer.__init__ = layer_init


def save_png(png: bytes, path: Path) -> int:
    """Write ``png`` to ``path`` re-encoded (optimised; palette when large); returns bytes."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    buffer = io.BytesIO()
    image.save(buffer, "PNG", optimize=True)
    if buffer.tell() > MAX_BYTES:
        buffer = io.BytesIO()
        image.quantize(256, method=Image.Quantize.MEDIANCUT).save(buffer, "PNG", optimize=True)
    path.write_bytes(buffer.getvalue())
    return buffer.tell()


class Shooter:
    """One headless Chromium; :meth:`shot` writes the region between two elements."""

    def __init__(self, out: Path) -> None:
        from chromium_page import Browser, chromium_binary

        binary = chromium_binary()
        if binary is None:
            raise SystemExit("no Chromium on PATH (Debian package 'chromium')")
        self.out = out
        self.browser = Browser(binary, WIDTH, HEIGHT)
        self.sizes: dict[str, int] = {}

    def open(self, page: Path) -> None:
        self.browser.open(page)
        if self.browser.js("document.body.dataset.ready") != "1" or self.browser.errors:
            raise RuntimeError(f"{page}: page not drawn: {self.browser.errors}")

    def js(self, expression: str):
        return self.browser.js(expression)

    def top(self, selector: str) -> float:
        """Page y (CSS px) of the top of the first element matching ``selector``."""
        return self.js(f"document.querySelector({json.dumps(selector)}).getBoundingClientRect().top + scrollY")

    def shot(self, name: str, start: str, end: str = None, *, height: float = None, width: float = 1100,
             pad: float = 8) -> None:
        """Write ``name`` (a PNG in ``out``): from the top of ``start`` to the top of ``end``
        (or ``height`` CSS px, or the bottom of ``start``), ``width`` px wide."""
        y0 = self.top(start) - pad
        if end is not None:
            y1 = self.top(end) - pad
        elif height is not None:
            y1 = y0 + height
        else:
            y1 = self.js(f"document.querySelector({json.dumps(start)}).getBoundingClientRect().bottom + scrollY") + pad
        clip = {"x": 0, "y": max(y0, 0), "width": width, "height": y1 - max(y0, 0), "scale": 1}
        data = self.browser.call("Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True)["data"]
        import base64

        self.sizes[name] = save_png(base64.b64decode(data), self.out / name)
        if self.browser.errors:
            raise RuntimeError(f"{name}: {self.browser.errors}")

    def hover(self, selector: str, row: int, column: int) -> str:
        """Move the mouse onto a heat-map cell (the canvas in ``selector``); returns the tooltip."""
        canvas = f"document.querySelector({json.dumps(selector + ' canvas')})"
        x, y = self.js(f"""(() => {{ const c = {canvas}, b = c.getBoundingClientRect();
            const [left, top, w, h] = c.dataset.grid.split(',').map(Number);
            return [b.left + left + ({column} + 0.5) * w, b.top + top + ({row} + 0.5) * h]; }})()""")
        self.browser.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        return self.js("document.getElementById('tooltip').textContent")

    def close(self) -> None:
        self.browser.close()


GRAPH_NODE = "#graph .node[data-name=\"{}\"]"
LAYER0 = "Module.layers.0.TransformerEncoderLayer.forward.0"
#: the heat-map row of the NaN hunt's first NaN cell (the module holding the origin)
NAN_ROW = "Module.model.layers.0.input_layernorm.LlamaRMSNorm"


def click_node(shooter: Shooter, name: str) -> None:
    """Click the graph node ``name`` (shown: its ancestors open)."""
    shooter.js(f"document.querySelector({json.dumps(GRAPH_NODE.format(name))})"
               ".dispatchEvent(new MouseEvent('click', {bubbles: true}))")


def search(shooter: Shooter, text: str) -> None:
    shooter.js(f"(() => {{ const s = document.getElementById('tree-search'); s.value = {json.dumps(text)};"
               " s.dispatchEvent(new Event('input')); })()")


def screenshots(work: Path, out: Path) -> dict[str, int]:
    """Build the pages from the dumps in ``work`` and write every picture into ``out``."""
    from msprobe.compare import compare
    from msprobe.report import write_report

    here = os.getcwd()
    try:
        os.chdir(work / "example")
        example = write_report("./dump_path", "report.html").resolve()
        example_jumps = write_report("./dump_path", "report-jump3.html", jump=3.0).resolve()
        os.chdir(work / "nan")
        nan = write_report("./dump_path", "report.html").resolve()
        os.chdir(work)
        compare("gelu_tanh/dump_path", "gelu/dump_path", out="compare", formats="summary,parquet,html")
    finally:
        os.chdir(here)
    pages = [example, example_jumps, nan, work / "compare" / "report.html"]
    for page in pages:   # stack frames: the checkout's and the packages' paths written short
        text = page.read_text(encoding="utf-8").replace(sysconfig.get_paths()["purelib"] + os.sep, SITE_PACKAGES)
        page.write_text(text.replace(str(ROOT) + os.sep, CHECKOUT), encoding="utf-8")
    s = Shooter(out)
    try:
        s.open(example)
        s.js("document.querySelector('#first-nan-0 details summary').click()")
        s.shot("report-overview.png", "h1", "#s-graph")
        s.js(f"(() => {{ const e = document.querySelector({json.dumps(GRAPH_NODE.format(LAYER0))}); "
             "e.querySelector('.toggle').dispatchEvent(new MouseEvent('click', {bubbles: true})); })()")
        click_node(s, "Module.layers.0.linear1.Linear.forward.0")
        s.js("document.querySelector('#graph .graph-bar button:nth-of-type(3)').click()")   # fit
        s.shot("report-graph.png", "#s-graph", "#s-trends", width=1400)
        s.shot("report-heatmaps.png", "#s-trends", "#trends h3:nth-of-type(3)", width=1400)
        s.shot("report-movers.png", "#trends h3:nth-of-type(3)", "#s-tree", width=1400)
        s.js("[...document.querySelectorAll('#tree button')].find(b => b.textContent === 'collapse all').click()")
        s.shot("report-tree-collapsed.png", "#s-tree", "#s-largest", width=1100)
        s.js("(() => { const d = document.querySelector('.tree details[data-name=\"Module.layers.0.TransformerEncoderLayer.forward.0\"]');"
             " d.open = true; d.querySelectorAll('details').forEach(e => { e.open = true; }); })()")
        s.shot("report-tree.png", "#s-tree", height=620, width=1100)
        search(s, "linear2")
        s.shot("report-tree-search.png", "#s-tree", height=330, width=1100)

        s.open(example_jumps)
        s.shot("report-largest.png", "#s-largest", height=700, width=1400)

        s.open(nan)   # the NaN hunt: the page opens on the origin's step, the origin selected
        s.js("document.querySelector('#first-nan-0 details summary').click()")
        s.shot("report-nan-overview.png", "#overview h3:nth-of-type(2)", "#s-graph")
        s.js("document.querySelector('#details details summary').click()")
        s.shot("report-nan-graph.png", "#s-graph", "#s-trends", width=1400)
        s.js("document.querySelector('#trends h3').scrollIntoView(); scrollBy(0, -100)")   # below the sticky bar
        row = s.js(f"readData().per_rank['0'].output.rows.indexOf('{NAN_ROW}')")
        tip = s.hover("#heat-output", row, NAN_STEP)
        if "NaN" not in tip:
            raise RuntimeError(f"the hovered cell is not NaN: {tip!r}")
        s.shot("report-nan-heatmap.png", "#trends h3:nth-of-type(1)", "#trends h3:nth-of-type(2)", width=1400)

        s.open(work / "compare" / "report.html")
        s.shot("compare-report.png", "h1", "#compare h3:nth-of-type(1)", width=1400)
        s.shot("compare-graph.png", "#compare h3:nth-of-type(1)", "#compare h3:nth-of-type(2)", width=1400)
        s.shot("compare-plot.png", "#compare h3:nth-of-type(2)", "#compare h3:nth-of-type(3)", width=1400)
        s.shot("compare-tree.png", "#compare h3:nth-of-type(3)", "#compare h3:nth-of-type(4)")
        s.shot("compare-table.png", "#compare h3:nth-of-type(4)", height=480, width=1400)
    finally:
        s.close()
    return s.sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "img"), help="folder of the PNGs (default docs/img)")
    parser.add_argument("--work", default=None, help="folder of the dumps and pages (default: a new temporary one)")
    parser.add_argument("--steps", type=int, default=8, help="training steps of each run (default 8)")
    parser.add_argument("--record", nargs=2, metavar=("KIND", "DUMP_PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.record:
        record(args.record[0], args.record[1], args.steps)
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="msprobe-screenshots-"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for kind in ("example", "nan", "gelu", "gelu_tanh"):
        dump = str(work / kind / "dump_path")
        command = ([sys.executable, str(ROOT / "examples" / "char_lm.py"), "--steps", str(args.steps), "--dump-path", dump]
                   if kind == "example" else
                   [sys.executable, __file__, "--steps", str(args.steps), "--record", kind, dump])
        subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])))
    for name, size in screenshots(work, out).items():
        print(f"{out / name}: {size / 1000:.0f} kB")
    print(f"dumps and pages in {work}")


if __name__ == "__main__":
    main()
