// `msprobe compare`'s report.html (data: msprobe.compare.report._ranks). The rank and step
// selectors at the top drive every view.
"use strict";

const VERDICT_COLOURS = {pass: "#4caf50", propagated: "#f0b400", origin: "#d32f2f", unpaired: "#7e57c2"};

function sqlString(s) { return "'" + String(s).replace(/'/g, "''") + "'"; }

function describe(label, f, cls) {
  if (!f) return null;
  return el("div", {class: cls},
    el("p", {}, el("b", {text: label + ": "}), el("code", {class: "call-name", text: f.name}),
       ` (step ${f.step}, ${f.direction}) in ${f.module || "(top level)"}` + (f.reason ? ` — ${f.reason}` : "")),
    (f.baseline_name && f.baseline_name !== f.name) ? el("p", {class: "note", text: `baseline: ${f.baseline_name}`}) : null,
    stackBlock(f.stack));
}

// nodes of one step: [{name, parent, kind, index, s}] with s = [index, verdict, e, e/tol, call i]
function stepNodes(G, step) {
  return (G.stats[String(step)] || []).map((s) => { const n = G.nodes[s[0]]; return {name: n[0], parent: n[1] >= 0 ? G.nodes[n[1]][0] : null, kind: n[2], index: s[0], s}; });
}

function compareGraph(D, R, step, box, state) {
  const G = R.graph, nodes = stepNodes(G, step);
  const modules = nodes.filter((n) => n.kind === "module_forward").length;
  box.append(el("p", {class: "note", id: "graph-note", text: `Step ${step}, rank ${R.rank}: ${modules} module calls and ${nodes.length - modules} API calls (forward) of the target, ` +
    "nested as construct.json records them; arrows join the visible calls in call order. Click + to open a module, a node for both runs' values." +
    (G.steps.length < G.steps_total ? ` ${G.steps.length} of ${G.steps_total} steps kept (evenly spaced).` : "")}));
  const colourBy = el("select", {id: "colour-by"});
  for (const [v, t] of [["verdict", "verdict"], ["ratio", "e/tol"]]) colourBy.append(el("option", {value: v, text: t}));
  colourBy.value = state.colourBy || "verdict";
  const legend = el("span", {class: "legend note graph-legend"});
  box.append(el("div", {class: "graph-controls"}, el("label", {}, "colour by ", colourBy), " ", legend));
  const wrap = el("div", {class: "graph-wrap"}), gbox = el("div", {class: "graph", id: "graph"}), details = el("div", {class: "details", id: "details"});
  details.append(el("p", {class: "note", text: "Click a node to see both runs' values."}));
  wrap.append(gbox, details); box.append(wrap);
  const RATIO_LO = 1e-3, RATIO_HI = 1e3;
  const colour = (n) => {
    if (colourBy.value === "verdict") return VERDICT_COLOURS[n.s[1]] || "#ccc";
    const x = num(n.s[3]);
    if (x === null) return "#eeeeee";
    if (!Number.isFinite(x)) return NAN_COLOUR;
    return ramp((Math.log10(Math.max(x, RATIO_LO)) - Math.log10(RATIO_LO)) / (Math.log10(RATIO_HI) - Math.log10(RATIO_LO)));
  };
  const drawLegend = () => {
    legend.replaceChildren();
    if (colourBy.value === "verdict") legend.append(...Object.entries(VERDICT_COLOURS).map(([v, c]) => el("span", {style: `color:${c}`, text: `■ ${v}`})));
    else {
      const bar = el("canvas", {width: "160", height: "10"}), bg = bar.getContext("2d");
      for (let k = 0; k < 160; k++) { bg.fillStyle = ramp(k / 159); bg.fillRect(k, 0, 1, 10); }
      legend.append(`e/tol, log scale: ≤ ${fmt(RATIO_LO)} `, bar, ` ≥ ${fmt(RATIO_HI)} (1: at the tolerance) `, el("span", {style: "color:#bbb", text: "■ no e/tol"}));
    }
  };
  const graph = modelGraph(gbox, {
    colour, nodeClass: (n) => "verdict-" + n.s[1],
    title: (n) => `${n.name}\n${n.s[1]} · e ${fmt(n.s[2])} · e/tol ${fmt(n.s[3])}`,
    onSelect: (n) => { state.selected = n.name; compareDetails(D, R, step, n, details); },
  });
  graph.setNodes(nodes);
  graph.expandRoots(3);
  const first = R.first_origin || R.first_diverged;
  const focus = state.selected && nodes.some((n) => n.name === state.selected) ? state.selected
    : first && first.step === step && nodes.some((n) => n.name === first.name) ? first.name : null;
  if (focus) graph.reveal(focus);
  drawLegend(); graph.redraw(); graph.fit();
  if (focus) graph.select(focus);
  colourBy.addEventListener("change", () => { state.colourBy = colourBy.value; drawLegend(); graph.redraw(); });
}

function compareDetails(D, R, step, n, box) {
  const G = R.graph, node = G.nodes[n.index];
  box.replaceChildren();
  box.append(el("h3", {class: "details-name", text: n.name}));
  if (node[4] !== n.name) box.append(el("p", {class: "note", text: "baseline: " + (node[4] === null ? "— (no partner)" : node[4])}));
  const path = [];
  for (let p = node[1]; p >= 0 && path.length < 100; p = G.nodes[p][1]) path.unshift(G.nodes[p][0]);
  box.append(el("p", {class: "note", text: `${n.kind}, step ${step}, rank ${R.rank}; in ${path.length ? path.join(" › ") : "(top level)"}`}));
  const row = R.rows.find((r) => r.i === n.s[4]);
  box.append(el("p", {class: "verdict-line"}, el("span", {style: `color:${VERDICT_COLOURS[n.s[1]] || "#333"};font-weight:600`, text: n.s[1]}),
    ` · e ${fmt(n.s[2])} · e/tol ${fmt(n.s[3])}` + (row && row.reason ? ` — ${row.reason}` : "")));
  const cols = G.detail_columns, tensors = (G.details[String(n.s[4])] || []).map((v) => Object.fromEntries(cols.map((c, k) => [c, v[k]])));
  if (tensors.length) {
    const rows = [];
    for (const t of tensors) {
      const side = (k) => t["t_" + k] === null || t["t_" + k] === undefined ? t["b_" + k] : t["t_" + k];
      const differs = (t.b_dtype !== null && t.t_dtype !== null) || (t.b_shape !== null && t.t_shape !== null)
        ? ` (baseline ${t.b_dtype || t.t_dtype || ""} ${JSON.stringify(t.b_shape || t.t_shape || [])})` : "";
      const head = `${t.io} ${t.arg} · ${side("dtype") || ""} ${JSON.stringify(side("shape") || [])}${differs} · e ${fmt(t.e)}, tol ${fmt(t.tol)} · ${t.verdict}`;
      rows.push({head, stat: "Max", t: t.t_max, b: t.b_max, rel: t.max_rel_pct});
      rows.push({head: "", stat: "Min", t: t.t_min, b: t.b_min, rel: t.min_rel_pct});
      rows.push({head: "", stat: "Mean", t: t.t_mean, b: t.b_mean, rel: t.mean_rel_pct});
      rows.push({head: "", stat: "Norm", t: t.t_norm, b: t.b_norm, rel: t.norm_rel_pct});
    }
    const tb = table(rows, [["stat", "statistic"], ["t", "target", "num"], ["b", "baseline", "num"], ["rel", "relative error (%)", "num"]]);
    tb.classList.add("both-runs");
    for (const [k, tr] of [...tb.querySelectorAll("tr")].slice(1).entries()) {
      if (rows[k].head) tr.before(el("tr", {class: "tensor-head"}, el("td", {colspan: "4", text: rows[k].head})));
    }
    box.append(tb);
  } else box.append(el("p", {class: "note", text: G.details_cut ? "tensors not embedded (a big comparison): run the SQL below" : "no tensors recorded"}));
  const stack = node[3];
  box.append(stackBlock(stack !== null ? R.stacks[stack] : null));
  const sql = `SELECT * FROM '${D.out}/tensors.parquet'\nWHERE rank = ${R.rank} AND step = ${step} AND t_call ${node[5] === null ? "IS NULL" : "= " + sqlString(node[5])}` +
    ` AND b_call ${node[4] === null ? "IS NULL" : "= " + sqlString(node[4])}\nORDER BY ord, io, arg`;
  box.append(el("h4", {text: "SQL for these rows (DuckDB over compare's tensors.parquet)"}), el("pre", {class: "sql", text: sql}));
  if (!D.parquet) box.append(el("p", {class: "note sql-missing", text: "tensors.parquet was not written by this comparison: rerun it with --format including parquet (the default) to run this SQL."}));
}

function errorPlot(D, R, step, box) {
  box.append(el("h3", {text: "Largest error per call, in units of each tensor's tolerance"}));
  if (R.plot.length < R.calls_total) box.append(el("p", {class: "note aggregated",
    text: `Aggregated: ${R.plot.length} of ${R.calls_total} calls drawn (every non-pass call; pass calls evenly sampled).`}));
  const chart = el("div", {class: "chart e-plot"}); box.append(chart);
  const series = Object.entries(VERDICT_COLOURS).map(([verdict, colour]) => ({label: verdict, colour,
    points: R.plot.filter((p) => p[2] === verdict && p[1] !== null).map((p) => [p[0], p[1], `${p[3]} (step ${p[4]}): ${verdict}, e/tol = ${fmt(p[1])}, e = ${fmt(p[5])}`])}));
  plot(chart, series, {xLabel: "call (execution order, all steps)", yLabel: "largest e/tol of the outputs (log scale)",
    logY: true, integerX: true, legend: true, marks: R.origin_index === null ? [] : [R.origin_index], hlines: [[1, "tolerance"]]});
  chart.append(el("p", {class: "note", text: "e/tol: a call's largest, over its output tensors, of the tensor's relative error divided by its own tolerance (dtype and role); " +
    "above the dotted line at 1 an output is out of tolerance. e/tol = 0 is drawn on the x axis, infinite at the top; calls without a tolerance (unpaired, non-float) are left out. " +
    "The dashed line marks the first origin (or the first diverged call)."}));
}

function compareTree(D, R, step, box) {
  box.append(el("h3", {text: "Module tree"}));
  const first = R.first_origin || R.first_diverged;
  const all = stepNodes(R.graph, step);
  const nodes = all.filter((n) => n.kind === "module_forward" || (first && first.step === step && n.name === first.name))
    .map((n) => ({name: n.name, parent: n.parent, kind: n.kind, verdict: n.s[1], e: n.s[2]}));
  const path = new Set();
  if (first && first.step === step) {
    const parent = new Map(nodes.map((n) => [n.name, n.parent]));
    for (let n = first.name; n && !path.has(n); n = parent.get(n)) path.add(n);
  }
  box.append(el("p", {class: "note", text: `Modules of step ${step}` + (path.size ? "; the path to " + first.name + " is marked in red." : ".")}));
  tree(box, nodes, (n) => n.name, (n) => `${n.verdict} · e ${fmt(n.e)}`, path.size ? path : null);
}

function callsTable(D, R, box) {
  box.append(el("h3", {text: "Calls that did not pass"}));
  if (R.non_pass > R.rows.length) box.append(el("p", {class: "note", text: `the first ${R.rows.length} of ${R.non_pass}`}));
  const anchor = (r) => `stack-${R.rank}-${r.stack_id}`;
  if (R.rows.length) {
    box.append(dataTable(R.rows, [["step", "step", "num"], ["t_name", "call (target; the baseline's when it differs; module)"],
      ["verdict", "verdict"], ["e", "e", "num"], ["ratio", "e/tol", "num"], ["reason", "reason"], ["stack_id", "stack"]],
      (r, k) => {
        if (k === "t_name") {
          const cell = el("div", {}, el("div", {class: "call", text: r.t_name === null ? "— (no target call)" : r.t_name}));
          if (r.b_name !== r.t_name) cell.append(el("div", {class: "note", text: "baseline: " + (r.b_name === null ? "— (no partner)" : r.b_name)}));
          // module: the target call's (a call only the baseline has shows none)
          if (r.module || r.t_name !== null) cell.append(el("div", {class: "note", text: "in " + (r.module || "(top level)")}));
          return cell;
        }
        if (k === "verdict") return el("span", {style: `color:${VERDICT_COLOURS[r.verdict] || "#333"}`, text: r.verdict});
        if (k === "stack_id") return r.stack_id === null ? "—" : el("a", {href: "#" + anchor(r), class: "stack-link", text: "stack"});
        return undefined;
      }, "calls"));
  } else box.append(el("p", {class: "note", text: "none"}));
  const ids = [...new Set(R.rows.map((r) => r.stack_id).filter((s) => s !== null))];
  if (ids.length) {
    box.append(el("h3", {text: "Stacks of the calls above"}));
    for (const id of ids) box.append(el("pre", {id: `stack-${R.rank}-${id}`, class: "stack", text: (R.stacks[id] || []).join("\n")}));
  }
}

function compareRank(D, R, step, box, state) {
  box.append(el("h2", {text: `rank ${R.rank}`}));
  const counts = Object.entries(R.counts).map(([verdict, n]) => ({verdict, n}));
  box.append(table(counts, [["verdict", "verdict"], ["n", "calls", "num"]]));
  const o = describe("first origin", R.first_origin, "first-origin");
  const d = describe("first diverged", R.first_diverged, "first-diverged");
  if (!o && !d) box.append(el("p", {class: "ok", text: "no divergence"}));
  if (o) box.append(o);
  if (d) box.append(d);
  box.append(el("h3", {text: "Model graph"}));
  const g = el("div", {id: "graph-section"}); box.append(g);
  compareGraph(D, R, step, g, state);
  errorPlot(D, R, step, box);
  compareTree(D, R, step, box);
  callsTable(D, R, box);
}

function main() {
  const D = readData();
  document.getElementById("title").textContent = `msprobe compare: ${D.verdict} (mode ${D.mode})`;
  const box = document.getElementById("compare");
  const notes = el("div");
  if (D.incomplete && D.incomplete.length) {
    // what was not compared: the verdict covers the rest only
    notes.append(el("p", {class: "bad", id: "incomplete", text: "Not compared (the answer is incomplete):"}),
                 el("ul", {class: "note"}, ...D.incomplete.map((n) => el("li", {text: n}))));
  }
  if (D.notes.length) notes.append(el("ul", {class: "note"}, ...D.notes.map((n) => el("li", {text: n}))));
  box.before(notes);
  const pickRank = document.getElementById("rank"), pickStep = document.getElementById("step");
  for (const R of D.ranks) pickRank.append(el("option", {value: String(R.rank), text: `rank ${R.rank}`}));
  const state = {};
  const rankData = () => D.ranks.find((R) => String(R.rank) === pickRank.value);
  const fillSteps = () => {
    const R = rankData(), keep = pickStep.value, first = R.first_origin || R.first_diverged;
    pickStep.replaceChildren();
    for (const s of R.graph.steps) pickStep.append(el("option", {value: String(s), text: `step ${s}`}));
    if (R.graph.steps.map(String).includes(keep)) pickStep.value = keep;
    else if (first && R.graph.steps.includes(first.step)) pickStep.value = String(first.step);
  };
  const draw = () => {
    box.replaceChildren();
    if (!D.ranks.length) return;
    compareRank(D, rankData(), Number(pickStep.value), box, state);
  };
  pickRank.addEventListener("change", () => { fillSteps(); draw(); });
  pickStep.addEventListener("change", draw);
  if (D.ranks.length) fillSteps();
  draw();
  document.body.dataset.readyMs = String(Math.round(performance.now()));   // since navigation start
  document.body.dataset.ready = "1";
}
main();
