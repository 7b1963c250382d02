// `msprobe report`: overview, model graph, trends, module tree, largest values
// (data: msprobe.report.data.collect). The rank and step selectors at the top drive every
// per-rank and per-step view.
"use strict";

const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
                 "#7f7f7f", "#bcbd22"];
const STATS = ["Max", "Min", "Mean", "Norm"];   // columns 1..4 of a graph stats row
const FINITE_COLOUR = "#d7ecd9", EMPTY_COLOUR = "#eeeeee";

// [0, 1, 2, 5] -> "0-2, 5"
function rangeText(values) {
  const out = [];
  for (let i = 0; i < values.length;) {
    let j = i;
    while (j + 1 < values.length && Number(values[j + 1]) === Number(values[j]) + 1) j++;
    out.push(i === j ? String(values[i]) : `${values[i]}-${values[j]}`);
    i = j + 1;
  }
  return out.join(", ");
}

function sqlString(s) { return "'" + String(s).replace(/'/g, "''") + "'"; }

function overview(D, box) {
  const steps = [...new Set(D.per_step.map((r) => r.step))].sort((a, b) => a - b);
  const entries = D.per_step.reduce((s, r) => s + r.entries, 0), tensors = D.per_step.reduce((s, r) => s + r.tensors, 0);
  box.append(el("p", {id: "summary", text:
    `${D.ranks.length} rank${D.ranks.length === 1 ? "" : "s"} (${D.ranks.join(", ")}), ${steps.length} step${steps.length === 1 ? "" : "s"} ` +
    `(${steps.length ? steps[0] + "–" + steps[steps.length - 1] : "none"}), ${entries} entries, ${tensors} tensors.`}));
  if (D.skipped && D.skipped.length) {
    // parts of the dump not read as data: everything below is partial
    const div = el("div", {id: "skipped"});
    div.append(el("p", {class: "bad", text: `Not read as data: ${D.skipped.length} part${D.skipped.length === 1 ? "" : "s"} of the dump; what follows is partial.`}));
    for (const line of D.skipped) div.append(el("p", {class: "note skipped-part", text: line}));
    box.append(div);
  }
  const meta = Object.entries(D.meta || {}).filter(([, v]) => typeof v !== "object" || v === null);
  if (meta.length) box.append(el("h3", {text: "Recording"}), table(meta.map(([k, v]) => ({k, v})), [["k", "field"], ["v", "value"]]));
  const detail = D.detail_ranks || D.ranks;
  if (detail.length < D.ranks.length) {
    box.append(el("p", {class: "note", id: "detail-ranks", text:
      `Per-rank detail (first NaN/Inf origin, model graph, trends, module tree) for ${detail.length} of ${D.ranks.length} ranks: ` +
      `${rangeText(detail)} (ranks holding NaN/Inf first, at most ${D.limits.max_ranks}). ` +
      `For another rank: msprobe report ${D.dump_path} --rank R.`}));
  }
  box.append(el("h3", {text: "First NaN/Inf per rank"}));
  const counted = new Map((D.nonfinite || []).map((r) => [r.rank, r])), clean = [];
  for (const rank of D.ranks) {
    if (!D.per_rank[rank]) {
      // no detail: the summary's counts and first NaN tensor
      const c = counted.get(rank);
      if (!c) { clean.push(rank); continue; }
      const div = el("div", {class: "first-nan", id: `first-nan-${rank}`});
      div.append(el("p", {}, el("span", {class: "bad", text: `rank ${rank}: `}),
        `${c.nan_tensors} tensor record${c.nan_tensors === 1 ? "" : "s"} holding NaN, ${c.inf_tensors} holding Inf, from step ${c.step}`,
        ...(c.first_nan_name ? ["; first NaN: ", el("code", {class: "first-tensor", text: c.first_nan_name}), ` (step ${c.first_nan_step})`] : [])));
      box.append(div);
      continue;
    }
    const nf = D.per_rank[rank].nonfinite, div = el("div", {class: "first-nan", id: `first-nan-${rank}`});
    const o = nf.origin, f = nf.first_tensor;
    if (!o && !f) div.append(el("p", {class: "ok", text: `rank ${rank}: no NaN or Inf recorded`}));
    if (o) {
      div.append(el("p", {}, el("span", {class: "bad", text: `rank ${rank}: first NaN/Inf origin `}),
        el("code", {class: "origin-name", text: o.name}), ` (step ${o.step}, ${o.kind}; finite inputs, non-finite output)`));
      div.append(el("p", {class: "note", text: "module path: " + (o.module_path.length ? o.module_path.join(" › ") : "(top level)")}), stackBlock(o.stack));
    } else if (f) {
      div.append(el("p", {class: "note", text: `rank ${rank}: no call turns finite inputs into NaN/Inf (non-finite values enter from outside the recorded calls, e.g. a mask built with float('-inf'))`}));
    }
    if (f) {
      div.append(el("p", {}, `rank ${rank}: first tensor holding ${f.has_nan ? "NaN" : "Inf"}: `, el("code", {class: "first-tensor", text: f.name}),
        ` ${f.io} ${f.arg} (step ${f.step})`));
      div.append(el("p", {class: "note", text: "module path: " + (f.module_path.length ? f.module_path.join(" › ") : "(top level)")}), stackBlock(f.stack));
    }
    box.append(div);
  }
  if (clean.length) box.append(el("p", {class: "ok", id: "no-nan-ranks", text: `rank${clean.length === 1 ? "" : "s"} ${rangeText(clean)}: no NaN or Inf recorded`}));
  const byStep = new Map();
  for (const r of D.per_step) { const s = byStep.get(r.step) || {step: r.step, entries: 0, tensors: 0}; s.entries += r.entries; s.tensors += r.tensors; byStep.set(r.step, s); }
  const rows = [...byStep.values()].sort((a, b) => a.step - b.step);
  const same = rows.every((r) => r.entries === rows[0].entries && r.tensors === rows[0].tensors);
  if (same && rows.length) {
    box.append(el("p", {class: "note", id: "per-step", text: `Every step recorded ${rows[0].entries} entries and ${rows[0].tensors} tensors (all ranks).`}));
    return;
  }
  box.append(el("h3", {text: "Entries and tensors per step"}));
  plot(box, [{label: "entries", colour: COLOURS[0], points: rows.map((r) => [r.step, r.entries, `step ${r.step}: ${r.entries} entries`])},
             {label: "tensors", colour: COLOURS[1], points: rows.map((r) => [r.step, r.tensors, `step ${r.step}: ${r.tensors} tensors`])}],
       {xLabel: "step", yLabel: "count (all ranks)", lines: true, height: 160, width: 640, integerX: true, zeroY: true});
}

// The graph data of a rank for one step: nodes [{name, parent, kind, index, s}] where s is
// the step's stats row [index, Max, Min, Mean, Norm, flag, tensors].
function stepNodes(G, step) {
  const rows = G.stats[String(step)] || [];
  return rows.map((s) => { const n = G.nodes[s[0]]; return {name: n[0], parent: n[1] >= 0 ? G.nodes[n[1]][0] : null, kind: n[2], index: s[0], s}; });
}

function flagText(flag) { return flag === 3 ? "NaN and Inf" : flag === 1 ? "NaN" : flag === 2 ? "Inf" : "finite"; }

function graphSection(D, rank, step, box, state) {
  const G = D.per_rank[rank].graph;
  const nodes = stepNodes(G, step);
  const modules = nodes.filter((n) => n.kind === "module_forward").length;
  box.append(el("p", {class: "note", id: "graph-note", text:
    `Step ${step}, rank ${rank}: ${modules} module calls and ${nodes.length - modules} API calls (forward), nested as construct.json records them; ` +
    "arrows join the visible calls in call order. Click + to open a module, a node for its values. " +
    (G.nodes.length < G.total ? `API calls left out: ${G.total} distinct calls exceed max_tree (${D.limits.max_tree}). ` : "") +
    (G.steps.length < G.steps_total ? `${G.steps.length} of ${G.steps_total} steps kept (evenly spaced). ` : "")}));
  const colourBy = el("select", {id: "colour-by"});
  for (const [v, t] of [["flag", "NaN/Inf"], ["4", "output Norm"], ["1", "output Max"], ["2", "output Min"], ["3", "output Mean"]]) colourBy.append(el("option", {value: v, text: t}));
  colourBy.value = state.colourBy || "flag";
  const legend = el("span", {class: "legend note graph-legend"});
  box.append(el("div", {class: "graph-controls"}, el("label", {}, "colour by ", colourBy), " ", legend));
  const wrap = el("div", {class: "graph-wrap"});
  const gbox = el("div", {class: "graph", id: "graph"}), details = el("div", {class: "details", id: "details"});
  details.append(el("p", {class: "note", text: "Click a node to see its values."}));
  wrap.append(gbox, details); box.append(wrap);
  let lo = 1, hi = 10;
  const col = () => colourBy.value;
  function scale() {
    lo = Infinity; hi = -Infinity;
    if (col() === "flag") return;
    for (const n of nodes) { const x = Math.abs(num(n.s[Number(col())])); if (n.s[6] && Number.isFinite(x) && x > 0) { lo = Math.min(lo, x); hi = Math.max(hi, x); } }
    if (lo === Infinity) { lo = 1; hi = 10; }
  }
  function colour(n) {
    if (!n.s[6]) return EMPTY_COLOUR;
    if (n.s[5] & 1) return NAN_COLOUR;
    if (n.s[5] & 2) return INF_COLOUR;
    if (col() === "flag") return FINITE_COLOUR;
    const x = Math.abs(num(n.s[Number(col())]));
    if (!(x > 0)) return ramp(0);
    return ramp((Math.log10(x) - Math.log10(lo)) / Math.max(Math.log10(hi) - Math.log10(lo), 1e-9));
  }
  function drawLegend() {
    legend.replaceChildren();
    if (col() === "flag") legend.append(el("span", {}, el("span", {class: "swatch", style: `background:${FINITE_COLOUR}`}), "finite outputs"));
    else {
      const bar = el("canvas", {width: "160", height: "10"}), bg = bar.getContext("2d");
      for (let k = 0; k < 160; k++) { bg.fillStyle = ramp(k / 159); bg.fillRect(k, 0, 1, 10); }
      legend.append(`|${colourBy.selectedOptions[0].text}|, log scale: ${fmt(lo)} `, bar, ` ${fmt(hi)} `);
    }
    legend.append(el("span", {style: `color:${NAN_COLOUR}`, text: "■ NaN"}), el("span", {style: `color:${INF_COLOUR}`, text: "■ Inf"}),
                  el("span", {style: "color:#bbb", text: "■ no output tensor"}));
  }
  const graph = modelGraph(gbox, {
    colour,
    title: (n) => `${n.name}\nNorm ${fmt(n.s[4])} · Max ${fmt(n.s[1])} · Min ${fmt(n.s[2])} · ${flagText(n.s[5])}`,
    onSelect: (n) => { state.selected = n.name; showDetails(D, rank, step, n, details); },
  });
  graph.setNodes(nodes);
  graph.expandRoots(3);
  const origin = D.per_rank[rank].nonfinite.origin;
  const focus = state.selected && nodes.some((n) => n.name === state.selected) ? state.selected
    : origin && origin.step === step && nodes.some((n) => n.name === origin.name) ? origin.name : null;
  if (focus) graph.reveal(focus);
  scale(); drawLegend(); graph.redraw(); graph.fit();
  if (focus) { graph.select(focus); }
  colourBy.addEventListener("change", () => { state.colourBy = col(); scale(); drawLegend(); graph.redraw(); });
  return graph;
}

function showDetails(D, rank, step, n, box) {
  const G = D.per_rank[rank].graph;
  box.replaceChildren();
  box.append(el("h3", {class: "details-name", text: n.name}));
  const path = [];
  for (let p = G.nodes[n.index][1]; p >= 0 && path.length < 100; p = G.nodes[p][1]) path.unshift(G.nodes[p][0]);
  box.append(el("p", {class: "note", text: `${n.kind}, step ${step}, rank ${rank}; in ${path.length ? path.join(" › ") : "(top level)"}`}));
  box.append(el("p", {class: "note", text: `Output statistics over its ${n.s[6]} output tensor${n.s[6] === 1 ? "" : "s"} taken together (one tensor: its dump.json values).`}));
  const t = table([{run: "this run", max: n.s[1], min: n.s[2], mean: n.s[3], norm: n.s[4], flag: flagText(n.s[5])}],
    [["run", ""], ["max", "Max", "num"], ["min", "Min", "num"], ["mean", "Mean", "num"], ["norm", "Norm", "num"], ["flag", "NaN/Inf"]]);
  t.classList.add("stats-now");
  box.append(t);
  // the same call in every kept step
  const over = [];
  for (const s of G.steps) {
    const row = (G.stats[String(s)] || []).find((r) => r[0] === n.index);
    if (row) over.push({step: s, max: row[1], min: row[2], mean: row[3], norm: row[4], flag: flagText(row[5])});
  }
  if (over.length > 1) {
    box.append(el("h4", {text: "Over the steps"}));
    const o = table(over, [["step", "step", "num"], ["max", "Max", "num"], ["min", "Min", "num"], ["mean", "Mean", "num"], ["norm", "Norm", "num"], ["flag", "NaN/Inf"]]);
    o.classList.add("stats-steps");
    for (const tr of o.querySelectorAll("tr")) if (tr.cells[0].textContent === String(step)) tr.classList.add("current");
    box.append(el("div", {class: "scroll"}, o));
  }
  const stack = G.nodes[n.index][3];
  box.append(stackBlock(stack !== null ? G.stacks[stack] : null));
  const sql = `SELECT io, arg, dtype, shape, max, min, mean, norm, has_nan, has_inf FROM tensors\n` +
    `WHERE rank = ${rank} AND step = ${step} AND name = ${sqlString(n.name)} ORDER BY seq, io, arg`;
  box.append(el("h4", {text: "SQL for every tensor of this call"}),
             el("pre", {class: "sql", text: `msprobe query ${D.dump_path} "${sql.replace(/"/g, '\\"')}"`}));
}

function stepColumn(heat, step) {   // the heat map column holding a step ("3" or a bin "0-4")
  return heat.columns.findIndex((c) => { const [a, b] = c.split("-").map(Number); return b === undefined ? a === step : a <= step && step <= b; });
}

function trends(D, rank, step, box) {
  const R = D.per_rank[rank];
  const note = (h) => {
    const parts = [];
    if (h.rows.length < h.rows_total) parts.push(`${h.rows.length} of ${h.rows_total} ${D.rows_are} shown (evenly spaced in execution order)`);
    if (h.bin > 1) parts.push(`steps binned by ${h.bin} (${h.steps_total} steps in ${h.columns.length} columns; each cell shows the bin's largest value)`);
    return parts.length ? el("p", {class: "note aggregated", text: "Aggregated: " + parts.join("; ") + "."}) : null;
  };
  box.append(el("h3", {text: `Output Norm per step and ${D.rows_are === "modules" ? "module" : "API call"}`}),
    el("p", {class: "note", text: `Each cell: the L2 norm of all forward output tensors of the ${D.rows_are === "modules" ? "module" : "API call"} in that step (sqrt of the sum of squared Norms). The selected step is outlined.`}));
  const n1 = note(R.output); if (n1) box.append(n1);
  const h1 = el("div", {class: "chart", id: "heat-output"}); box.append(h1);
  heatmap(h1, R.output, D.rows_are === "modules" ? "module" : "API", "output Norm", stepColumn(R.output, step));
  box.append(el("h3", {text: "Parameter-gradient Norm per step and module"}),
    el("p", {class: "note", text: "Each cell: the L2 norm of the gradients of the module's own parameters in that step."}));
  const n2 = note(R.grad); if (n2) box.append(n2);
  const h2 = el("div", {class: "chart", id: "heat-grad"}); box.append(h2);
  heatmap(h2, R.grad, "module", "gradient Norm", stepColumn(R.grad, step));
  box.append(el("h3", {text: "Largest movers: parameter-gradient Norm over steps"}),
    el("p", {class: "note", text: `The ${R.movers.length} parameters whose gradient Norm spans the largest ratio max/min over the steps; the dashed line is the selected step.`}));
  const m = el("div", {class: "chart", id: "movers"}); box.append(m);
  plot(m, R.movers.map((line, k) => ({label: `${line.param} (×${fmt(line.ratio)})`, colour: COLOURS[k % COLOURS.length],
    points: line.steps.map((s, i) => [s, line.norms[i], `${line.param}\nstep ${s}: ${fmt(line.norms[i])}`])})),
    {xLabel: "step", yLabel: "gradient Norm (log scale)", logY: true, lines: true, legend: true, integerX: true, marks: [step]});
}

function moduleTree(D, rank, step, box) {
  const G = D.per_rank[rank].graph;
  const nodes = stepNodes(G, step).map((n) => ({name: n.name, parent: n.parent, kind: n.kind, norm: n.s[4],
    absmax: Math.max(Math.abs(num(n.s[1])), Math.abs(num(n.s[2]))), nonfinite: n.s[5] !== 0}));
  if (!nodes.length) { box.append(el("p", {class: "note", text: "no forward entries"})); return; }
  box.append(el("p", {class: "note", text: `construct.json of step ${step} (rank ${rank}): ${nodes.length} nodes` +
    (G.nodes.length < G.total ? ` (API calls left out above ${D.limits.max_tree} distinct calls)` : "") +
    ". Per node: output Norm (L2 over output tensors), largest |value| of the outputs. Click a node to expand it."}));
  tree(box, nodes, (n) => n.name,
       (n) => `Norm ${fmt(n.norm)} · max|x| ${fmt(n.absmax)}${n.nonfinite ? " · NaN/Inf" : ""}`, null);
}

function largest(D, box, rank, step, state) {
  const L = D.largest;
  const only = el("input", {type: "checkbox", id: "largest-step-only"});
  only.checked = !!state.stepOnly;
  box.append(el("p", {}, el("label", {}, only, ` only rank ${rank}, step ${step} (the selectors at the top)`)));
  only.addEventListener("change", () => { state.stepOnly = only.checked; box.replaceChildren(); largest(D, box, rank, step, state); });
  const here = (r) => !state.stepOnly || (String(r.rank) === String(rank) && (r.step_list ? r.step_list.includes(step) : (r.step === step || r.previous_step === step)));
  box.append(el("h3", {text: `Values with |Max| or |Min| ≥ ${fmt(L.threshold)}`}));
  box.append(el("p", {class: "note", text: "One row per distinct tensor: a tensor handed on from call to call (same Max, Min, Mean, Norm, shape and CRC-32 in a step) is listed once, under its first entry; \"also in\" counts the other entries holding it. Steps: where it reaches the threshold. Click a header to sort."}));
  const rows = L.extremes.filter(here).map((r) => ({...r, also: r.seen_in.length, also_names: r.seen_in.slice(0, 3).join(", ") + (r.seen_in.length > 3 ? ", …" : "")}));
  box.append(rows.length ? dataTable(rows, [["rank", "rank", "num"], ["name", "entry"], ["io", "io"], ["arg", "arg"],
    ["steps", "steps", "num"], ["first_step", "first step", "num"], ["max", "Max", "num"], ["min", "Min", "num"],
    ["also", "also in", "num"], ["also_names", "e.g."]], null, "extremes") : el("p", {class: "note", text: "none"}));
  if (L.extremes.length === L.limit) box.append(el("p", {class: "note", text: `the ${L.limit} largest kept`}));
  box.append(el("h3", {text: `Norm jumps (×${fmt(L.jump)} or more between recorded steps)`}));
  const jumps = L.jumps.filter(here).map((r) => ({...r, also: r.seen_in.length, also_names: r.seen_in.slice(0, 3).join(", ") + (r.seen_in.length > 3 ? ", …" : "")}));
  box.append(jumps.length ? dataTable(jumps, [["rank", "rank", "num"], ["previous_step", "from step", "num"], ["step", "to step", "num"], ["name", "entry"],
    ["io", "io"], ["arg", "arg"], ["previous", "Norm before", "num"], ["norm", "Norm after", "num"], ["ratio", "ratio", "num"],
    ["also", "also in", "num"], ["also_names", "e.g."]], null, "jumps") : el("p", {class: "note", text: "none"}));
  if (L.jumps.length === L.limit) box.append(el("p", {class: "note", text: `the ${L.limit} largest kept`}));
}

function main() {
  const D = readData();
  document.getElementById("title").textContent = `msprobe report: ${D.dump_path}`;
  overview(D, document.getElementById("overview"));
  const pickRank = document.getElementById("rank"), pickStep = document.getElementById("step");
  const detail = D.detail_ranks || D.ranks;
  for (const r of detail) pickRank.append(el("option", {value: String(r), text: `rank ${r}`}));
  const state = {};
  const fillSteps = () => {
    const R = D.per_rank[pickRank.value], keep = pickStep.value;
    pickStep.replaceChildren();
    for (const s of R.graph.steps) pickStep.append(el("option", {value: String(s), text: `step ${s}`}));
    const o = R.nonfinite.origin || R.nonfinite.first_tensor;
    if (R.graph.steps.map(String).includes(keep)) pickStep.value = keep;
    else if (o && R.graph.steps.includes(o.step)) pickStep.value = String(o.step);   // where the NaN hunt starts
  };
  const draw = () => {
    const ids = ["graph-section", "trends", "tree", "largest"];
    for (const id of ids) document.getElementById(id).replaceChildren();
    if (!detail.length || pickStep.value === "") return;
    const rank = pickRank.value, step = Number(pickStep.value);
    graphSection(D, rank, step, document.getElementById("graph-section"), state);
    trends(D, rank, step, document.getElementById("trends"));
    moduleTree(D, rank, step, document.getElementById("tree"));
    largest(D, document.getElementById("largest"), rank, step, state);
  };
  pickRank.addEventListener("change", () => { fillSteps(); draw(); });
  pickStep.addEventListener("change", draw);
  if (detail.length) fillSteps();
  draw();
  document.body.dataset.readyMs = String(Math.round(performance.now()));   // since navigation start
  document.body.dataset.ready = "1";
}
main();
