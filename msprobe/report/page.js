// msprobe report pages: drawing helpers shared by `msprobe report` and `msprobe compare`'s
// report.html. The data is the JSON in <script id="msprobe-data">; non-finite floats are the
// strings "NaN", "Infinity", "-Infinity". No network: everything is drawn here (SVG, canvas).
"use strict";

const SVGNS = "http://www.w3.org/2000/svg";

function num(v) {  // JSON value -> Number (null stays null)
  if (v === null || v === undefined) return null;
  if (v === "NaN") return NaN;
  if (v === "Infinity") return Infinity;
  if (v === "-Infinity") return -Infinity;
  return Number(v);
}

function fmt(v) {  // a statistic as text: 4 significant digits, "—" for nothing recorded
  const x = num(v);
  if (x === null) return "—";
  if (Number.isNaN(x)) return "NaN";
  if (!Number.isFinite(x)) return x > 0 ? "Inf" : "-Inf";
  if (Number.isInteger(x) && Math.abs(x) < 1e6) return String(x);
  const a = Math.abs(x);
  return (a !== 0 && (a < 1e-3 || a >= 1e5)) ? x.toExponential(3) : x.toPrecision(4);
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c);
  return e;
}

function svgEl(tag, attrs, text) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// a table of rows (objects); columns: [[key, header, kind]] with kind "num" or "text";
// cell(row, key) may return a Node to put in the cell instead of the formatted value
function table(rows, columns, cell) {
  const t = el("table");
  t.append(el("tr", {}, ...columns.map(([, h]) => el("th", {text: h}))));
  for (const r of rows) {
    const tr = el("tr");
    for (const [k, , kind] of columns) {
      const custom = cell ? cell(r, k) : undefined;
      if (custom !== undefined) { tr.append(el("td", {}, custom)); continue; }
      const v = r[k];
      tr.append(kind === "num" ? el("td", {class: "num", text: fmt(v), "data-value": v === null || v === undefined ? "" : String(v)})
                               : el("td", {text: v === null || v === undefined ? "—" : String(v)}));
    }
    t.append(tr);
  }
  return t;
}

// a sortable, filterable table of any number of rows, PAGE rows at a time: a click on a
// header sorts by that column (again: the other way); the filter keeps the rows whose text
// contains every word typed. Returns a div holding the controls and the <table> (class cls).
const PAGE = 100;
function dataTable(rows, columns, cell, cls) {
  const box = el("div", {class: "data-table"});
  const filter = el("input", {type: "search", placeholder: "filter rows", class: "table-filter", size: "30"});
  const info = el("span", {class: "note table-info"});
  const prev = el("button", {text: "‹ previous", class: "table-prev"}), next = el("button", {text: "next ›", class: "table-next"});
  const all = el("button", {text: "show all", class: "table-all"});
  const text = (r) => columns.map(([k]) => r[k] === null || r[k] === undefined ? "" : String(r[k])).join(" ").toLowerCase();
  const texts = new Map(rows.map((r) => [r, text(r)]));
  let shown = rows, page = 0, per = PAGE, sortKey = null, sortDir = 1;
  box.append(el("div", {class: "table-bar"}, filter, " ", prev, " ", next, " ", all, " ", info));
  let t = null;
  function draw() {
    const pages = Math.max(1, Math.ceil(shown.length / per));
    page = Math.min(page, pages - 1);
    const part = shown.slice(page * per, (page + 1) * per);
    const nt = table(part, columns, cell);
    if (cls) nt.classList.add(cls);
    const heads = nt.querySelectorAll("th");
    columns.forEach(([k], i) => {
      heads[i].classList.add("sortable");
      if (k === sortKey) heads[i].classList.add(sortDir > 0 ? "asc" : "desc");
      heads[i].addEventListener("click", () => { sortDir = sortKey === k ? -sortDir : 1; sortKey = k; sort(); draw(); });
    });
    if (t) t.replaceWith(nt); else box.append(nt);
    t = nt;
    info.textContent = `rows ${shown.length ? page * per + 1 : 0}–${page * per + part.length} of ${shown.length}` +
      (shown.length < rows.length ? ` (filtered from ${rows.length})` : "");
    prev.disabled = page === 0; next.disabled = page >= pages - 1; all.disabled = shown.length <= per;
  }
  function sort() {
    if (sortKey === null) return;
    const kind = (columns.find(([k]) => k === sortKey) || [])[2];
    const key = (r) => { const v = r[sortKey]; if (kind !== "num") return v === null || v === undefined ? "" : String(v); const x = num(v); return x === null || Number.isNaN(x) ? -Infinity : x; };
    shown = [...shown].sort((a, b) => { const x = key(a), y = key(b); return (x < y ? -1 : x > y ? 1 : 0) * sortDir; });
  }
  filter.addEventListener("input", () => {
    const words = filter.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
    shown = words.length ? rows.filter((r) => words.every((w) => texts.get(r).includes(w))) : rows;
    page = 0; sort(); draw();
  });
  prev.onclick = () => { page--; draw(); };
  next.onclick = () => { page++; draw(); };
  all.onclick = () => { per = Infinity; page = 0; draw(); };
  draw();
  return box;
}

const tooltip = () => document.getElementById("tooltip");
function showTip(ev, text) {
  const t = tooltip(); t.textContent = text; t.style.display = "block";
  t.style.left = (ev.clientX + 14) + "px"; t.style.top = (ev.clientY + 14) + "px";
}
function hideTip() { tooltip().style.display = "none"; }

// colour of t in [0, 1]: a perceptual blue-green-yellow ramp (viridis' end points)
const RAMP = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
function ramp(t) {
  const x = Math.min(Math.max(t, 0), 1) * (RAMP.length - 1), i = Math.min(Math.floor(x), RAMP.length - 2);
  const f = x - i, a = RAMP[i], b = RAMP[i + 1];
  return `rgb(${a.map((c, k) => Math.round(c + f * (b[k] - c))).join(",")})`;
}
const NAN_COLOUR = "#e53935", INF_COLOUR = "#ff00ff";

// heat map on a canvas: rows x columns, log10 colour scale; hover shows the values.
// Sets data-cells on the canvas to the number of cells drawn (cells holding a value), data-rows,
// data-columns, and data-grid ("left,top,width,height": the first cell, CSS pixels).
// A row label: the name without "Module."/"Cell.", shortened in the middle to fit maxWidth.
function rowText(g, name, maxWidth) {
  let s = name.replace(/^(Module|Cell)\./, "");
  if (g.measureText(s).width <= maxWidth) return s;
  let a = Math.ceil(s.length / 2), b = s.length - a;
  while (a + b > 4 && g.measureText(s.slice(0, a) + "…" + s.slice(s.length - b)).width > maxWidth) { if (a > b) a--; else b--; }
  return s.slice(0, a) + "…" + s.slice(s.length - b);
}

// The width a chart may use: the page's content width.
function pageWidth() { return Math.max(600, document.documentElement.clientWidth - 60); }

function heatmap(container, heat, rowLabel, valueLabel, markColumn) {
  const rows = heat.rows, cols = heat.columns, values = heat.values;
  if (!rows.length) { container.append(el("p", {class: "note", text: "nothing recorded"})); return null; }
  let lo = Infinity, hi = -Infinity;
  for (const r of values) for (const v of r) {
    const x = num(v);
    if (x !== null && Number.isFinite(x) && x > 0) { lo = Math.min(lo, x); hi = Math.max(hi, x); }
  }
  if (lo === Infinity) { lo = 1; hi = 10; }
  const llo = Math.log10(lo), lhi = Math.max(Math.log10(hi), llo + 1e-9);
  const canvas = el("canvas", {class: "heat"});
  const measure = canvas.getContext("2d"); measure.font = "11px sans-serif";
  const total = pageWidth();
  const longest = Math.max(...rows.map((r) => measure.measureText(r.replace(/^(Module|Cell)\./, "")).width));
  const left = Math.ceil(Math.min(longest + 12, total * 0.45)), top = 8, bottom = 40;
  const cw = Math.max(2, Math.min(400, Math.floor((total - left - 10) / cols.length)));
  const ch = Math.max(2, Math.min(16, Math.floor(640 / rows.length)));
  const dpr = window.devicePixelRatio || 1;
  const W = left + cols.length * cw + 10, H = top + rows.length * ch + bottom;
  canvas.width = W * dpr; canvas.height = H * dpr; canvas.style.width = W + "px"; canvas.style.height = H + "px";
  const g = canvas.getContext("2d"); g.scale(dpr, dpr);
  g.fillStyle = "#f0f0f0"; g.fillRect(left, top, cols.length * cw, rows.length * ch);
  let drawn = 0;
  for (let i = 0; i < rows.length; i++) for (let j = 0; j < cols.length; j++) {
    const x = num(values[i][j]);
    if (x === null) continue;
    g.fillStyle = Number.isNaN(x) ? NAN_COLOUR : !Number.isFinite(x) ? INF_COLOUR
      : x <= 0 ? ramp(0) : ramp((Math.log10(x) - llo) / (lhi - llo));
    g.fillRect(left + j * cw, top + i * ch, cw, ch);
    drawn++;
  }
  g.fillStyle = "#333"; g.font = "11px sans-serif"; g.textBaseline = "middle"; g.textAlign = "right";
  const rowEvery = Math.ceil(12 / ch);
  for (let i = 0; i < rows.length; i += rowEvery) {
    g.fillText(rowText(g, rows[i], left - 8), left - 4, top + i * ch + ch / 2);
  }
  g.textAlign = "center"; g.textBaseline = "top";
  const colEvery = Math.ceil(40 / cw);
  for (let j = 0; j < cols.length; j += colEvery) g.fillText(cols[j], left + j * cw + cw / 2, top + rows.length * ch + 3);
  g.fillText("step", left + cols.length * cw / 2, top + rows.length * ch + 22);
  if (markColumn !== undefined && markColumn !== null && markColumn >= 0) {   // the selected step
    g.strokeStyle = "#000"; g.lineWidth = 2;
    g.strokeRect(left + markColumn * cw + 1, top + 1, Math.max(cw - 2, 1), rows.length * ch - 2);
  }
  canvas.dataset.cells = String(drawn);
  canvas.dataset.rows = String(rows.length); canvas.dataset.columns = String(cols.length);
  canvas.dataset.grid = [left, top, cw, ch].join(",");   // CSS px: first cell's corner, cell size
  canvas.addEventListener("mousemove", (ev) => {
    const b = canvas.getBoundingClientRect();
    const j = Math.floor((ev.clientX - b.left - left) / cw), i = Math.floor((ev.clientY - b.top - top) / ch);
    if (i < 0 || j < 0 || i >= rows.length || j >= cols.length) { hideTip(); return; }
    showTip(ev, `${rowLabel}: ${rows[i]}\nstep ${cols[j]}\n${valueLabel}: ${fmt(values[i][j])}`);
  });
  canvas.addEventListener("mouseleave", hideTip);
  const legend = el("div", {class: "legend note"});
  const bar = el("canvas", {width: "200", height: "10"});
  const bg = bar.getContext("2d");
  for (let k = 0; k < 200; k++) { bg.fillStyle = ramp(k / 199); bg.fillRect(k, 0, 1, 10); }
  legend.append(`${valueLabel}, log scale: ${fmt(lo)} `, bar, ` ${fmt(hi)}  `,
    el("span", {style: `color:${NAN_COLOUR}`, text: "■ NaN"}), el("span", {style: `color:${INF_COLOUR}`, text: "■ Inf"}),
    el("span", {style: "color:#bbb", text: "■ not recorded"}));
  container.append(canvas, legend);
  return canvas;
}

// the smallest of 1, 2, 5 x 10^k that is at least raw (> 0): a tick spacing easy to read
function niceStep(raw) {
  if (!(raw > 0) || !Number.isFinite(raw)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  return [1, 2, 5, 10].map((m) => m * p).find((v) => v >= raw * (1 - 1e-9));
}
// the multiples of step in [a, b]
function multiples(a, b, step) {
  const out = [];
  for (let k = Math.ceil(a / step - 1e-9); k * step <= b + step * 1e-9; k++) out.push(Number((k * step).toPrecision(12)));
  return out;
}
// a tick value as short text: "200", "0.05", "2e-9"
function tickText(v) {
  const r = Number(v.toPrecision(6));
  return Math.abs(r) >= 1e5 || (r !== 0 && Math.abs(r) < 1e-3) ? r.toExponential() : String(r);
}
// 10^k as a tick label: "0.01", "1", "1000", "1e-7", "1e6"
function decade(k) { return Math.abs(k) <= 3 ? String(Number(`1e${k}`)) : `1e${k}`; }

// line or scatter plot in SVG. series: [{label, colour, points: [[x, y, title]]}];
// opts: {xLabel, yLabel, logY, lines, width, height, marks: [x]} (marks: dashed verticals).
// Ticks (text of class "xtick"/"ytick"): multiples of 1, 2 or 5 x 10^k; on a log axis spanning
// two decades or more, powers of ten.
function plot(container, series, opts) {
  const W = opts.width || Math.min(pageWidth(), 1400), H = opts.height || 280, L = 84, R = 10, T = 10, B = 44;
  const svg = svgEl("svg", {width: W, height: H, class: "plot"});
  const ys = [], xs = [];
  const yOf = (v) => { const x = num(v); return opts.logY ? (x > 0 && Number.isFinite(x) ? Math.log10(x) : null) : x; };
  for (const s of series) for (const p of s.points) { xs.push(p[0]); const y = yOf(p[1]); if (y !== null && Number.isFinite(y)) ys.push(y); }
  if (!xs.length) { container.append(el("p", {class: "note", text: "nothing to plot"})); return svg; }
  let x0 = Math.min(...xs), x1 = Math.max(...xs); if (x1 === x0) x1 = x0 + 1;
  let y0 = ys.length ? (opts.zeroY ? Math.min(0, ...ys) : Math.min(...ys)) : 0, y1 = ys.length ? Math.max(...ys) : 1;
  if (y1 - y0 < 1e-12) { y0 -= 0.5; y1 += 0.5; }
  const px = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const py = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const xticks = multiples(x0, x1, opts.integerX ? Math.max(1, niceStep((x1 - x0) / 5)) : niceStep((x1 - x0) / 5));
  let yticks;   // [position (log10 when logY), label]
  if (opts.logY && Math.floor(y1) - Math.ceil(y0) >= 1) {   // decades
    yticks = multiples(y0, y1, Math.max(1, Math.ceil((y1 - y0) / 6))).map((k) => [k, decade(k)]);
  } else if (opts.logY) {   // less than two decades: nice values between the ends, placed on the log axis
    const lo = Math.pow(10, y0), hi = Math.pow(10, y1);
    yticks = multiples(lo, hi, niceStep((hi - lo) / 4)).filter((v) => v > 0).map((v) => [Math.log10(v), tickText(v)]);
    if (yticks.length < 2) yticks = [[y0, tickText(Number(lo.toPrecision(2)))], [y1, tickText(Number(hi.toPrecision(2)))]];
  } else {
    yticks = multiples(y0, y1, niceStep((y1 - y0) / 5)).map((y) => [y, tickText(y)]);
  }
  for (const [y, text] of yticks) {
    svg.append(svgEl("line", {x1: L, x2: W - R, y1: py(y), y2: py(y), stroke: "#eee"}));
    svg.append(svgEl("text", {x: L - 4, y: py(y) + 4, "text-anchor": "end", "font-size": 11, class: "ytick"}, text));
  }
  svg.append(svgEl("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#888"}),
             svgEl("line", {x1: L, y1: T, x2: L, y2: H - B, stroke: "#888"}));
  for (const t of xticks) svg.append(svgEl("text", {x: px(t), y: H - B + 14, "text-anchor": "middle", "font-size": 11, class: "xtick"}, tickText(t)));
  svg.append(svgEl("text", {x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", "font-size": 12}, opts.xLabel));
  svg.append(svgEl("text", {x: 14, y: (T + H - B) / 2, "text-anchor": "middle", "font-size": 12,
                            transform: `rotate(-90 14 ${(T + H - B) / 2})`}, opts.yLabel));
  for (const [y, text] of opts.hlines || []) {   // horizontal reference lines (y in data units)
    const yy = yOf(y);
    if (yy === null || yy < y0 || yy > y1) continue;
    svg.append(svgEl("line", {x1: L, x2: W - R, y1: py(yy), y2: py(yy), stroke: "#555", "stroke-dasharray": "2 3", class: "hline"}));
    svg.append(svgEl("text", {x: W - R - 4, y: py(yy) - 4, "text-anchor": "end", "font-size": 11, fill: "#555"}, text));
  }
  for (const m of opts.marks || []) svg.append(svgEl("line", {x1: px(m), x2: px(m), y1: T, y2: H - B, stroke: "#d32f2f", "stroke-dasharray": "4"}));
  for (const s of series) {
    const pts = s.points.map((p) => [px(p[0]), yOf(p[1]), p]);
    if (opts.lines) {
      const d = pts.filter((p) => p[1] !== null && Number.isFinite(p[1])).map((p, k) => `${k ? "L" : "M"}${p[0].toFixed(1)},${py(p[1]).toFixed(1)}`).join("");
      if (d) svg.append(svgEl("path", {d, fill: "none", stroke: s.colour, "stroke-width": 1.5}));
    }
    for (const [x, y, p] of pts) {
      const bad = y === null || !Number.isFinite(y);
      const c = svgEl("circle", {cx: x.toFixed(1), cy: (bad ? (num(p[1]) === 0 || num(p[1]) === null ? H - B : T) : py(y)).toFixed(1),
                                 r: opts.lines ? 2.5 : 3, fill: s.colour});
      c.append(svgEl("title", {}, p[2] || `${s.label}: ${fmt(p[1])}`));
      svg.append(c);
    }
  }
  container.append(svg);
  if (series.length > 1 || opts.legend) {
    container.append(el("div", {class: "legend note" + (series.length > 3 ? " column" : "")},
      ...series.map((s) => el("span", {style: `color:${s.colour}`, text: `● ${s.label}`}))));
  }
  return svg;
}

// collapsible, searchable tree of nodes [{name, parent, ...}]; label(node) -> text,
// stats(node) -> text; marked: Set of names drawn as a path (class "path", opened).
// A run of more than GROUP_RUN consecutive top-level API calls without children (an
// optimizer's updates, outside any module) is drawn inside one collapsed group.
// Sets data-nodes on the returned box to the number of nodes drawn (groups not counted).
const GROUP_RUN = 5;
function tree(container, nodes, label, stats, marked) {
  const kids = new Map(), roots = [];
  for (const n of nodes) { if (n.parent === null || n.parent === undefined) roots.push(n); else { if (!kids.has(n.parent)) kids.set(n.parent, []); kids.get(n.parent).push(n); } }
  const search = el("input", {type: "search", placeholder: "search names", id: "tree-search", size: "40"});
  const count = el("span", {class: "note"});
  const expand = el("button", {text: "expand all"}), collapse = el("button", {text: "collapse all"});
  const box = el("div", {class: "tree"});
  container.append(el("div", {}, search, " ", expand, " ", collapse, " ", count), box);
  const items = [];   // [node, element, parentItem]
  function render(n, into, parentItem) {
    const children = kids.get(n.name) || [];
    const text = el("span", {class: "label" + (n.kind === "api_forward" ? " api" : ""), text: label(n)});
    const st = el("span", {class: "stats", text: stats(n)});
    let e;
    if (children.length) {
      e = el("details", {"data-name": n.name}, el("summary", {}, text, st));
      const item = [n, e, parentItem]; items.push(item);
      for (const c of children) render(c, e, item);
    } else {
      e = el("div", {class: "leaf", "data-name": n.name}, text, st);
      items.push([n, e, parentItem]);
    }
    if (marked && marked.has(n.name)) { e.classList.add("path"); if (e.tagName === "DETAILS") e.open = true; }
    into.append(e);
  }
  const groups = [];   // [details, item, nodes]
  let run = [];
  const flush = () => {
    if (run.length > GROUP_RUN) {
      const g = el("details", {class: "group"}, el("summary", {}, el("span", {class: "label api",
        text: `${run.length} API calls outside any module (${run[0].name} … ${run[run.length - 1].name})`})));
      const item = [{name: ""}, g, null]; items.push(item);
      for (const n of run) render(n, g, item);
      box.append(g); groups.push(g);
    } else for (const n of run) render(n, box, null);
    run = [];
  };
  for (const r of roots) {
    if (r.kind === "api_forward" && !kids.has(r.name)) { run.push(r); continue; }
    flush(); render(r, box, null);
  }
  flush();
  for (const e of box.children) if (e.tagName === "DETAILS" && !marked && !groups.includes(e)) e.open = true;
  expand.onclick = () => box.querySelectorAll("details").forEach((d) => { d.open = true; });
  collapse.onclick = () => box.querySelectorAll("details").forEach((d) => { d.open = false; });
  search.addEventListener("input", () => {
    const q = search.value.trim().toLowerCase();
    const keep = new Set();
    let hits = 0;
    for (const [n, e, p] of items) {
      e.classList.remove("hit");
      if (q && n.name.toLowerCase().includes(q)) {
        hits++; e.classList.add("hit");
        for (let a = [n, e, p]; a; a = a[2]) keep.add(a[1]);
      }
    }
    for (const [, e] of items) {
      e.style.display = !q || keep.has(e) ? "" : "none";
      if (q && e.tagName === "DETAILS" && keep.has(e)) e.open = true;
    }
    count.textContent = q ? `${hits} match${hits === 1 ? "" : "es"}` : "";
  });
  box.dataset.nodes = String(items.length - groups.length);
  return box;
}

function stackBlock(frames) {
  if (!frames || !frames.length) return el("span", {class: "note", text: "no stack recorded"});
  return el("details", {}, el("summary", {text: `stack (${frames.length} frames, innermost first)`}),
            el("pre", {text: frames.join("\n")}));
}

function readData() { return JSON.parse(document.getElementById("msprobe-data").textContent); }
