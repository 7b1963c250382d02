// Model graph of msprobe report pages: the module/Cell hierarchy of one step as nested,
// collapsible boxes, laid out by dagre (vendor/dagre.min.js, @dagrejs/dagre, MIT). An expanded
// module is a box holding its own node (at the top) and its children; the arrows join the
// visible calls in call order (the data flow of a forward pass). Only what is open is laid
// out: a run of more than GRAPH_API_RUN API calls in one module is one group, and more than
// GRAPH_CHUNK items are shown in groups of GRAPH_CHUNK (groups of groups beyond GRAPH_CHUNK
// groups), each opened on a click. "expand all" opens level by level while at most
// GRAPH_MAX_SHOWN boxes are shown (a layout of more takes seconds).
"use strict";

const GRAPH_CHUNK = 40, GRAPH_API_RUN = 5, GRAPH_MAX_SHOWN = 400;

// "Module.layers.0.self_attn.MultiheadAttention.forward.0" -> ["layers.0.self_attn", "MultiheadAttention"];
// "Torch.relu.1.forward" -> ["Torch.relu.1", ""]
function graphLabel(name) {
  const m = /^(Module|Cell)\.(.*)\.([^.]+)\.(forward|backward)\.(\d+)$/.exec(name);
  if (m) {
    const parts = m[2].split(".");
    let path = parts[parts.length - 1];
    if (/^\d+$/.test(path) && parts.length > 1) path = parts[parts.length - 2] + "." + path;
    return [path + (m[5] !== "0" ? ` (call ${m[5]})` : ""), m[3]];
  }
  return [name.replace(/\.(forward|backward)$/, ""), ""];
}

// modelGraph(container, opts) -> {setNodes, redraw, expand, expandAll, collapseAll, select, search}
// opts.colour(node) -> fill colour; opts.onSelect(node); opts.title(node) -> hover text;
// opts.nodeClass(node) -> extra class names of the node's <g>.
// nodes: [{name, parent (name or null), kind}] in call order. The SVG's <g class="node">
// elements carry data-name; the container's data-nodes is the number of nodes given.
function modelGraph(container, opts) {
  const bar = el("div", {class: "graph-bar"});
  const search = el("input", {type: "search", placeholder: "search names (Enter: next match)", class: "graph-search", size: "36"});
  const hits = el("span", {class: "note graph-hits"});
  const bExpand = el("button", {text: "expand all"}), bCollapse = el("button", {text: "collapse all"}), bFit = el("button", {text: "fit"});
  const capNote = el("span", {class: "note graph-cap"});
  bar.append(search, " ", bExpand, " ", bCollapse, " ", bFit, " ", hits, " ", capNote);
  const view = el("div", {class: "graph-view"});
  const svg = svgEl("svg", {class: "graph-svg"});
  const defs = svgEl("defs");
  const marker = svgEl("marker", {id: "graph-arrow", viewBox: "0 0 10 10", refX: "10", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse"});
  marker.append(svgEl("path", {d: "M0,0L10,5L0,10z", fill: "#888"}));
  defs.append(marker);
  const layer = svgEl("g");
  svg.append(defs, layer);
  view.append(svg);
  container.append(bar, view);
  let nodes = [], byName = new Map(), kids = new Map(), roots = [];
  const expanded = new Set(), openGroups = new Set();
  let selected = null, matches = [], matchAt = -1, tx = 10, ty = 10, scale = 1, boxes = new Map(), size = [0, 0];

  function applyTransform() { layer.setAttribute("transform", `translate(${tx},${ty}) scale(${scale})`); }

  function setNodes(list) {
    nodes = list; byName = new Map(list.map((n) => [n.name, n])); kids = new Map(); roots = [];
    for (const n of list) {
      if (n.parent !== null && n.parent !== undefined && n.parent !== n.name && byName.has(n.parent)) {
        if (!kids.has(n.parent)) kids.set(n.parent, []);
        kids.get(n.parent).push(n);
      } else roots.push(n);
    }
    container.dataset.nodes = String(list.length);
  }

  // groups of at most GRAPH_CHUNK items (groups of groups when there are more than GRAPH_CHUNK groups)
  function chunk(parentId, list) {
    if (list.length <= GRAPH_CHUNK) return list;
    const size = Math.pow(GRAPH_CHUNK, Math.ceil(Math.log(list.length) / Math.log(GRAPH_CHUNK)) - 1);
    const out = [];
    for (let i = 0; i < list.length; i += size) {
      const part = list.slice(i, i + size);
      const count = part.reduce((s, p) => s + (p.group ? p.count : 1), 0);
      out.push({group: true, id: `${parentId}#${i}`, members: chunk(`${parentId}#${i}`, part), count,
        label: [`calls ${i + 1}–${i + part.length} of ${list.length}`, `${count} calls`]});
    }
    return out;
  }

  // the items shown in one container: nodes, and groups of them ({group, id, members, count})
  function items(parentId, children) {
    const out = [];
    let run = [];
    const flush = () => {
      if (run.length > GRAPH_API_RUN) {
        const id = `${parentId}#api${out.length}`;
        out.push({group: true, id, members: chunk(id, run), count: run.length,
          label: [`${run.length} API calls`, `${graphLabel(run[0].name)[0]} … ${graphLabel(run[run.length - 1].name)[0]}`]});
      } else out.push(...run);
      run = [];
    };
    for (const c of children) {
      if (c.kind === "api_forward" && !kids.has(c.name)) { run.push(c); continue; }
      flush(); out.push(c);
    }
    flush();
    return chunk(parentId, out);
  }

  function nodeSize(label) {
    const w = Math.max(label[0].length * 6.6, label[1].length * 6.2) + 30;
    return [Math.max(60, Math.min(w, 320)), label[1] ? 34 : 22];
  }

  function layout() {
    const g = new dagre.graphlib.Graph({compound: true, multigraph: false});
    g.setGraph({rankdir: "TB", nodesep: 12, ranksep: 16, marginx: 4, marginy: 4});
    g.setDefaultEdgeLabel(() => ({}));
    const order = [];   // visible boxes (leaves of the layout) in call order
    const info = new Map();
    function add(item, parentCluster) {
      if (item.group) {
        const open = openGroups.has(item.id);
        if (!open) {
          const id = "g:" + item.id, [w, h] = nodeSize(item.label);
          g.setNode(id, {width: w, height: h}); if (parentCluster) g.setParent(id, parentCluster);
          info.set(id, {kind: "group", item}); order.push(id);
          return;
        }
        const cid = "c:" + item.id;
        g.setNode(cid, {}); if (parentCluster) g.setParent(cid, parentCluster);
        info.set(cid, {kind: "cluster", item});
        const head = "g:" + item.id, [w, h] = nodeSize(item.label);
        g.setNode(head, {width: w, height: h}); g.setParent(head, cid);
        info.set(head, {kind: "group", item, open: true}); order.push(head);
        for (const m of item.members) add(m, cid);
        return;
      }
      const n = item, id = "n:" + n.name, label = graphLabel(n.name), [w, h] = nodeSize(label);
      const children = kids.get(n.name) || [];
      if (children.length && expanded.has(n.name)) {
        const cid = "c:" + n.name;
        g.setNode(cid, {}); if (parentCluster) g.setParent(cid, parentCluster);
        info.set(cid, {kind: "cluster", node: n});
        g.setNode(id, {width: w, height: h}); g.setParent(id, cid);
        info.set(id, {kind: "node", node: n, label, open: true, children: children.length}); order.push(id);
        for (const c of items(n.name, children)) add(c, cid);
      } else {
        g.setNode(id, {width: w, height: h}); if (parentCluster) g.setParent(id, parentCluster);
        info.set(id, {kind: "node", node: n, label, open: false, children: children.length}); order.push(id);
      }
    }
    for (const r of items("", roots)) add(r, null);
    for (let i = 1; i < order.length; i++) g.setEdge(order[i - 1], order[i]);
    dagre.layout(g);
    return {g, info, order};
  }

  function redraw() {
    const {g, info} = layout();
    layer.replaceChildren(); boxes = new Map();
    const clusters = [], leaves = [];
    for (const id of g.nodes()) (info.get(id).kind === "cluster" ? clusters : leaves).push(id);
    const depth = (id) => { let d = 0; for (let p = g.parent(id); p; p = g.parent(p)) d++; return d; };
    clusters.sort((a, b) => depth(a) - depth(b));
    for (const id of clusters) {
      const b = g.node(id), it = info.get(id);
      layer.append(svgEl("rect", {x: b.x - b.width / 2, y: b.y - b.height / 2, width: b.width, height: b.height, rx: 6,
        class: "cluster", "data-name": it.node ? it.node.name : it.item.id}));
    }
    for (const e of g.edges()) {
      const pts = g.edge(e).points;
      layer.append(svgEl("path", {d: pts.map((p, k) => `${k ? "L" : "M"}${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(""),
        class: "flow", "marker-end": "url(#graph-arrow)"}));
    }
    for (const id of leaves) {
      const b = g.node(id), it = info.get(id), x = b.x - b.width / 2, y = b.y - b.height / 2;
      const box = svgEl("g", {transform: `translate(${x},${y})`});
      if (it.kind === "group") {
        box.setAttribute("class", "group" + (it.open ? " open" : ""));
        box.dataset.group = it.item.id;
        box.append(svgEl("rect", {width: b.width, height: b.height, rx: 4}));
        box.append(svgEl("text", {x: 22, y: 14, class: "l1"}, it.item.label[0]));
        if (it.item.label[1]) box.append(svgEl("text", {x: 22, y: 28, class: "l2"}, it.item.label[1]));
        box.append(toggle(it.open));
        box.addEventListener("click", () => { if (openGroups.has(it.item.id)) openGroups.delete(it.item.id); else openGroups.add(it.item.id); redraw(); });
      } else {
        const n = it.node;
        box.setAttribute("class", "node" + (n.kind === "api_forward" ? " api" : "") + (n.name === selected ? " selected" : "") +
          (matches.includes(n.name) ? " hit" : "") + (opts.nodeClass ? " " + opts.nodeClass(n) : ""));
        box.dataset.name = n.name;
        const fill = opts.colour(n);
        const r = svgEl("rect", {width: b.width, height: b.height, rx: n.kind === "api_forward" ? 10 : 3, fill});
        box.append(r);
        const dark = isDark(fill);
        box.append(svgEl("text", {x: it.children ? 22 : 8, y: 14, class: "l1" + (dark ? " dark" : "")}, it.label[0]));
        if (it.label[1]) box.append(svgEl("text", {x: it.children ? 22 : 8, y: 28, class: "l2" + (dark ? " dark" : "")}, it.label[1]));
        box.append(svgEl("title", {}, opts.title ? opts.title(n) : n.name));
        if (it.children) {
          const t = toggle(it.open);
          t.addEventListener("click", (ev) => { ev.stopPropagation(); if (expanded.has(n.name)) expanded.delete(n.name); else expanded.add(n.name); redraw(); });
          box.append(t);
        }
        box.addEventListener("click", () => select(n.name));
      }
      boxes.set(id, b);
      layer.append(box);
    }
    const gg = g.graph();
    size = [gg.width || 0, gg.height || 0];
    applyTransform();
  }

  function toggle(open) {
    const t = svgEl("g", {class: "toggle", transform: "translate(4,4)"});
    t.append(svgEl("rect", {width: 13, height: 13, rx: 2}), svgEl("text", {x: 6.5, y: 10.5}, open ? "−" : "+"));
    return t;
  }

  function isDark(colour) {
    const m = /rgb\((\d+),(\d+),(\d+)\)/.exec(colour || "") || /^#(..)(..)(..)$/.exec(colour || "");
    if (!m) return false;
    const v = m[0].startsWith("#") ? m.slice(1, 4).map((h) => parseInt(h, 16)) : m.slice(1, 4).map(Number);
    return 0.299 * v[0] + 0.587 * v[1] + 0.114 * v[2] < 120;
  }

  function parentOf(name) { const n = byName.get(name); return n && byName.has(n.parent) ? n.parent : null; }
  function reveal(name) {   // open every ancestor of the node and the groups on the way to it
    const anc = new Set();
    for (let p = parentOf(name); p && !anc.has(p); p = parentOf(p)) anc.add(p);
    for (const a of anc) expanded.add(a);
    const holds = (it) => it.group ? it.members.some(holds) : (it.name === name || anc.has(it.name));
    const walk = (list) => {
      for (const it of list) {
        if (!holds(it)) continue;
        if (it.group) { openGroups.add(it.id); walk(it.members); } else if (anc.has(it.name)) walk(items(it.name, kids.get(it.name) || []));
      }
    };
    walk(items("", roots));
  }

  function centre(name) {
    const b = boxes.get("n:" + name);
    if (!b) return;
    const w = view.clientWidth || 900, h = view.clientHeight || 600;
    tx = w / 2 - b.x * scale; ty = h / 2 - b.y * scale; applyTransform();
  }

  function select(name, quiet) {
    selected = name;
    for (const e of layer.querySelectorAll(".node.selected")) e.classList.remove("selected");
    const e = layer.querySelector(`.node[data-name="${CSS.escape(name)}"]`);
    if (e) e.classList.add("selected");
    if (!quiet && byName.has(name)) opts.onSelect(byName.get(name));
  }

  function fit() {
    const w = view.clientWidth || 900, h = view.clientHeight || 600;
    scale = Math.min(1, (w - 20) / Math.max(size[0], 1), (h - 20) / Math.max(size[1], 1));
    scale = Math.max(scale, 0.05);
    tx = (w - size[0] * scale) / 2; ty = 10; applyTransform();
  }

  function runSearch() {
    const q = search.value.trim().toLowerCase();
    matches = q ? nodes.filter((n) => n.name.toLowerCase().includes(q)).map((n) => n.name) : [];
    for (const m of matches.slice(0, 200)) reveal(m);
    matchAt = -1;
    hits.textContent = q ? `${matches.length} match${matches.length === 1 ? "" : "es"}` + (matches.length > 200 ? " (the first 200 opened)" : "") : "";
    redraw();
  }
  search.addEventListener("input", runSearch);
  search.addEventListener("keydown", (ev) => {
    if (ev.key !== "Enter" || !matches.length) return;
    matchAt = (matchAt + 1) % matches.length; centre(matches[matchAt]); select(matches[matchAt]);
  });
  bExpand.onclick = () => {
    const capped = expandAll();
    capNote.textContent = capped ? `expand all stopped at ${GRAPH_MAX_SHOWN} boxes: open the groups and modules still closed with their +` : "";
    redraw(); fit();
  };
  bCollapse.onclick = () => { expanded.clear(); openGroups.clear(); capNote.textContent = ""; redraw(); fit(); };
  bFit.onclick = fit;
  // open modules and groups breadth first while at most GRAPH_MAX_SHOWN boxes are shown;
  // returns true when it stopped early
  function expandAll() {
    expanded.clear(); openGroups.clear();
    let frontier = items("", roots), shown = frontier.length;
    while (frontier.length) {
      const next = [];
      for (const it of frontier) {
        const inner = it.group ? it.members : kids.has(it.name) ? items(it.name, kids.get(it.name)) : null;
        if (!inner) continue;
        if (shown + inner.length > GRAPH_MAX_SHOWN) return true;
        shown += inner.length;
        if (it.group) openGroups.add(it.id); else expanded.add(it.name);
        next.push(...inner);
      }
      frontier = next;
    }
    return false;
  }

  // pan with the mouse, zoom with the wheel (around the pointer)
  let drag = null;
  svg.addEventListener("mousedown", (ev) => { drag = [ev.clientX - tx, ev.clientY - ty]; });
  window.addEventListener("mouseup", () => { drag = null; });
  svg.addEventListener("mousemove", (ev) => { if (drag && ev.buttons) { tx = ev.clientX - drag[0]; ty = ev.clientY - drag[1]; applyTransform(); } });
  svg.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const b = svg.getBoundingClientRect(), px = ev.clientX - b.left, py = ev.clientY - b.top;
    const k = Math.exp(-ev.deltaY * 0.0015), s = Math.min(3, Math.max(0.05, scale * k));
    tx = px - (px - tx) * s / scale; ty = py - (py - ty) * s / scale; scale = s; applyTransform();
  }, {passive: false});

  return {
    setNodes, redraw, fit, select, centre,
    expand(name) { expanded.add(name); reveal(name); redraw(); },
    reveal(name) { reveal(name); redraw(); },
    expandRoots(limit) { if (roots.length <= limit) for (const r of roots) if (kids.has(r.name)) expanded.add(r.name); },
    get selected() { return selected; },
  };
}
