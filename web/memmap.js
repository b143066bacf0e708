// The memory map: x = event index, y = byte offset, one rectangle per tensor lifetime.
// Rectangles are filled polygons, one trace per op (null-separated); zoom and pan re-fetch detail for the
// visible range from the server. The lower panel is the free list over time.
import { memoryMap, oomEvent } from "./api.js";
import { el, fmtBytes, exactBytes, bothBytes, fmtInt, opColor, nameColor, plotConfig, plotTheme, tensorLabel,
  plotlyReady, plotlyAfter, afterPaint } from "./common.js";
import { sketchFigure } from "./sketch.js";
import { opColors } from "./palette.js";

/** Text for Plotly labels: Plotly reads a few tags and entities, so escape everything. */
export function plotText(s) {
  return String(s ?? "").replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

/** Power-of-two tick steps labelled in KiB/MiB, so the offset axis reads like memory. */
export function byteTicks(lo, hi, want = 6) {
  if (!(hi > lo)) return { tickvals: [lo], ticktext: [fmtBytes(lo)] };
  let step = 1;
  while ((hi - lo) / step > want) step *= 2;
  const vals = [], text = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi && vals.length < 40; v += step) { vals.push(v); text.push(fmtBytes(v)); }
  return { tickvals: vals, ticktext: text };
}

/** A tensor-name matcher from a search box: substring (case-insensitive) or a regular expression. */
export function nameMatcher(text, regex) {
  if (!text) return null;
  if (regex) {
    const re = new RegExp(text, "i");  // throws on a bad pattern: the caller shows the message
    return (name) => re.test(name);
  }
  const needle = text.toLowerCase();
  return (name) => String(name).toLowerCase().includes(needle);
}

// SVG draws a few thousand rectangles faster than starting WebGL (much faster without a GPU);
// the server caps a view at max_shapes, so WebGL is only used when a page asks for more.
const WEBGL_ABOVE = 3500;
// how long a page that loads Plotly.js late keeps it waiting for the map's data (a cold server builds the
// graph's tile pyramid first): after that Plotly.js runs anyway and the picture waits for it
export const PLOTLY_WAIT_MS = 400;

export class MemoryMap {
  /**
   * div: where to draw; ref: {id, g}; opts: {title, freeList, xShift, xRange, onPick(i, hit),
   * onXRange([a, b]), onView({x0, x1, y0, y1})}
   */
  constructor(div, ref, opts = {}) {
    this.div = div; this.ref = ref; this.opts = { freeList: true, ...opts };
    this.rects = []; this.marker = null; this.extraShapes = []; this.extraAnnotations = [];
    this.fetchSeq = 0; this.syncing = false; this.match = null;
    // resolves once the first picture is on screen (the still one or the chart), or the map failed
    this.pictured = new Promise((resolve) => { this.markPictured = resolve; });
    this.shift = Number(this.opts.xShift || 0); // display x = event index + shift (aligns two runs)
    this.tip = el("div", { class: "map-tip", role: "tooltip" });
    Object.assign(this.tip.style, {
      position: "fixed", pointerEvents: "none", background: "#1d2330", color: "#fff", padding: "6px 9px",
      borderRadius: "6px", font: "12px/1.45 var(--sans)", display: "none", zIndex: 20, maxWidth: "420px",
      whiteSpace: "pre-wrap", overflowWrap: "break-word", boxShadow: "0 2px 10px rgba(0,0,0,.25)",
    });
    document.body.append(this.tip);
  }

  /** First render of the whole graph; `view` ({x0, x1, y0, y1}) zooms straight to a saved view. */
  async load(summary, view) {
    this.summary = summary || {};
    this.busy = el("p", { class: "loading", role: "status" }, el("span", { class: "spinner", "aria-hidden": "true" }), "Loading the memory map…");
    this.div.append(this.busy);
    this.div.setAttribute("aria-busy", "true");
    try { await this.first(view); } finally { this.busy.remove(); this.div.removeAttribute("aria-busy"); this.markPictured(); }
    this.div.dataset.ready = "1";  // what tests and benchmarks wait for: the interactive chart is drawn
    return this;
  }

  /**
   * Without Plotly.js yet (a page that loads it late), the same figure as a still picture on a canvas, then
   * Plotly.js runs once that picture is painted. A map whose data is slow does not hold Plotly.js back:
   * it starts PLOTLY_WAIT_MS after the request at the latest.
   */
  async first(view) {
    const cancel = window.Plotly ? null : plotlyAfter(PLOTLY_WAIT_MS);
    const data = await memoryMap(this.ref.id, this.ref.g);
    if (cancel) cancel();
    this.nEvents = data.nEvents || this.summary.n_events || 1;
    this.maxSize = data.maxSize ?? this.summary.max_size ?? null;
    this.bufferSize = data.bufferSize ?? this.summary.buffer_size ?? null;
    this.highWater = data.yExtent || null;
    this.oom = data.oom || this.summary.oom || null;
    if (this.oom && this.oom.event === null) this.oom = { ...this.oom, event: await oomEvent(this.ref.id, this.ref.g) };
    this.apply(data);
    if (view && [view.x0, view.x1, view.y0, view.y1].every(Number.isFinite)) this.opts.xRange = null;
    let sketch = null;
    if (!window.Plotly) {
      const layout = this.layout(false, view);
      sketch = sketchFigure(this.div, this.traces(layout.xaxis.range, layout.yaxis.range), layout);
      this.busy.remove();
      await afterPaint();
      this.div.dataset.pictureAt = String(performance.now());  // when the first picture was on screen
      this.div.dataset.overview = "1";
      this.markPictured();
    }
    await plotlyReady();  // on failure the picture stays and the page says why
    await this.draw(true, view);
    if (sketch) sketch.remove();
    this.bind();
    if (view && [view.x0, view.x1, view.y0, view.y1].every(Number.isFinite)) await this.refetch();
  }

  apply(data) {
    this.rects = data.shapes;
    this.reduced = data.reduced;
    // the free-list panel only when the events carry free-list facts (synthetic or reduced logs may not)
    if (data.freeList.some((r) => r.largest_free !== null && r.largest_free !== undefined)) this.freeList = data.freeList;
  }

  yTop() {
    // scaled to this graph's own peak: a buffer sized for a larger graph (a long run's later graphs are small)
    // is a line above the view and named in the key, as a running max_size is
    const own = Math.max(1, this.highWater || 0);
    const top = this.bufferSize && this.bufferSize <= own * 1.25 ? Math.max(own, this.bufferSize) : own;
    // max_size is drawn when it is near this graph's own top; a running maximum far above it would
    // squeeze the graph into a strip, so then the line is only named in the header and the key
    return this.maxSize && this.maxSize <= top * 1.25 ? Math.max(top, this.maxSize) : top;
  }

  /** Names written inside the rectangles that are big enough on screen to hold them. */
  labelTrace(xr, yr, theme) {
    const cw = this.div.clientWidth || 1000;
    const w = Math.max(200, cw - (cw < 640 ? 80 : 280));
    const h = Math.max(120, (this.div.clientHeight || 500) * (this.opts.freeList ? 0.62 : 0.85) - 60);
    const sx = w / Math.max(1e-9, xr[1] - xr[0]), sy = h / Math.max(1e-9, yr[1] - yr[0]);
    const cand = [];
    for (const r of this.rects) {
      const a = Math.max(r.x0 + this.shift, xr[0]), b = Math.min(r.x1 + this.shift, xr[1]);
      const c = Math.max(r.y0, yr[0]), d = Math.min(r.y1, yr[1]);
      const pw = (b - a) * sx, ph = (d - c) * sy;
      const label = r.n > 1 ? `${r.n} tensors` : tensorLabel(r.tensor, r.op);
      if (ph >= 13 && pw >= Math.max(30, String(label).length * 6.6 + 8)) cand.push({ x: (a + b) / 2, y: (c + d) / 2, t: label, area: pw * ph });
    }
    cand.sort((p, q) => q.area - p.area);
    const top = cand.slice(0, 80);
    return { type: "scatter", mode: "text", x: top.map((p) => p.x), y: top.map((p) => p.y), text: top.map((p) => plotText(p.t)),
      textfont: { size: 11, color: theme.ink, family: "ui-monospace, DejaVu Sans Mono, monospace" }, hoverinfo: "skip",
      showlegend: false, name: "labels", xaxis: "x", yaxis: "y" };
  }

  /** Rectangles whose tensor matches the search, as outlines drawn over the map. */
  matchTrace(theme) {
    const x = [], y = [];
    for (const r of this.matches()) {
      const a = r.x0 + this.shift, b = r.x1 + this.shift;
      x.push(a, b, b, a, a, null);
      y.push(r.y0, r.y0, r.y1, r.y1, r.y0, null);
    }
    return { type: "scatter", mode: "lines", name: "search matches", x, y, hoverinfo: "skip",
      line: { color: theme.warn, width: 3 }, xaxis: "x", yaxis: "y" };
  }

  matches() { return this.match ? this.rects.filter((r) => this.match(r.tensor)) : []; }

  /** Highlight tensors whose names match (null clears); returns the matching rectangles. */
  setSearch(match) {
    this.match = match;
    if (this.div._fullLayout) { this.redrawing = true; this.draw(false).finally(() => { this.redrawing = false; }); }
    return this.matches();
  }

  traces(xr, yr) {
    const theme = plotTheme();
    const byKey = new Map();
    this.colorBy = this.rects.some((r) => r.op && r.op !== "?") ? "op" : "tensor";
    const byTensor = this.colorBy === "tensor";
    for (const r of this.rects) {
      const k = byTensor ? nameColor(r.tensor) : (r.op || "?");
      if (!byKey.has(k)) byKey.set(k, { x: [], y: [] });
      const t = byKey.get(k);
      const a = r.x0 + this.shift, b = r.x1 + this.shift;
      t.x.push(a, b, b, a, a, null);
      t.y.push(r.y0, r.y0, r.y1, r.y1, r.y0, null);
    }
    const keys = [...byKey.keys()].sort();
    if (!byTensor) opColors.claim(keys);  // every op of the view gets a colour of its own
    const kind = this.rects.length > WEBGL_ABOVE ? "scattergl" : "scatter";
    const out = keys.map((k, n) => {
      const color = byTensor ? k : opColor(k);
      return {
        type: kind, mode: "lines", fill: "toself", name: byTensor ? "tensors (colored by name)" : plotText(k),
        legendgroup: byTensor ? "tensors" : "ops", showlegend: !byTensor || n === 0,
        x: byKey.get(k).x, y: byKey.get(k).y, hoverinfo: "skip",
        line: { width: 0.6, color }, fillcolor: color + "b3", xaxis: "x", yaxis: "y", meta: { op: byTensor ? null : k },
      };
    });
    if (xr && yr) out.push(this.labelTrace(xr, yr, theme));
    if (this.match) out.push(this.matchTrace(theme));
    const sh = this.shift, xEnd = this.nEvents + sh;
    const hline = (v, name, color, dash) => ({
      type: "scatter", mode: "lines", name: `${name} ${fmtBytes(v)}`, x: [sh, xEnd], y: [v, v],
      line: { color, width: 1.6, dash }, hovertemplate: `${name}: ${plotText(bothBytes(v))}<extra></extra>`, xaxis: "x", yaxis: "y",
    });
    const top = this.yTop();
    if (this.highWater) out.push(hline(this.highWater, "this graph's high water", theme.accent, "solid"));
    if (this.maxSize && this.maxSize <= top) out.push(hline(this.maxSize, "allocator max_size", theme.ink, "dash"));
    else if (this.maxSize) {
      out.push({ type: "scatter", mode: "lines", name: `allocator max_size ${fmtBytes(this.maxSize)} (above: a running max)`,
        x: [null], y: [null], line: { color: theme.ink, dash: "dash" }, xaxis: "x", yaxis: "y" });
    }
    if (this.bufferSize && this.bufferSize <= top) out.push(hline(this.bufferSize, "buffer size", theme.bad, "dot"));
    else if (this.bufferSize) {
      out.push({ ...hline(this.bufferSize, "buffer size", theme.bad, "dot"),
        name: `buffer size ${fmtBytes(this.bufferSize)} (above this graph's peak)` });
    }
    if (this.opts.freeList && this.freeList && this.freeList.length) {
      const fl = this.freeList;
      out.push({
        type: "scatter", mode: "lines", name: "largest free block", x: fl.map((r) => r.x + sh), y: fl.map((r) => r.largest_free),
        line: { color: "#22804a", width: 1.4, shape: "hv" }, xaxis: "x", yaxis: "y2",
        customdata: fl.map((r) => fmtBytes(r.largest_free)),
        hovertemplate: "event %{x}<br>largest free block: %{customdata} (%{y:,} B)<extra></extra>",
      });
      out.push({
        type: "scatter", mode: "lines", name: "free blocks (count)", x: fl.map((r) => r.x + sh), y: fl.map((r) => r.n_free),
        line: { color: "#9467bd", width: 1.2, shape: "hv" }, xaxis: "x", yaxis: "y3",
        hovertemplate: "event %{x}<br>free blocks: %{y}<extra></extra>",
      });
      if (this.oom && this.oom.needed) {
        out.push({
          type: "scatter", mode: "markers+text", name: "needed at the failure", x: [this.oom.event + sh], y: [this.oom.needed],
          marker: { color: theme.bad, size: 11, symbol: "x" }, text: [`needed ${fmtBytes(this.oom.needed)}`],
          textposition: "middle left", textfont: { color: theme.bad, size: 12 }, xaxis: "x", yaxis: "y2",
          hovertemplate: `needed ${exactBytes(this.oom.needed)}<extra></extra>`,
        });
      }
    }
    return out;
  }

  /** Anchor a label at x so it stays inside the plot: left of x in the right half, right of it otherwise. */
  static anchor(x, xr) { return (x - xr[0]) / Math.max(1e-9, xr[1] - xr[0]) > 0.5 ? "right" : "left"; }

  layout(keepRanges, view) {
    const theme = plotTheme();
    const fl = this.opts.freeList && this.freeList && this.freeList.length;
    const gd = this.div;
    const cur = keepRanges && gd._fullLayout ? gd._fullLayout : null;
    const xr = cur ? cur.xaxis.range.slice() : view ? [view.x0 + this.shift, view.x1 + this.shift]
      : (this.opts.xRange || [this.shift, this.nEvents + this.shift]);
    const yr = cur ? cur.yaxis.range.slice() : view ? [view.y0, view.y1] : [0, this.yTop() * 1.04];
    const ticks = byteTicks(Math.max(0, yr[0]), yr[1]);
    const flMax = fl ? Math.max(1, ...this.freeList.map((r) => r.largest_free || 0), (this.oom && this.oom.needed) || 0) : 1;
    const flTicks = byteTicks(0, flMax * 1.1, 3);
    const nMax = fl ? Math.max(1, ...this.freeList.map((r) => r.n_free || 0)) : 1;
    const shapes = [...this.extraShapes];
    const annotations = this.extraAnnotations.map((a) => ({ ...a, xanchor: MemoryMap.anchor(a.x, xr), bgcolor: theme.label }));
    if (this.oom && this.oom.event !== null && this.oom.event !== undefined) {
      const ox = this.oom.event + this.shift;
      shapes.push({ type: "line", xref: "x", yref: "paper", x0: ox, x1: ox, y0: 0, y1: 1, line: { color: theme.bad, width: 2 } });
      annotations.push({ xref: "x", yref: "paper", x: ox, y: 0.985, yanchor: "top", xanchor: MemoryMap.anchor(ox, xr),
        text: plotText(`out of space at event ${fmtInt(this.oom.event)}: ${tensorLabel(this.oom.tensor)} needed ${fmtBytes(this.oom.needed)}, largest free ${fmtBytes(this.oom.largest)}`),
        showarrow: false, font: { color: theme.bad, size: 12 }, bgcolor: theme.label });
    }
    if (this.marker !== null) {
      const mx = this.marker + this.shift;
      shapes.push({ type: "line", xref: "x", yref: "paper", x0: mx, x1: mx, y0: 0, y1: 1,
        line: { color: theme.accent, width: 1.5, dash: "dot" }, name: "selected" });
    }
    const axis = { gridcolor: theme.grid, zeroline: false, color: theme.muted };
    const freeAxes = fl ? {
      yaxis2: { ...axis, title: { text: "largest free", font: { size: 11 } }, domain: [0, 0.24], rangemode: "tozero",
        range: [0, flMax * 1.1], tickvals: flTicks.tickvals, ticktext: flTicks.ticktext, fixedrange: true },
      yaxis3: { ...axis, title: { text: "free blocks", font: { size: 11 } }, overlaying: "y2", side: "right",
        rangemode: "tozero", showgrid: false, fixedrange: true, tickformat: ",d", dtick: nMax <= 6 ? 1 : undefined },
    } : {};  // no keys at all without a free list: Plotly reads an undefined axis key as an axis
    // a phone: the key goes under the chart, so the plot keeps the width
    const narrow = (this.div.clientWidth || 1000) < 640;
    const legend = narrow ? { orientation: "h", x: 0, xanchor: "left", y: -0.1, yanchor: "top", font: { size: 11 } }
      : { x: fl ? 1.07 : 1.02, xanchor: "left", y: 1, yanchor: "top", font: { size: 11 },
        title: { text: "key", font: { size: 11, color: theme.muted } } };
    return {
      ...freeAxes,
      title: this.opts.title ? { text: plotText(this.opts.title), x: 0.01, font: { size: 14 } } : undefined,
      margin: narrow ? { l: 58, r: fl ? 36 : 10, t: this.opts.title ? 44 : 24, b: 36 }
        : { l: 78, r: 230, t: this.opts.title ? 52 : 30, b: 44 },
      paper_bgcolor: theme.paper, plot_bgcolor: theme.plot, font: { family: "system-ui, sans-serif", size: 12, color: theme.ink },
      dragmode: "zoom", hovermode: "closest", uirevision: "keep",
      showlegend: true, legend,
      xaxis: { ...axis, title: { text: "event index" }, range: xr, anchor: fl ? "y2" : "y",
        tickformat: ",d", dtick: this.nEvents <= 12 ? 1 : undefined },
      yaxis: { ...axis, title: { text: "offset in buffer" }, domain: fl ? [0.32, 1] : [0, 1], range: yr,
        tickvals: ticks.tickvals, ticktext: ticks.ticktext, fixedrange: false },
      shapes, annotations,
    };
  }

  draw(first, view) {
    const layout = this.layout(!first, view);
    return Plotly.react(this.div, this.traces(layout.xaxis.range, layout.yaxis.range), layout, plotConfig({ scrollZoom: true }));
  }

  /** The visible window in event indexes and bytes. */
  view() {
    const fl = this.div._fullLayout;
    if (!fl) return null;
    const [x0, x1] = fl.xaxis.range.map((v) => v - this.shift), [y0, y1] = fl.yaxis.range;
    return { x0, x1, y0, y1 };
  }

  bind() {
    if (this.bound) return;
    this.bound = true;
    const gd = this.div;
    let timer = null;
    gd.on("plotly_relayout", (ev) => {
      if (this.redrawing) return;
      const keys = Object.keys(ev || {});
      if (!keys.some((k) => k.startsWith("xaxis") || k.startsWith("yaxis"))) return;
      if (this.opts.onXRange && !this.syncing) this.opts.onXRange(gd._fullLayout.xaxis.range.slice(), ev);
      if (this.opts.onView) this.opts.onView(this.view(), keys.some((k) => k.endsWith("autorange")));
      clearTimeout(timer);
      timer = setTimeout(() => this.refetch(), 120);
    });
    gd.addEventListener("mousemove", (e) => this.hover(e));
    gd.addEventListener("mouseleave", () => { this.tip.style.display = "none"; });
    let down = null;
    gd.addEventListener("mousedown", (e) => { down = [e.clientX, e.clientY]; });
    gd.addEventListener("click", (e) => {
      if (down && Math.hypot(e.clientX - down[0], e.clientY - down[1]) > 4) return;
      const p = this.toData(e);
      if (!p || !this.opts.onPick) return;
      const hit = this.rectAt(p);
      this.opts.onPick(Math.max(0, Math.min(this.nEvents - 1, Math.round(p.x - this.shift))), hit);
    });
  }

  /** Pointer position -> data coordinates on the map's axes (null outside the map). */
  toData(e) {
    const fl = this.div._fullLayout;
    if (!fl || !fl.xaxis || !fl.yaxis) return null;
    const box = this.div.getBoundingClientRect();
    const px = e.clientX - box.left - fl.xaxis._offset, py = e.clientY - box.top - fl.yaxis._offset;
    if (px < 0 || px > fl.xaxis._length || py < 0 || py > fl.yaxis._length) return null;
    const [xa, xb] = fl.xaxis.range, [ya, yb] = fl.yaxis.range;
    return { x: xa + (px / fl.xaxis._length) * (xb - xa), y: yb - (py / fl.yaxis._length) * (yb - ya) };
  }

  rectAt(p) {
    let best = null;
    const x = p.x - this.shift;
    for (const r of this.rects) {
      if (x >= r.x0 && x <= r.x1 && p.y >= r.y0 && p.y <= r.y1 && (!best || r.size < best.size)) best = r;
    }
    return best;
  }

  hover(e) {
    const p = this.toData(e);
    const r = p && this.rectAt(p);
    if (!r) { this.tip.style.display = "none"; return; }
    const lines = [
      r.n > 1 ? `${r.n} tensors merged at this zoom (e.g. ${tensorLabel(r.tensor, r.op, r.offset)})` : tensorLabel(r.tensor, r.op, r.offset),
      `op: ${r.op || "–"}`,
      `size: ${bothBytes(r.size)}`,
      `offset: ${fmtBytes(r.offset)} (${fmtInt(r.offset)})${r.chunk ? `, chunk ${r.chunk}` : ""}`,
      `allocated at event ${fmtInt(r.x0)}, ${r.x1 < this.nEvents ? `freed at event ${fmtInt(r.x1)}` : "never freed"}`,
    ];
    this.tip.textContent = lines.join("\n");
    this.tip.style.display = "block";
    this.tip.style.left = `${e.clientX + 14}px`;
    this.tip.style.top = `${e.clientY + 14}px`;
  }

  /** Fetch detail for the visible range and redraw, keeping the user's zoom. */
  async refetch() {
    const v = this.view();
    if (!v) return;
    const seq = ++this.fetchSeq;
    const x0 = Math.floor(Math.max(0, v.x0)), y0 = Math.floor(Math.max(0, v.y0));
    const win = { x0, x1: Math.max(x0 + 1, Math.ceil(v.x1)), y0, y1: Math.max(y0 + 1, Math.ceil(v.y1)) };
    try {
      const data = await memoryMap(this.ref.id, this.ref.g, win);
      if (seq !== this.fetchSeq) return;
      this.apply(data);
      this.redrawing = true;
      await this.draw(false);
      if (this.opts.onRefetch) this.opts.onRefetch(this);
    } catch (e) {
      console.warn("memory-map refetch failed", e);
    } finally {
      this.redrawing = false;
      this.div.dataset.fetches = String(Number(this.div.dataset.fetches || 0) + 1);
    }
  }

  /** Mark event i; if it is off screen, pan (same zoom) so it is in view. */
  setMarker(i) {
    this.marker = i;
    if (!this.div._fullLayout) return Promise.resolve();  // drawn with the marker once the chart is up
    this.redrawing = true;
    const fl = this.div._fullLayout;
    const update = { shapes: this.layout(true).shapes };
    let moved = false;
    if (fl && fl.xaxis) {
      const [a, b] = fl.xaxis.range, x = i + this.shift;
      if (x < a || x > b) { update["xaxis.range"] = [x - (b - a) / 2, x + (b - a) / 2]; moved = true; }
    }
    return Plotly.relayout(this.div, update).finally(() => {
      this.redrawing = false;
      if (moved) {
        if (this.opts.onXRange) this.opts.onXRange(this.div._fullLayout.xaxis.range.slice());
        if (this.opts.onView) this.opts.onView(this.view());
        this.refetch();
      }
    });
  }

  /** Draw extra shapes over the map (display x, i.e. event index + shift); they survive re-fetches. */
  setOverlay(shapes) {
    this.extraShapes = shapes;
    if (!this.div._fullLayout) return Promise.resolve();
    return Plotly.relayout(this.div, { shapes: this.layout(true).shapes });
  }

  /** Show x range [a, b] (used to keep two maps aligned, and to jump to an event). */
  setXRange(range) {
    if (!this.div._fullLayout) return Promise.resolve();
    this.syncing = true;
    return Plotly.relayout(this.div, { "xaxis.range": range }).finally(() => { this.syncing = false; });
  }

  /** Center the view on event i, showing about `span` events. */
  focus(i, span) {
    const w = span || Math.max(20, Math.min(this.nEvents, 200)), c = i + this.shift;
    return this.setXRange([c - w / 2, c + w / 2]);
  }
}
