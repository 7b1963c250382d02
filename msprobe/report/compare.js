// `msprobe compare`'s report.html (data: msprobe.compare.report._ranks).
"use strict";

const VERDICT_COLOURS = {pass: "#4caf50", propagated: "#f0b400", origin: "#d32f2f", unpaired: "#7e57c2"};

function describe(label, f, cls) {
  if (!f) return null;
  return el("div", {class: cls},
    el("p", {}, el("b", {text: label + ": "}), el("code", {class: "call-name", text: f.name}),
       ` (step ${f.step}, ${f.direction}) in ${f.module || "(top level)"}` + (f.reason ? ` — ${f.reason}` : "")),
    stackBlock(f.stack));
}

function compareRank(D, R, box) {
  box.append(el("h2", {text: `rank ${R.rank}`}));
  const counts = Object.entries(R.counts).map(([verdict, n]) => ({verdict, n}));
  box.append(table(counts, [["verdict", "verdict"], ["n", "calls", "num"]]));
  const o = describe("first origin", R.first_origin, "first-origin");
  const d = describe("first diverged", R.first_diverged, "first-diverged");
  if (!o && !d) box.append(el("p", {class: "ok", text: "no divergence"}));
  if (o) box.append(o);
  if (d) box.append(d);

  box.append(el("h3", {text: "Largest relative error per call"}));
  if (R.plot.length < R.calls_total) box.append(el("p", {class: "note aggregated",
    text: `Aggregated: ${R.plot.length} of ${R.calls_total} calls drawn (every non-pass call; pass calls evenly sampled).`}));
  const chart = el("div", {class: "chart e-plot"}); box.append(chart);
  const series = Object.entries(VERDICT_COLOURS).map(([verdict, colour]) => ({label: verdict, colour,
    points: R.plot.filter((p) => p[2] === verdict).map((p) => [p[0], p[1], `${p[3]} (step ${p[4]}): ${verdict}, e = ${fmt(p[1])}`])}));
  plot(chart, series, {xLabel: "call (execution order, all steps)", yLabel: "largest relative error e (log scale)",
    logY: true, integerX: true, legend: true, marks: R.origin_index === null ? [] : [R.origin_index]});
  chart.append(el("p", {class: "note", text: "e = 0 is drawn on the x axis, infinite e at the top; the dashed line marks the first origin (or the first diverged call)."}));

  box.append(el("h3", {text: "Module tree"}));
  const first = R.first_origin || R.first_diverged, path = new Set();
  if (first) {
    const parent = new Map(R.tree.map((n) => [n.name, n.parent]));
    for (let n = first.name; n && !path.has(n); n = parent.get(n)) path.add(n);
  }
  box.append(el("p", {class: "note", text: `Modules of step ${R.tree_step}` + (first ? "; the path to " + first.name + " is marked in red." : ".")}));
  tree(box, R.tree, (n) => n.name, (n) => `${n.verdict} · e ${fmt(n.e)}`, first ? path : null);

  box.append(el("h3", {text: "Calls that did not pass"}));
  if (R.non_pass > R.rows.length) box.append(el("p", {class: "note", text: `the first ${R.rows.length} of ${R.non_pass}`}));
  const anchor = (r) => `stack-${R.rank}-${r.stack_id}`;
  if (R.rows.length) {
    const t = table(R.rows, [["step", "step", "num"], ["t_name", "call (target; the baseline's when it differs; module)"],
      ["verdict", "verdict"], ["e", "e", "num"], ["reason", "reason"], ["stack_id", "stack"]],
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
      });
    t.classList.add("calls");
    box.append(t);
  } else box.append(el("p", {class: "note", text: "none"}));
  const stacks = Object.entries(R.stacks);
  if (stacks.length) {
    box.append(el("h3", {text: "Stacks of the calls above"}));
    for (const [id, frames] of stacks) box.append(el("pre", {id: `stack-${R.rank}-${id}`, class: "stack", text: frames.join("\n")}));
  }
}

function main() {
  const D = readData();
  document.getElementById("title").textContent = `msprobe compare: ${D.verdict} (mode ${D.mode})`;
  const box = document.getElementById("compare");
  if (D.incomplete && D.incomplete.length) {
    // what was not compared: the verdict covers the rest only
    box.append(el("p", {class: "bad", id: "incomplete", text: "Not compared (the answer is incomplete):"}),
               el("ul", {class: "note"}, ...D.incomplete.map((n) => el("li", {text: n}))));
  }
  if (D.notes.length) box.append(el("ul", {class: "note"}, ...D.notes.map((n) => el("li", {text: n}))));
  for (const R of D.ranks) compareRank(D, R, box);
  document.body.dataset.ready = "1";
}
main();
