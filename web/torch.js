// PyTorch snapshots: the list (upload, compare), one snapshot (timeline with server-side level of detail, the
// allocator state at any entry, the OOM card, the peak by call site) and the diff of two. Names from snapshots
// are data: always text, never markup.
import { listTraces, uploadSnapshot, torchSummary, torchTimeline, torchEntry, torchOom, torchPeak, torchState,
  torchDiff, torchFlame, torchRanks, torchLive } from "./api.js";
import { $, el, clear, enc, bytesEl, exactEl, fmtBytes, fmtInt, topNav, nameColor, allocColor, plotConfig, plotTheme, loading, loaded,
  urlParam, FREE_COLOR, fact, pct, plotlyReady, plotlyAfter, afterPaint } from "./common.js";
import { plotText, byteTicks, PLOTLY_WAIT_MS } from "./memmap.js";
import { sketchFigure } from "./sketch.js";
import { errorPage, problem, isTraceId } from "./errors.js";
import { mountWhatIf } from "./whatif.js";

const setStatus = (msg, bad) => { const s = $("status"); s.textContent = msg || ""; s.className = bad ? "status error" : "status"; };
const BLOCK_COLORS = { allocated: "#4c78a8", pending_free: "#f58518", free: "#54a24b" };

/** A table of rows of cells (strings or nodes); `numeric` lists the right-aligned columns; the last is a call site. */
function table(head, rows, numeric = []) {
  return el("table", { class: "data" },
    el("thead", {}, el("tr", {}, head.map((h, i) => el("th", { class: numeric.includes(i) ? "num" : null }, h)))),
    el("tbody", {}, rows.map((r) => el("tr", {}, r.map((c, i) => el("td", { class: numeric.includes(i) ? "num" : (i === r.length - 1 ? "site" : null) }, c))))));
}

/** Labels along an axis that never print over each other: `place(row, x, text, bandLo, bandHi)` says whether a
 * label centred at x (about 6 px a character at 10 px) fits inside its band and clear of the labels placed before
 * in the same row; the axis spans [lo, hi] over `px` pixels. */
function labelPlacer(lo, hi, px) {
  const scale = px / Math.max(1, hi - lo), rows = {};
  return (row, x, text, bandLo, bandHi) => {
    const half = (String(text).length * 6 + 8) / 2, c = (x - lo) * scale;
    const a = c - half, b = c + half;
    if (Number.isFinite(bandLo) && (a < (bandLo - lo) * scale || b > (bandHi - lo) * scale)) return false;
    const taken = rows[row] || (rows[row] = []);
    if (taken.some(([p, q]) => a < q && p < b)) return false;
    taken.push([a, b]);
    return true;
  };
}

/** Plotly's layout frame in the page's theme. */
function themed(theme, layout) {
  const axis = { gridcolor: theme.grid, zeroline: false, color: theme.muted };
  return { paper_bgcolor: theme.paper, plot_bgcolor: theme.plot, font: { family: "system-ui, sans-serif", size: 12, color: theme.ink },
    ...layout, xaxis: { ...axis, ...layout.xaxis }, yaxis: { ...axis, ...layout.yaxis } };
}
/** The largest number in some arrays (nulls count as 0; no spread, so long arrays are fine). */
const most = (...arrays) => arrays.reduce((m, a) => a.reduce((x, y) => Math.max(x, y || 0), m), 1);
const bytesAxis = (top) => { const t = byteTicks(0, Math.max(1, top), 6); return { tickvals: t.tickvals, ticktext: t.ticktext }; };

// ---------------------------------------------------------------------------------------- the list
async function home() {
  $("home").hidden = false;
  loading($("list"), "Loading the snapshots…");
  const mine = (await listTraces()).filter((t) => t.source === "torch");
  loaded($("list"));
  const list = clear($("list"));
  if (!mine.length) list.append(el("p", { class: "empty" }, "No snapshots yet."));
  else list.append(table(["name", "devices", "entries", "peak requested", "peak reserved", "OOM"],
    mine.map((t) => [el("a", { href: `/torch?id=${enc(t.id)}` }, t.name), String(t.graphs.length),
      fmtInt(t.graphs.reduce((s, g) => s + g.n_events, 0)), bytesEl(Math.max(...t.graphs.map((g) => g.max_size || 0))),
      bytesEl(Math.max(...t.graphs.map((g) => g.buffer_size || 0))), t.graphs.some((g) => g.oom) ? "yes" : "–"]), [2, 3, 4]));
  for (const sel of [$("diff-a"), $("diff-b")]) {
    clear(sel);
    for (const t of mine) sel.append(el("option", { value: t.id }, `${t.name} (${t.id})`));
  }
  if (mine.length > 1) $("diff-b").selectedIndex = 1;
  $("diff-form").addEventListener("submit", (e) => {
    e.preventDefault();
    location.assign(`/torch?a=${enc($("diff-a").value)}&b=${enc($("diff-b").value)}`);
  });
  $("upload-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const f = $("upload-file").files[0];
    if (!f) return;
    setStatus("Uploading…");
    try { location.assign(`/torch?id=${enc((await uploadSnapshot(f))[0].id)}`); } catch (err) { setStatus(err.message, true); }
  });
}

// ---------------------------------------------------------------------------------------- one snapshot
/** One device of one snapshot: its views share the frames to skip and the peak entry. */
class SnapshotView {
  constructor(id, d, dev) {
    this.id = id; this.d = d; this.dev = dev; this.skip = null; this.peakEvent = dev.peak_requested_event || 0;
    this.at = null; this.asked = 0;  // the entry the state shows (null: the start); the latest state asked for
  }

  /** The line through the timeline at the entry the state shows. */
  scrubLine() {
    return { type: "line", xref: "x", yref: "paper", x0: this.at, x1: this.at, y0: 0, y1: 1, name: "scrub",
      line: { color: plotTheme().ink, width: 1.5, dash: "dash" } };
  }

  markTimeline() {
    const div = $("timeline");
    if (!div.layout || !window.Plotly) return;
    const shapes = (div.layout.shapes || []).filter((x) => x.name !== "scrub");
    if (this.at !== null) shapes.push(this.scrubLine());
    window.Plotly.relayout(div, { shapes });
  }

  /** The slider under the timeline: dragging shows the entry at once, asks for its state once it rests. */
  wireScrub() {
    const input = $("scrub");
    input.max = String(Math.max(0, this.dev.n_events - 1));
    let timer = null;
    input.addEventListener("input", () => {
      $("scrub-at").textContent = fmtInt(Number(input.value));
      clearTimeout(timer);
      timer = setTimeout(() => this.state(Number(input.value) + 1).catch((e) => setStatus(e.message, true)), 200);
    });
  }

  async live(k) {
    if (k <= 0) { clear($("live-top")); $("live-note").textContent = "Nothing is live before entry 0."; return; }
    const r = await torchLive(this.id, this.d, k - 1, this.skip);
    if (this.asked !== k) return;
    $("live-note").textContent = `The largest allocations live after entry ${fmtInt(r.after_entry)}, in their colours; click one for its stack.`;
    clear($("live-top")).append(table(["", "bytes", "made at entry", "call site"], r.largest.map((a) =>
      [el("span", { class: "swatch", style: `display:inline-block;width:12px;height:12px;background:${allocColor(a.entry)}` }),
        exactEl(a.bytes), el("a", { href: "#allocation", "data-entry": String(a.entry) }, fmtInt(a.entry)), a.site]), [1, 2]));
    $("live-top").querySelectorAll("a[data-entry]").forEach((a) => a.addEventListener("click", () =>
      this.allocation(Number(a.dataset.entry)).catch((e) => setStatus(e.message, true))));
    $("live-top").dataset.after = String(r.after_entry);
  }

  async timeline(x0, x1) {
    const t = await torchTimeline(this.id, this.d, { x0: x0 === undefined ? undefined : Math.max(0, Math.floor(x0)),
      x1: x1 === undefined ? undefined : Math.ceil(x1), skip: this.skip });
    const theme = plotTheme();
    const traces = [{ x: t.grid, y: t.allocated_max, name: "allocated (all)", type: "scatter", mode: "lines",
      line: { color: FREE_COLOR, width: 1 }, fill: "tozeroy", fillcolor: "rgba(142,150,163,0.25)", hoverinfo: "x+y" },
    { x: t.grid, y: t.reserved_max, name: "reserved", type: "scatter", mode: "lines", line: { color: theme.bad, width: 1, dash: "dot" } }];
    for (const b of t.bands) {
      const top = b.base.map((v) => v + b.size);
      const text = `${fmtBytes(b.size)} · entries ${b.alloc}–${b.free ?? "end"} · ${b.site}${b.meta ? ` · ${b.meta}` : ""}`;
      traces.push({ x: b.x.concat(b.x.slice().reverse()), y: b.base.concat(top.reverse()), type: "scatter", mode: "lines",
        fill: "toself", fillcolor: allocColor(b.alloc), line: { width: 0.5, color: theme.paper }, showlegend: false,
        hoveron: "fills", name: "", customdata: [b.alloc], hoverinfo: "text",
        text: [text, ...(b.stack || []).map((f) => `  ${f}`)].map(plotText).join("<br>") });
    }
    const shapes = [], annotations = [];
    const div = $("timeline");
    const lo = x0 === undefined ? t.x0 : x0, hi = x1 === undefined ? t.x1 : x1;
    const place = labelPlacer(lo, hi, Math.max(200, (div.clientWidth || 900) - 100));   // the plot area, about
    t.annotations.forEach((a, i) => {
      const ext = a.kind === "annotation";  // record_function ranges; the others are user metadata
      shapes.push({ type: "rect", xref: "x", yref: "paper", x0: a.x0, x1: a.x1, y0: ext ? 0.94 : 0.88, y1: ext ? 1.0 : 0.94,
        fillcolor: ext ? `rgba(76,120,168,${i % 2 ? 0.22 : 0.34})` : `rgba(238,202,59,${i % 2 ? 0.25 : 0.4})`, line: { width: 0 }, layer: "below" });
    });
    // a label only where it fits its band and leaves the labels already placed in its row alone; narrow (inner)
    // bands first, so a phase's name wins over the step around it
    const visible = (a) => Math.min(a.x1, hi) - Math.max(a.x0, lo);
    for (const a of t.annotations.slice().sort((p, q) => visible(p) - visible(q))) {
      const ext = a.kind === "annotation", x = (Math.max(a.x0, lo) + Math.min(a.x1, hi)) / 2;
      if (place(ext ? "ext" : "meta", x, a.name, Math.max(a.x0, lo), Math.min(a.x1, hi)))
        annotations.push({ x, y: ext ? 0.97 : 0.91, xref: "x", yref: "paper", text: plotText(a.name), showarrow: false,
          font: { size: 10, color: theme.ink }, hovertext: plotText(`${a.name}: entries ${a.x0}–${a.x1}`), name: "band-label" });
    }
    for (const k of this.dev.oom_events || []) {  // the OOM entries: a line through the chart, one label each where it fits
      if (k < lo || k > hi) continue;
      shapes.push({ type: "line", xref: "x", yref: "paper", x0: k, x1: k, y0: 0, y1: 0.86, line: { color: theme.bad, width: 2 }, name: "oom-line" });
      if (place("oom", k, "OOM", -Infinity, Infinity))
        annotations.push({ x: k, y: 0.84, xref: "x", yref: "paper", text: "OOM", showarrow: false,
          font: { size: 11, color: theme.bad }, hovertext: `out of memory at entry ${fmtInt(k)}`, name: "oom-label" });
    }
    div.dataset.oomMarks = String((this.dev.oom_events || []).filter((k) => k >= lo && k <= hi).length);
    const top = most(t.reserved_max, t.allocated_max);
    const layout = themed(theme, { margin: { l: 80, r: 20, t: 10, b: 40 }, xaxis: { title: { text: "trace entry" }, tickformat: ",d" },
      yaxis: { title: { text: "bytes" }, rangemode: "tozero", ...bytesAxis(top * 1.05) }, shapes, annotations, hovermode: "closest",
      showlegend: true, legend: { orientation: "h", y: -0.15 }, uirevision: "keep" });
    if (x0 !== undefined) layout.xaxis.range = [x0, x1];
    if (this.at !== null) shapes.push(this.scrubLine());
    if (this.cancelPlotly) { this.cancelPlotly(); this.cancelPlotly = null; }
    let sketch = null;
    if (!window.Plotly) {  // the first picture while Plotly.js loads: the same figure on a canvas
      sketch = sketchFigure(div, traces, layout);
      await afterPaint();
      Object.assign(div.dataset, { pictureAt: String(performance.now()), overview: "1" });
    }
    await (await plotlyReady()).react(div, traces, layout, plotConfig());
    if (sketch) sketch.remove();
    Object.assign(div.dataset, { bands: String(t.bands.length), x0: String(t.x0), x1: String(t.x1), ready: "1" });
    $("timeline-note").textContent = `Entries ${fmtInt(t.x0)}–${fmtInt(t.x1)} of ${fmtInt(t.n_events)}; ${t.bands.length} largest allocations drawn, ${fmtInt(t.omitted_allocations)} more only in the total.`;
  }

  /** Zooming asks the server for the window; a click shows an allocation's stack and the state there. */
  wireTimeline() {
    const div = $("timeline"), fail = (e) => setStatus(e.message, true);
    div.on("plotly_relayout", (ev) => {
      if (ev["xaxis.range[0]"] !== undefined) this.timeline(ev["xaxis.range[0]"], ev["xaxis.range[1]"]).catch(fail);
      else if (ev["xaxis.autorange"]) this.timeline().catch(fail);
    });
    div.on("plotly_click", (ev) => {
      if (!ev.points || !ev.points.length) return;
      const pt = ev.points[0], band = pt.data.customdata;
      if (band) this.allocation(band[0]).catch(fail);
      this.state(Math.round(band ? band[0] : pt.x) + 1).catch(fail);
    });
  }

  async allocation(k) {
    const e = await torchEntry(this.id, this.d, k, this.skip);
    const box = clear($("allocation"));
    box.hidden = false;
    if (!e) { box.append(el("p", { class: "empty" }, `No entry ${fmtInt(k)}.`)); return; }
    box.style.borderLeft = `6px solid ${allocColor(e.i)}`;
    box.dataset.color = allocColor(e.i);
    this.markFlame(e.flame_path || [], allocColor(e.i));
    box.append(el("h2", {}, `Allocation at entry ${fmtInt(e.i)}: ${fmtBytes(e.size)}`),
      el("p", {}, `${e.site}${e.meta ? ` · ${e.meta}` : ""} · address 0x${e.addr.toString(16)} · stream ${e.stream}`),
      e.frames.length ? el("ol", { class: "mono" }, e.frames.map((f) => el("li", {}, `${f.name}  ${f.filename}:${f.line}`)))
        : el("p", { class: "hint" }, "No Python frames (made on the autograd thread)."));
  }

  /** Outline an allocation's stack in the flamegraph in its colour (its kept frames, outermost first): the box
   * of each frame lies inside the box of its caller. Boxes of other allocations lose their mark. */
  markFlame(path, color) {
    this.marked = { path, color };
    const gs = [...$("flame").querySelectorAll("g[data-depth]")];
    for (const g of gs) { g.removeAttribute("data-marked"); g.querySelector("rect").removeAttribute("stroke"); }
    const boxOf = (g) => { const r = g.querySelector("rect"); return [Number(r.dataset.x ?? r.getAttribute("x")), Number(r.dataset.w ?? r.getAttribute("width"))]; };
    let lo = -Infinity, hi = Infinity, n = 0;
    path.forEach((name, i) => {
      if (n !== i) return;
      const g = gs.find((x) => Number(x.dataset.depth) === i + 1 && x.dataset.name === name && (() => {
        const [a, w] = boxOf(x);
        return a >= lo - 0.01 && a + w <= hi + 0.01;
      })());
      if (!g) return;
      const r = g.querySelector("rect");
      [lo, hi] = boxOf(g); hi += lo;
      r.setAttribute("stroke", color); r.setAttribute("stroke-width", "3");
      g.dataset.marked = color;
      n += 1;
    });
    $("flame").dataset.marked = String(n);
  }

  /** Zoom the flamegraph into a box (null: the whole graph): it and its callees fill the width, its callers
   * span it below, the rest is hidden; the breadcrumbs lead back. Drawn in the page, from the boxes the server
   * drew (a box too narrow to draw at full width stays absent). */
  zoomFlame(target) {
    const svg = $("flame").querySelector("svg");
    if (!svg) return;
    const gs = [...svg.querySelectorAll("g[data-depth]")], full = svg.viewBox.baseVal.width;
    const box = (g) => { const r = g.querySelector("rect"); r.dataset.x ??= r.getAttribute("x"); r.dataset.w ??= r.getAttribute("width");
      return [Number(r.dataset.x), Number(r.dataset.w)]; };
    const root = gs.find((g) => g.dataset.depth === "0");
    if (!root) return;
    const [pad] = box(root), span = full - 2 * pad;
    const [bx, bw] = box(target || root), depth = Number((target || root).dataset.depth), scale = span / Math.max(bw, 1e-9);
    const inside = (x, w) => x >= bx - 0.01 && x + w <= bx + bw + 0.01;
    const chain = [];
    for (const g of gs) {
      const [x, w] = box(g), d = Number(g.dataset.depth), r = g.querySelector("rect"), t = g.querySelector("text");
      let nx, nw;
      if (d < depth && x <= bx + 0.01 && x + w >= bx + bw - 0.01) { nx = pad; nw = span; chain.push(g); }
      else if (d >= depth && inside(x, w)) { nx = pad + (x - bx) * scale; nw = w * scale; }
      g.style.display = nx === undefined ? "none" : "";
      if (nx === undefined) continue;
      r.setAttribute("x", nx.toFixed(2)); r.setAttribute("width", nw.toFixed(2));
      const fit = Math.floor((nw - 6) / 6.6), name = g.dataset.name;
      const label = fit < 3 ? "" : name.length <= fit ? name : `${name.slice(0, fit - 2)}..`;
      if (label && !t) g.append(Object.assign(document.createElementNS("http://www.w3.org/2000/svg", "text"),
        { textContent: label }));
      const tt = g.querySelector("text");
      if (tt) { tt.textContent = label; tt.setAttribute("x", (nx + 3).toFixed(2));
        tt.setAttribute("y", String(Number(r.getAttribute("y")) + Number(r.getAttribute("height")) - 4)); }
    }
    chain.sort((a, b) => a.dataset.depth - b.dataset.depth);
    if (target && target !== root) chain.push(target);
    const crumbs = clear($("flame-crumbs"));
    crumbs.hidden = !chain.length;
    chain.forEach((g, i) => {
      if (i) crumbs.append(" › ");
      crumbs.append(i === chain.length - 1 ? el("span", { "aria-current": "true" }, g.dataset.name)
        : el("button", { type: "button", class: "link" }, g.dataset.name === "all" ? "all" : g.dataset.name));
      if (i < chain.length - 1) crumbs.lastChild.onclick = () => this.zoomFlame(g === root ? null : g);
    });
    $("flame").dataset.zoom = target && target !== root ? target.dataset.name : "";
  }

  async oom() {
    const card = await torchOom(this.id, this.d, this.skip);
    const box = clear($("oom-card"));
    if (!card) return;
    $("state-oom").hidden = false;
    $("state-oom").onclick = () => this.state(card.event);
    const cap = card.cap;
    box.append(el("section", { class: "panel oom-card", id: "oom" },
      el("h2", {}, `Out of memory at entry ${fmtInt(card.event)}${card.n_ooms > 1 ? ` (the first of ${fmtInt(card.n_ooms)})` : ""}`),
      el("p", { id: "oom-cause", class: `oom-cause ${card.cause.kind}` }, `Cause: ${card.cause.text}.`),
      el("dl", { class: "facts" }, fact("requested", exactEl(card.requested)), fact("segment needed", exactEl(card.segment_needed)),
        ...(card.unknown ? [fact("allocated, reserved, free blocks", el("span", { id: "oom-unknown", title: card.unknown }, "unknown"))]
          : [fact("allocated", exactEl(card.allocated)), fact("reserved", exactEl(card.reserved)),
            fact("cached (reserved − allocated)", exactEl(card.cached))]),
        ...(cap ? [fact("memory cap", el("span", { id: "oom-cap" }, `${fmtInt(cap.lower)} – ${fmtInt(cap.upper - 1)} B (inferred)`,
          ...(cap.roundest !== null ? [el("br"), `roundest value in range: ${fmtBytes(cap.roundest)} (${fmtInt(cap.roundest)} B)`] : [])))] : []),
        fact("retries (whole run)", el("span", { id: "oom-retries" }, card.retries === null || card.retries === undefined ? "–" : fmtInt(card.retries))),
        ...(card.largest_free ? [fact("largest free block (large pool)", exactEl(card.largest_free.large)),
          fact("largest free block (small pool)", exactEl(card.largest_free.small))] : []),
        fact("device free", card.device_free === null ? "–" : exactEl(card.device_free)),
        ...card.cache_releases.slice(-1).map((r) => fact("cache emptied before", `${r.segments} segments, ${fmtBytes(r.bytes)} at entries ${r.first}–${r.end - 1}`)),
        ...(card.meta ? [fact("metadata", card.meta)] : [])),
      el("p", {}, "Failing request from ", el("code", {}, card.site)),
      el("h2", {}, "Largest blocks held"),
      el("div", { id: "oom-largest" }, table(["bytes", "entry", "call site"], card.largest_blocks.map((b) => [exactEl(b.bytes), fmtInt(b.entry), b.site]), [0, 1])),
      el("h2", {}, "Who held the memory"),
      table(["bytes", "share", "allocations", "call site"], card.holders.map((g) => [bytesEl(g.bytes), pct(g.share), fmtInt(g.count), g.site]), [0, 1, 2])));
  }

  async peak() {
    loading($("peak-note"), "Grouping the peak by call site…");
    const p = await torchPeak(this.id, this.d, this.skip).finally(() => loaded($("peak-note")));
    this.peakEvent = p.event;
    if (this.skip === null) $("skip").placeholder = "site-packages/torch/, <frozen …";
    $("peak-note").textContent = `Peak of ${fmtBytes(p.peak_requested)} requested at entry ${fmtInt(p.event)}: ${fmtInt(p.live_allocations)} live allocations, grouped by their first frame outside the skipped files.`;
    clear($("peak-table")).append(table(["bytes", "share", "allocations", "call site"],
      p.by_call_site.map((g) => [bytesEl(g.bytes), pct(g.share), fmtInt(g.count), g.site]), [0, 1, 2]));
  }

  /** The flamegraph the server draws (an SVG of boxes and titles, no script) at an entry. */
  async flame(at = "peak") {
    loading($("flame-note"), "Drawing the flamegraph…");
    const f = await torchFlame(this.id, this.d, at, this.skip).finally(() => loaded($("flame-note")));
    $("flame-event").value = String(f.event);
    const doc = new DOMParser().parseFromString(f.svg, "image/svg+xml");
    const svg = document.importNode(doc.documentElement, true);
    svg.setAttribute("style", "max-width:100%;height:auto");
    clear($("flame")).append(svg);
    svg.addEventListener("click", (ev) => { const g = ev.target.closest("g[data-depth]"); if (g) this.zoomFlame(g); });
    this.zoomFlame(null);
    Object.assign($("flame").dataset, { event: String(f.event), bytes: String(f.bytes), ready: "1" });
    if (this.marked) this.markFlame(this.marked.path, this.marked.color);
    $("flame-note").textContent = `${fmtBytes(f.bytes)} live after entry ${fmtInt(f.event)}: ${fmtInt(f.live_allocations)} allocations. Each Python frame outside the skipped files is a box as wide as the bytes allocated under it, callers below callees; the top boxes are the call sites of the table below. Hover a box for its bytes; click one to zoom into it, the breadcrumbs above lead back.`;
  }

  async state(k) {
    k = Math.max(0, Math.min(k, this.dev.n_events));
    this.asked = k;
    $("state-event").value = k > 0 ? String(k - 1) : "";
    this.at = k > 0 ? k - 1 : null;
    $("scrub").value = String(k > 0 ? k - 1 : 0);
    $("scrub-at").textContent = k > 0 ? fmtInt(k - 1) : "–";
    this.markTimeline();
    loading($("state-note"), "Rebuilding the allocator state…");
    const [s] = await Promise.all([torchState(this.id, this.d, k, this.skip).finally(() => loaded($("state-note"))), this.live(k)]);
    if (this.asked !== k) return;  // a later entry was asked for meanwhile (scrubbing): its answer draws
    const t = s.totals;
    if (!t) {   // a trace whose start could not be recovered: its totals are unknown, never zeros
      clear($("state-totals")).append(fact(...where(s)),
        fact("reserved, allocated, free blocks", el("span", { id: "state-unknown" }, "unknown")),
        fact("held by allocations the trace made", `${fmtBytes(s.held_since_start.bytes)} in ${fmtInt(s.held_since_start.allocations)} allocations`),
        ...(s.next ? [fact("next entry", `${s.next.action} ${fmtBytes(s.next.size)}`)] : []));
      clear($("segments"));
      $("segments").style.height = "auto";
      Object.assign($("segments").dataset, { event: String(s.event), segments: "unknown" });
      $("state-note").textContent = `Unknown: ${s.unknown}.`;
      return;
    }
    clear($("state-totals")).append(fact(...where(s)), fact("segments", fmtInt(t.segments)),
      fact("reserved", bytesEl(t.reserved)), fact("allocated", bytesEl(t.allocated)), fact("requested", bytesEl(t.requested)),
      fact("reserved − allocated", bytesEl(t.cached)), fact("pending free", bytesEl(t.pending_free)),
      fact("largest free (large)", bytesEl(t.largest_free.large)), fact("largest free (small)", bytesEl(t.largest_free.small)),
      ...(s.next ? [fact("next entry", `${s.next.action} ${fmtBytes(s.next.size)}`)] : []));
    const bins = { allocated: [], pending_free: [], free: [] };
    const labels = s.segments.map((g, i) => `${i}: ${g.pool} ${fmtBytes(g.size)}`);
    s.segments.forEach((g, i) => g.blocks.forEach((b) => (bins[b.state] || bins.free).push({ ...b, row: labels[i], segSite: g.site })));
    const theme = plotTheme();
    const data = Object.entries(bins).map(([state, bs]) => ({ type: "bar", orientation: "h", name: state.replace("_", " "),
      x: bs.map((b) => b.size), y: bs.map((b) => b.row), base: bs.map((b) => b.offset),
      marker: { color: state === "allocated" ? bs.map((b) => (b.alloc !== null && b.alloc !== undefined ? allocColor(b.alloc) : BLOCK_COLORS.allocated))
        : BLOCK_COLORS[state], line: { width: 0.5, color: theme.paper } }, customdata: bs.map((b) => b.alloc ?? null), textposition: "none", hoverinfo: "text",
      text: bs.map((b) => plotText(`${b.state} ${fmtBytes(b.size)} at +${fmtBytes(b.offset)}${b.site ? ` · ${b.site}` : ""}${b.alloc !== null && b.alloc !== undefined ? ` · entry ${b.alloc}` : ""}${b.segSite ? ` · segment made by ${b.segSite}` : ""}`)) }));
    const div = $("segments");
    div.style.height = `${Math.min(Math.max(220, 16 * s.segments.length + 80), 2400)}px`;
    const widest = most(s.segments.map((g) => g.size));
    await (await plotlyReady()).react(div, data, themed(theme, { barmode: "overlay", margin: { l: 130, r: 20, t: 10, b: 40 },
      xaxis: { title: { text: "offset in segment" }, ...bytesAxis(widest) },
      yaxis: { autorange: "reversed", type: "category", categoryorder: "array", categoryarray: labels, tickfont: { size: 9 } },
      legend: { orientation: "h", y: -0.1 } }), plotConfig());
    Object.assign(div.dataset, { event: String(s.event), segments: String(s.segments.length) });
    if (!div.dataset.wired) {  // a block of an allocation: its stack, as a click on the timeline shows it
      div.dataset.wired = "1";
      div.on("plotly_click", (ev) => {
        const k = ev.points && ev.points.length ? ev.points[0].customdata : null;
        if (k !== null && k !== undefined) this.allocation(k).catch((e) => setStatus(e.message, true));
      });
    }
    $("state-note").textContent = `Each row is a segment (cudaMalloc); blocks: allocated (each in its allocation's colour, as on the timeline), freed but waiting for its stream (orange), free/cached (green).${s.truncated ? " Only the first 20,000 blocks are drawn." : ""}`;
  }
}

/** The state's heading fact: after which entry (the numbering of the peak and the flamegraph), or the start. */
function where(s) {
  return s.after_entry === null || s.after_entry === undefined ? ["at the start", "before entry 0"]
    : ["after entry", el("span", { id: "state-after" }, fmtInt(s.after_entry))];
}

async function single(id, d) {
  $("single").hidden = false;
  loading($("timeline-note"), "Loading the timeline…");
  const cancelPlotly = window.Plotly ? null : plotlyAfter(PLOTLY_WAIT_MS);
  const sum = await torchSummary(id);
  const dev = sum.devices.find((x) => x.device === d);
  if (!dev) throw new Error(`trace ${id} has no device ${d}`);
  const v = new SnapshotView(id, d, dev);
  v.cancelPlotly = cancelPlotly;  // the timeline's picture lets Plotly.js run, or this timer does
  document.title = `alloctrace · ${sum.name}`;
  $("title").textContent = sum.name;
  clear($("facts")).append(fact("device", String(d)), fact("entries", fmtInt(dev.n_events)),
    fact("peak requested", bytesEl(dev.peak_requested)), fact("peak reserved", bytesEl(dev.peak_reserved)),
    fact("segments at snapshot", fmtInt(dev.n_segments)), fact("stacks", fmtInt(dev.n_stacks)),
    fact("rebuilt state = snapshot", dev.trace_matches_snapshot ? "yes" : "NO"),
    ...(dev.consistent === undefined || dev.consistent === null ? [] : [fact("caching-allocator replay",
      dev.consistent ? "consistent" : `departs at entry ${fmtInt(dev.first_mismatch ? dev.first_mismatch.event : null)}`)]),
    ...(dev.partial ? [fact("trace", el("span", { id: "partial-note", title: dev.partial.note },
      dev.partial.exact ? "partial (ring buffer wrapped): exact from entry 0, the start seeded from the snapshot"
        : "partial (ring buffer wrapped): the start cannot be recovered, states lack it"))]
      : dev.trace_complete === false ? [fact("trace", "wrapped or began late")] : []),
    ...(sum.devices.length > 1 ? [fact("devices", el("span", {}, sum.devices.map((x) =>
      el("a", { href: `/torch?id=${enc(id)}&device=${x.device}`, style: "margin-right:8px" }, String(x.device)))))] : []));
  $("state-event").max = dev.n_events;
  v.wireScrub();
  compareWith(id, d);
  categoriesPanel(sum.categories);
  const fail = (e) => setStatus(e.message, true);
  // "after entry N" is entries 0..N applied, as the peak, the flamegraph and the OOM card number entries
  $("state-go").onclick = () => v.state($("state-event").value === "" ? 0 : Number($("state-event").value) + 1).catch(fail);
  $("state-peak").onclick = () => v.state(v.peakEvent + 1).catch(fail);
  $("state-end").onclick = () => v.state(dev.n_events).catch(fail);
  $("skip-go").onclick = () => { v.skip = $("skip").value; v.peak().catch(fail); v.flame($("flame-event").value || "peak").catch(fail); };
  $("flame-go").onclick = () => v.flame($("flame-event").value || "peak").catch(fail);
  $("flame-peak").onclick = () => v.flame("peak").catch(fail);
  if (dev.oom_events.length) { $("flame-oom").hidden = false; $("flame-oom").onclick = () => v.flame("oom").catch(fail); }
  if (sum.devices.length > 1) ranks(id, d).catch(fail);
  // the what-if panel replays the whole trace twice: drawn when opened, not before
  const details = $("whatif-details");
  details.addEventListener("toggle", () => {
    if (details.open && !$("whatif").firstChild) mountWhatIf($("whatif"), { trace: id, device: d, fixed: true });
  });
  if (urlParam("view") === "whatif") details.open = true;
  await Promise.all([v.timeline().finally(() => loaded($("timeline-note"))).then(() => { v.wireTimeline(); v.markTimeline(); }), v.peak(), v.oom(),
    v.flame(urlParam("view") === "oom" && dev.oom_events.length ? "oom" : "peak")]);
  const at = urlParam("event");
  if (urlParam("view") === "oom" && dev.oom_events.length) await v.state(dev.oom_events[0]);
  else await v.state(at !== null ? Number(at) + 1 : dev.n_events);
}

/** Bytes by category at the peak (parameters, gradients, optimizer state, activations, ...) where the trace
 * knows them, else why it does not. */
function categoriesPanel(c) {
  const box = clear($("categories"));
  box.dataset.known = String(Boolean(c && c.known));
  if (!c || !c.known) { $("categories-note").textContent = `No categories for this trace: ${c ? c.why : "unknown"}.`; return; }
  $("categories-note").textContent = `At the peak allocated that alloctrace plan predicted for ${c.name} = ${c.value}` +
    `${c.fits === false ? " (over the budget)" : ""}: ${fmtBytes(c.total)} in all.`;
  box.append(table(["category", "bytes", "share", ""], Object.entries(c.categories).map(([name, b]) => [name, exactEl(b),
    pct(b / Math.max(1, c.total)), el("span", { class: "cat-bar", style: `display:inline-block;height:10px;width:${(100 * b / Math.max(1, c.total)).toFixed(1)}px;background:${nameColor(name)}` })]), [1, 2]));
}

/** "Compare with…": the other PyTorch snapshots, filtered by a name or id as it is typed (the first 20 that
 * match); each opens the diff of this snapshot (A) and it (B). Listed once the box is opened. */
function compareWith(id, d) {
  const box = $("compare");
  let others = null;
  const show = () => {
    const q = $("compare-q").value.trim().toLowerCase();
    const hits = others.filter((t) => !q || t.name.toLowerCase().includes(q) || t.id.includes(q));
    const list = clear($("compare-list"));
    if (!hits.length) list.append(el("li", { class: "empty" }, others.length ? "No other snapshot matches." : "No other snapshot is stored."));
    for (const t of hits.slice(0, 20))
      list.append(el("li", {}, el("a", { href: `/torch?a=${enc(d ? `${id}:${d}` : id)}&b=${enc(t.id)}` }, t.name), ` (${t.id})`));
    if (hits.length > 20) list.append(el("li", { class: "hint" }, `${fmtInt(hits.length - 20)} more: type more of the name.`));
    list.dataset.hits = String(hits.length);
  };
  box.addEventListener("toggle", async () => {
    if (!box.open || others) return;
    others = (await listTraces()).filter((t) => t.source === "torch" && t.id !== id);
    show();
    $("compare-q").focus();
  });
  $("compare-q").addEventListener("input", () => { if (others) show(); });
}

/** The ranks of a distributed job (a device each) side by side: table, curves over time, what differed. */
async function ranks(id, d) {
  const r = await torchRanks(id);
  $("ranks-panel").hidden = false;
  const rankOf = (x) => (x.rank === null || x.rank === undefined ? x.device : x.rank);
  clear($("ranks-table")).append(table(["rank", "device", "entries", "peak requested", "peak reserved", "reserved − requested at that peak", "OOM"],
    r.ranks.map((x) => [el("a", { href: `/torch?id=${enc(id)}&device=${x.device}` }, String(rankOf(x)) + (x.device === d ? " (this page)" : "")),
      `${x.device} (cuda:${x.cuda_device})`, fmtInt(x.n_events), bytesEl(x.peak_requested), bytesEl(x.peak_reserved),
      el("span", {}, bytesEl(x.fragmentation), ` (${pct(x.fragmentation_share)})`),
      x.oom ? `entry ${fmtInt(x.oom.event)}: ${fmtBytes(x.oom.requested)} requested` : "–"]), [2, 3, 4, 5]));
  const c = r.compared;
  $("ranks-note").textContent = `${r.ranks.length} ranks${r.oom_ranks.length ? `; out of memory: rank ${r.oom_ranks.join(", ")}` : ""}.` +
    (c ? ` Rank ${c.b_rank} (${c.why}) against rank ${c.a_rank}: peak requested ${fmtBytes(c.delta_requested)}, peak reserved ${fmtBytes(c.delta_reserved)}; ${fmtInt(c.paired)} allocations paired${c.same_sequence ? " (same call-site sequence)" : ""}, ${fmtInt(c.grew)} grew, ${fmtInt(c.shrank)} shrank.` : "");
  if (c) clear($("ranks-diff")).append(table([`rank ${c.a_rank}`, `rank ${c.b_rank}`, "Δ", "call site"],
    c.by_call_site.map((s) => [bytesEl(s.a_bytes), bytesEl(s.b_bytes), el("span", { class: s.delta > 0 ? "pos" : "neg" }, bytesEl(s.delta)), s.site]), [0, 1, 2]));
  const theme = plotTheme();
  const t0 = Math.min(...r.ranks.filter((x) => x.series.time_us.length).map((x) => x.series.time_us[0]));
  const traces = [];
  r.ranks.forEach((x) => {
    const xs = x.series.time_us.map((t) => (t - t0) / 1e6), color = nameColor(`rank ${rankOf(x)}`);
    traces.push({ x: xs, y: x.series.allocated_max, name: `rank ${rankOf(x)} allocated`, type: "scatter", mode: "lines", line: { color, width: 1.5 } },
      { x: xs, y: x.series.reserved_max, name: `rank ${rankOf(x)} reserved`, type: "scatter", mode: "lines", line: { color, width: 1, dash: "dot" } });
  });
  const top = most(...r.ranks.map((x) => x.series.reserved_max), ...r.ranks.map((x) => x.series.allocated_max));
  await (await plotlyReady()).react($("ranks-chart"), traces, themed(theme, { margin: { l: 80, r: 20, t: 10, b: 40 },
    xaxis: { title: { text: "seconds since the first entry" } }, yaxis: { title: { text: "bytes" }, ...bytesAxis(top * 1.05) },
    legend: { orientation: "h", y: -0.2 } }), plotConfig());
  $("ranks-chart").dataset.ready = "1";
}

// ---------------------------------------------------------------------------------------- two snapshots
async function diff(a, b) {
  $("diff").hidden = false;
  loading($("diff-parts"), "Comparing the two snapshots…");
  const d = await torchDiff(a, b).finally(() => loaded($("diff-parts")));
  $("title").textContent = `Diff: ${d.a.name} (A) → ${d.b.name} (B)`;
  clear($("facts")).append(fact("A peak requested", bytesEl(d.a.peak_requested)), fact("B peak requested", bytesEl(d.b.peak_requested)),
    fact("Δ requested", bytesEl(d.delta_requested)), fact("A peak reserved", bytesEl(d.a.peak_reserved)),
    fact("B peak reserved", bytesEl(d.b.peak_reserved)), fact("Δ reserved", bytesEl(d.reserved.delta_peak_reserved)));
  const p = d.decomposition, r = d.reserved;
  clear($("diff-parts")).append(
    el("p", { class: "sum-line", id: "delta-sum" }, `Δ peak requested ${fmtBytes(d.delta_requested)} = resized ${fmtBytes(p.resized.bytes)} (${fmtInt(p.resized.count)} allocations live at both peaks, ${fmtInt(p.resized.changed)} changed size) + live only at B's peak ${fmtBytes(p.only_b.bytes)} − live only at A's peak ${fmtBytes(p.only_a.bytes)}`),
    el("p", { class: "sum-line" }, `Δ peak reserved ${fmtBytes(r.delta_peak_reserved)} = Δ peak requested ${fmtBytes(r.delta_requested_peak)} + Δ(reserved − requested) ${fmtBytes(r.delta_peak_reserved - r.delta_requested_peak)}`));
  clear($("diff-sites")).append(table(["A bytes", "B bytes", "Δ", "A allocs", "B allocs", "call site"],
    d.by_call_site.map((s) => [bytesEl(s.a_bytes), bytesEl(s.b_bytes), el("span", { class: s.delta > 0 ? "pos" : s.delta < 0 ? "neg" : null }, bytesEl(s.delta)),
      fmtInt(s.a_count), fmtInt(s.b_count), s.site]), [0, 1, 2, 3, 4]));
  const al = d.alignment;
  $("align-note").textContent = `${fmtInt(al.paired)} allocations paired by stack and occurrence (${al.same_sequence ? "the same call-site sequence" : `first divergence at allocation ${fmtInt(al.first_divergence)}`}${al.in_order ? ", in order" : ""}); ${fmtInt(al.only_a)} only in A, ${fmtInt(al.only_b)} only in B; ${fmtInt(al.same_size)} same size, ${fmtInt(al.grew)} grew, ${fmtInt(al.shrank)} shrank${al.size_ratio && al.size_ratio.median !== null ? `; median size ratio B/A ${al.size_ratio.median.toFixed(2)}` : ""}.`;
  if (al.sequence) {
    const theme = plotTheme(), sq = al.sequence;
    await (await plotlyReady()).react($("sequence"), [
      { x: sq.index, y: sq.a_bytes, name: plotText(`A ${d.a.name}`), type: "scatter", mode: "lines", line: { shape: "hv", color: theme.accent } },
      { x: sq.index, y: sq.b_bytes, name: plotText(`B ${d.b.name}`), type: "scatter", mode: "lines", line: { shape: "hv", color: theme.warn } }],
    themed(theme, { margin: { l: 80, r: 20, t: 10, b: 40 }, xaxis: { title: { text: "aligned allocation (A's order)" }, tickformat: ",d" },
      yaxis: { title: { text: "bytes per bucket" }, ...bytesAxis(most(sq.a_bytes, sq.b_bytes) * 1.05) } }), plotConfig());
    $("sequence").dataset.ready = "1";
  }
}

// ---------------------------------------------------------------------------------------- start
async function main() {
  topNav("torch");
  try {
    if (urlParam("a") && urlParam("b")) await diff(urlParam("a"), urlParam("b"));
    else if (urlParam("id")) await single(urlParam("id"), Number(urlParam("device") || 0));
    else await home();
    document.body.dataset.loaded = "1";
  } catch (err) {
    const asked = urlParam("id") || "", stale = err.status === 404 || err.status === 400 || err.status === 422;
    if (urlParam("id") && (stale || !isTraceId(asked))) errorPage(problem(isTraceId(asked) ? err : { status: 422 }, "snapshot", asked.slice(0, 40)), { torch: true });
    else if (urlParam("a") && stale) errorPage(problem(err, "diff", `A=${urlParam("a").slice(0, 30)}, B=${(urlParam("b") || "").slice(0, 30)}`), { torch: true });
    else setStatus(err.message, true);
    document.body.dataset.loaded = "error";
  }
}
main();
