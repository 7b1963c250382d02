// `msprobe report`: overview, trends, module tree, largest values (data: msprobe.report.data.collect).
"use strict";

const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
                 "#7f7f7f", "#bcbd22"];

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
  box.append(el("h3", {text: "First NaN/Inf per rank"}));
  for (const rank of D.ranks) {
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
  box.append(el("h3", {text: "Entries and tensors per step"}));
  const byStep = new Map();
  for (const r of D.per_step) { const s = byStep.get(r.step) || {step: r.step, entries: 0, tensors: 0}; s.entries += r.entries; s.tensors += r.tensors; byStep.set(r.step, s); }
  const rows = [...byStep.values()].sort((a, b) => a.step - b.step);
  plot(box, [{label: "entries", colour: COLOURS[0], points: rows.map((r) => [r.step, r.entries, `step ${r.step}: ${r.entries} entries`])},
             {label: "tensors", colour: COLOURS[1], points: rows.map((r) => [r.step, r.tensors, `step ${r.step}: ${r.tensors} tensors`])}],
       {xLabel: "step", yLabel: "count (all ranks)", lines: true, height: 200, integerX: true, zeroY: true});
}

function trends(D, rank, box) {
  const R = D.per_rank[rank];
  const note = (h) => {
    const parts = [];
    if (h.rows.length < h.rows_total) parts.push(`${h.rows.length} of ${h.rows_total} ${D.rows_are} shown (evenly spaced in execution order)`);
    if (h.bin > 1) parts.push(`steps binned by ${h.bin} (${h.steps_total} steps in ${h.columns.length} columns; each cell shows the bin's largest value)`);
    return parts.length ? el("p", {class: "note aggregated", text: "Aggregated: " + parts.join("; ") + "."}) : null;
  };
  box.append(el("h3", {text: `Output Norm per step and ${D.rows_are === "modules" ? "module" : "API call"}`}),
    el("p", {class: "note", text: `Each cell: the L2 norm of all forward output tensors of the ${D.rows_are === "modules" ? "module" : "API call"} in that step (sqrt of the sum of squared Norms).`}));
  const n1 = note(R.output); if (n1) box.append(n1);
  const h1 = el("div", {class: "chart", id: "heat-output"}); box.append(h1);
  heatmap(h1, R.output, D.rows_are === "modules" ? "module" : "API", "output Norm");
  box.append(el("h3", {text: "Parameter-gradient Norm per step and module"}),
    el("p", {class: "note", text: "Each cell: the L2 norm of the gradients of the module's own parameters in that step."}));
  const n2 = note(R.grad); if (n2) box.append(n2);
  const h2 = el("div", {class: "chart", id: "heat-grad"}); box.append(h2);
  heatmap(h2, R.grad, "module", "gradient Norm");
  box.append(el("h3", {text: "Largest movers: parameter-gradient Norm over steps"}),
    el("p", {class: "note", text: `The ${R.movers.length} parameters whose gradient Norm spans the largest ratio max/min over the steps.`}));
  const m = el("div", {class: "chart", id: "movers"}); box.append(m);
  plot(m, R.movers.map((line, k) => ({label: `${line.param} (×${fmt(line.ratio)})`, colour: COLOURS[k % COLOURS.length],
    points: line.steps.map((s, i) => [s, line.norms[i], `${line.param}\nstep ${s}: ${fmt(line.norms[i])}`])})),
    {xLabel: "step", yLabel: "gradient Norm (log scale)", logY: true, lines: true, legend: true, integerX: true});
}

function moduleTree(D, rank, box) {
  const T = D.per_rank[rank].tree;
  if (!T.nodes.length) { box.append(el("p", {class: "note", text: "no forward entries"})); return; }
  box.append(el("p", {class: "note", text: `construct.json of step ${T.step} (rank ${rank}): ${T.nodes.length} nodes` +
    (T.nodes.length < T.total ? ` of ${T.total} (API calls left out above ${D.limits.max_tree} nodes)` : "") +
    ". Per node: output Norm (L2 over output tensors), largest |value| of the outputs. Click a node to expand it."}));
  tree(box, T.nodes, (n) => n.name,
       (n) => `Norm ${fmt(n.norm)} · max|x| ${fmt(n.absmax)}${n.nonfinite ? " · NaN/Inf" : ""}`, null);
}

function largest(D, box) {
  const L = D.largest;
  box.append(el("h3", {text: `Values with |Max| or |Min| ≥ ${fmt(L.threshold)}`}));
  box.append(el("p", {class: "note", text: "One row per tensor (rank, entry, io, arg) over all steps: the steps where it reaches the threshold, the first of them, its largest Max and smallest Min there."}));
  box.append(L.extremes.length ? table(L.extremes, [["rank", "rank", "num"], ["name", "entry"], ["io", "io"], ["arg", "arg"],
    ["steps", "steps", "num"], ["first_step", "first step", "num"], ["max", "Max", "num"], ["min", "Min", "num"]]) : el("p", {class: "note", text: "none"}));
  if (L.extremes.length === L.limit) box.append(el("p", {class: "note", text: `the ${L.limit} largest shown`}));
  box.append(el("h3", {text: `Norm jumps (×${fmt(L.jump)} or more between recorded steps)`}));
  box.append(L.jumps.length ? table(L.jumps, [["rank", "rank", "num"], ["previous_step", "from step", "num"], ["step", "to step", "num"], ["name", "entry"],
    ["io", "io"], ["arg", "arg"], ["previous", "Norm before", "num"], ["norm", "Norm after", "num"], ["ratio", "ratio", "num"]]) : el("p", {class: "note", text: "none"}));
}

function main() {
  const D = readData();
  document.getElementById("title").textContent = `msprobe report: ${D.dump_path}`;
  overview(D, document.getElementById("overview"));
  const pick = document.getElementById("rank");
  for (const r of D.ranks) pick.append(el("option", {value: String(r), text: `rank ${r}`}));
  const draw = () => {
    const t = document.getElementById("trends"), m = document.getElementById("tree");
    t.replaceChildren(); m.replaceChildren();
    if (!D.ranks.length) return;
    trends(D, pick.value, t); moduleTree(D, pick.value, m);
  };
  pick.addEventListener("change", draw);
  draw();
  largest(D, document.getElementById("largest"));
  document.body.dataset.ready = "1";
}
main();
