// The memory map: x = event index, y = byte offset, one rectangle per tensor lifetime.
// Rectangles are drawn as filled WebGL polygons (one trace per op, null-separated), so a
// dense view stays fast; zoom and pan re-fetch detail for the visible range from the server.
import { api, fmtBytes, exactBytes, fmtInt, opColor, hashColor, pick, rows, graphBase, el } from "/static/common.js";

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

function normRect(r) {
  const x0 = Number(pick(r, "x0", "alloc", "start")), y0 = Number(pick(r, "y0", "offset"));
  let x1 = pick(r, "x1", "free", "end"), y1 = pick(r, "y1");
  const size = Number(pick(r, "size") ?? (y1 !== undefined ? y1 - y0 : 0));
  if (y1 === undefined) y1 = y0 + size;
  return {
    x0, x1: Number(x1 ?? x0 + 1), y0, y1: Number(y1), size,
    tensor: pick(r, "tensor", "name") ?? "", op: pick(r, "op") ?? "", count: pick(r, "count", "merged", "n"),
    alloc: pick(r, "alloc", "alloc_event", "x0"), free: pick(r, "free", "free_event"), chunk: pick(r, "chunk"),
    offset: pick(r, "offset", "y0"),
  };
}

function normFreeList(fl) {
  return rows(fl).map((r) => ({
    x: Number(pick(r, "i", "event", "x")), n: pick(r, "n_free", "n_blocks", "n"),
    largest: pick(r, "largest_free", "largest"), total: pick(r, "total_free", "total"),
  })).filter((r) => Number.isFinite(r.x));
}

// SVG draws a few thousand rectangles faster than starting WebGL (much faster without a GPU);
// the server caps a view at max_shapes, so WebGL is only used when a page asks for more.
const WEBGL_ABOVE = 3500;

export class MemoryMap {
  /**
   * div: where to draw; ref: {id, g}; opts: {title, freeList, height, onPick(i), onXRange([a,b])}
   */
  constructor(div, ref, opts = {}) {
    this.div = div; this.ref = ref; this.opts = { freeList: true, ...opts };
    this.base = graphBase(ref.id, ref.g);
    this.rects = []; this.marker = null; this.extraShapes = []; this.extraAnnotations = [];
    this.fetchSeq = 0; this.syncing = false;
    this.shift = Number(this.opts.xShift || 0); // display x = event index + shift (aligns two runs)
    this.tip = el("div", { class: "map-tip", role: "tooltip" });
    Object.assign(this.tip.style, {
      position: "fixed", pointerEvents: "none", background: "#1d2330", color: "#fff", padding: "6px 9px",
      borderRadius: "6px", font: "12px/1.45 var(--sans)", display: "none", zIndex: 20, maxWidth: "420px",
      whiteSpace: "pre-wrap", wordBreak: "break-all", boxShadow: "0 2px 10px rgba(0,0,0,.25)",
    });
    document.body.append(this.tip);
  }

  /** First render of the whole graph. */
  async load(summary) {
    this.summary = summary || {};
    this.maxShapes = window.__maxShapes || Math.max(1200, Math.min(3000, Math.round(window.innerWidth * 1.5)));
    let data;
    try { data = await api(`${this.base}/memory-map?max_shapes=${this.maxShapes}`); }
    catch (e) { this.maxShapes = 2000; data = await api(`${this.base}/memory-map?max_shapes=${this.maxShapes}`); }
    this.full = data;
    this.nEvents = Number(pick(data, "n_events", "x1") ?? pick(this.summary, "n_events") ?? 0) ||
      Math.max(1, ...(data.rects || data.rectangles || []).map((r) => Number(pick(r, "x1", "free") || 0)));
    this.maxSize = pick(data, "max_size") ?? this.summary.max_size;
    this.bufferSize = pick(data, "buffer_size") ?? this.summary.buffer_size;
    this.oom = pick(data, "oom") ?? this.summary.oom ?? null;
    if (this.oom && this.oom.event === undefined) this.oom = { ...this.oom, event: await this.findOomEvent() };
    this.apply(data);
    this.draw(true);
    this.bind();
    return this;
  }

  async findOomEvent() {
    try {
      const r = await api(`${this.base}/events?kind=oom&limit=1`);
      const e = (r.events || [])[0];
      if (e) return pick(e, "i", "index", "event");
    } catch (_) { /* fall back to the last event */ }
    return Math.max(0, this.nEvents - 1);
  }

  apply(data) {
    this.rects = rows(data.shapes || data.rects || data.rectangles || []).map(normRect);
    for (const r of this.rects) if (r.free === undefined && r.x1 < this.nEvents) r.free = r.x1;
    this.truncated = !!pick(data, "truncated", "reduced");
    this.freeList = normFreeList(pick(data, "series", "free_list", "freelist", "free") || []);
  }

  yTop() {
    let top = 1;
    for (const r of this.rects) if (r.y1 > top) top = r.y1;
    const ext = pick(this.full || {}, "y_extent", "y1");
    return Math.max(top, Number(ext) || 0, this.maxSize || 0, this.bufferSize || 0);
  }

  /** Names written inside the rectangles that are big enough on screen to hold them. */
  labelTrace(xr, yr) {
    const w = Math.max(200, (this.div.clientWidth || 1000) - 280);
    const h = Math.max(120, (this.div.clientHeight || 500) * (this.opts.freeList ? 0.62 : 0.85) - 60);
    const sx = w / Math.max(1e-9, xr[1] - xr[0]), sy = h / Math.max(1e-9, yr[1] - yr[0]);
    const cand = [];
    for (const r of this.rects) {
      const a = Math.max(r.x0 + this.shift, xr[0]), b = Math.min(r.x1 + this.shift, xr[1]);
      const c = Math.max(r.y0, yr[0]), d = Math.min(r.y1, yr[1]);
      const pw = (b - a) * sx, ph = (d - c) * sy;
      const label = r.count > 1 ? `${r.count} tensors` : r.tensor;
      if (ph >= 13 && pw >= Math.max(30, String(label).length * 6.6 + 8)) cand.push({ x: (a + b) / 2, y: (c + d) / 2, t: label, area: pw * ph });
    }
    cand.sort((p, q) => q.area - p.area);
    const top = cand.slice(0, 80);
    return { type: "scatter", mode: "text", x: top.map((p) => p.x), y: top.map((p) => p.y), text: top.map((p) => plotText(p.t)),
      textfont: { size: 11, color: "#1d2330", family: "ui-monospace, DejaVu Sans Mono, monospace" }, hoverinfo: "skip",
      showlegend: false, name: "labels", xaxis: "x", yaxis: "y" };
  }

  traces(xr, yr) {
    const byOp = new Map();
    const opsSeen = new Set(this.rects.map((r) => r.op).filter((o) => o && o !== "?"));
    this.colorBy = opsSeen.size ? "op" : "tensor";
    for (const r of this.rects) {
      const k = this.colorBy === "op" ? (r.op || "?") : hashColor(r.tensor);
      if (!byOp.has(k)) byOp.set(k, { x: [], y: [] });
      const t = byOp.get(k);
      const a = r.x0 + this.shift, b = r.x1 + this.shift;
      t.x.push(a, b, b, a, a, null);
      t.y.push(r.y0, r.y0, r.y1, r.y1, r.y0, null);
    }
    const ops = [...byOp.keys()].sort();
    const byTensor = this.colorBy === "tensor";
    const dense = this.rects.length > WEBGL_ABOVE;
    const kind = dense ? "scattergl" : "scatter";
    if (!byTensor) for (const op of ops) opColor(op);  // register in sorted order: stable colors
    const out = ops.map((op, k) => {
      const color = byTensor ? op : opColor(op);
      return {
        type: kind, mode: "lines", fill: "toself", name: byTensor ? "tensors (colored by name)" : plotText(op),
        legendgroup: byTensor ? "tensors" : "ops", showlegend: !byTensor || k === 0,
        x: byOp.get(op).x, y: byOp.get(op).y, hoverinfo: "skip",
        line: { width: 0.6, color }, fillcolor: color + "b3", xaxis: "x", yaxis: "y",
      };
    });
    if (xr && yr) out.push(this.labelTrace(xr, yr));
    const sh = this.shift, xEnd = this.nEvents + sh;
    const hline = (v, name, color, dash) => ({
      type: "scatter", mode: "lines", name: `${name} (${fmtBytes(v)})`, x: [sh, xEnd], y: [v, v],
      line: { color, width: 1.6, dash }, hovertemplate: `${name}: ${exactBytes(v)}<extra></extra>`, xaxis: "x", yaxis: "y",
    });
    if (this.maxSize) out.push(hline(this.maxSize, "max_size", "#1d2330", "dash"));
    if (this.bufferSize) out.push(hline(this.bufferSize, "buffer size", "#c0352b", "dot"));
    if (this.opts.freeList && this.freeList.length) {
      const fl = this.freeList;
      out.push({
        type: "scatter", mode: "lines", name: "largest free block", x: fl.map((r) => r.x + sh), y: fl.map((r) => r.largest),
        line: { color: "#22804a", width: 1.4, shape: "hv" }, xaxis: "x", yaxis: "y2",
        customdata: fl.map((r) => fmtBytes(r.largest)),
        hovertemplate: "event %{x}<br>largest free block: %{customdata} (%{y:,} bytes)<extra></extra>",
      });
      out.push({
        type: "scatter", mode: "lines", name: "free blocks (count)", x: fl.map((r) => r.x + sh), y: fl.map((r) => r.n),
        line: { color: "#9467bd", width: 1.2, shape: "hv" }, xaxis: "x", yaxis: "y3",
        hovertemplate: "event %{x}<br>free blocks: %{y}<extra></extra>",
      });
      if (this.oom && this.oom.needed) {
        out.push({
          type: "scatter", mode: "markers+text", name: "needed at the failure", x: [this.oom.event + sh], y: [this.oom.needed],
          marker: { color: "#c0352b", size: 11, symbol: "x" }, text: [`needed ${fmtBytes(this.oom.needed)}`],
          textposition: "middle left", textfont: { color: "#c0352b", size: 12 }, xaxis: "x", yaxis: "y2",
          hovertemplate: `needed ${exactBytes(this.oom.needed)}<extra></extra>`,
        });
      }
    }
    return out;
  }

  layout(keepRanges) {
    const fl = this.opts.freeList && this.freeList.length;
    const gd = this.div;
    const cur = keepRanges && gd._fullLayout ? gd._fullLayout : null;
    const xr = cur ? cur.xaxis.range.slice() : (this.opts.xRange || [this.shift, this.nEvents + this.shift]);
    const yr = cur ? cur.yaxis.range.slice() : [0, this.yTop() * 1.04];
    const ticks = byteTicks(Math.max(0, yr[0]), yr[1]);
    const flMax = fl ? Math.max(1, ...this.freeList.map((r) => r.largest || 0), (this.oom && this.oom.needed) || 0) : 1;
    const flTicks = byteTicks(0, flMax * 1.1, 3);
    const nMax = fl ? Math.max(1, ...this.freeList.map((r) => r.n || 0)) : 1;
    const shapes = [...this.extraShapes];
    const annotations = [...this.extraAnnotations];
    if (this.oom && this.oom.event !== undefined && this.oom.event !== null) {
      const ox = this.oom.event + this.shift;
      shapes.push({ type: "line", xref: "x", yref: "paper", x0: ox, x1: ox, y0: 0, y1: 1,
        line: { color: "#c0352b", width: 2 } });
      annotations.push({ xref: "x", yref: "paper", x: ox, y: 1, yanchor: "bottom", xanchor: "right",
        text: plotText(`out of space at event ${this.oom.event}: ${this.oom.tensor ?? ""} needed ${fmtBytes(this.oom.needed)}, largest free ${fmtBytes(pick(this.oom, "largest_available", "largest", "largest_free"))}`),
        showarrow: false, font: { color: "#c0352b", size: 12 }, bgcolor: "rgba(255,255,255,0.85)" });
    }
    if (this.marker !== null) {
      const mx = this.marker + this.shift;
      shapes.push({ type: "line", xref: "x", yref: "paper", x0: mx, x1: mx, y0: 0, y1: 1,
        line: { color: "#2f5fd0", width: 1.5, dash: "dot" }, name: "selected" });
    }
    return {
      title: this.opts.title ? { text: plotText(this.opts.title), x: 0.01, font: { size: 14 } } : undefined,
      margin: { l: 78, r: 200, t: this.opts.title ? 52 : 30, b: 44 },
      paper_bgcolor: "#ffffff", plot_bgcolor: "#fbfcfe", font: { family: "system-ui, sans-serif", size: 12, color: "#1d2330" },
      dragmode: "zoom", hovermode: "closest", uirevision: "keep",
      showlegend: true, legend: { x: fl ? 1.07 : 1.02, xanchor: "left", y: 1, yanchor: "top", font: { size: 11 },
        title: { text: "key", font: { size: 11, color: "#5d6677" } } },
      xaxis: { title: { text: "event index" }, range: xr, zeroline: false, gridcolor: "#eceff4", anchor: fl ? "y2" : "y",
        tickformat: ",d", dtick: this.nEvents <= 12 ? 1 : undefined },
      yaxis: { title: { text: "offset in buffer" }, domain: fl ? [0.32, 1] : [0, 1], range: yr, zeroline: false,
        tickvals: ticks.tickvals, ticktext: ticks.ticktext, gridcolor: "#eceff4", fixedrange: false },
      yaxis2: fl ? { title: { text: "largest free", font: { size: 11 } }, domain: [0, 0.24], rangemode: "tozero",
        range: [0, flMax * 1.1], tickvals: flTicks.tickvals, ticktext: flTicks.ticktext, gridcolor: "#eceff4", fixedrange: true } : undefined,
      yaxis3: fl ? { title: { text: "free blocks", font: { size: 11 } }, overlaying: "y2", side: "right",
        rangemode: "tozero", showgrid: false, fixedrange: true, tickformat: ",d",
        dtick: nMax <= 6 ? 1 : undefined } : undefined,
      shapes, annotations,
    };
  }

  draw(first) {
    const config = { responsive: true, displaylogo: false, scrollZoom: true,
      modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d"] };
    const layout = this.layout(!first);
    const p = Plotly.react(this.div, this.traces(layout.xaxis.range, layout.yaxis.range), layout, config);
    if (first) {
      return p.then(() => {
        this.div.dataset.ready = "1";
        window.__mapReady = true;
        if (window.__mapReadyAt === undefined) window.__mapReadyAt = performance.now();
        if (this.opts.onReady) this.opts.onReady(this);
      });
    }
    return p;
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
    for (const r of this.rects) {
      if (p.x >= r.x0 && p.x <= r.x1 && p.y >= r.y0 && p.y <= r.y1 && (!best || r.size < best.size)) best = r;
    }
    return best;
  }

  hover(e) {
    const p = this.toData(e);
    const r = p && this.rectAt(p);
    if (!r) { this.tip.style.display = "none"; return; }
    const lines = [
      r.count > 1 ? `${r.count} tensors merged at this zoom (e.g. ${r.tensor})` : `${r.tensor}`,
      `op: ${r.op || "–"}`,
      `size: ${fmtBytes(r.size)} (${exactBytes(r.size)})`,
      `offset: ${fmtBytes(r.offset)} (${fmtInt(r.offset)} bytes)${r.chunk ? `, chunk ${r.chunk}` : ""}`,
      `allocated at event ${r.alloc ?? r.x0}, ${r.free !== undefined && r.free !== null ? `freed at event ${r.free}` : "never freed"}`,
    ];
    this.tip.textContent = lines.join("\n");
    this.tip.style.display = "block";
    this.tip.style.left = `${e.clientX + 14}px`;
    this.tip.style.top = `${e.clientY + 14}px`;
  }

  /** Fetch detail for the visible range and redraw, keeping the user's zoom. */
  async refetch() {
    const fl = this.div._fullLayout;
    if (!fl) return;
    const [x0, x1] = fl.xaxis.range.map((v) => v - this.shift), [y0, y1] = fl.yaxis.range;
    const seq = ++this.fetchSeq;
    const qx0 = Math.floor(Math.max(0, x0)), qy0 = Math.floor(Math.max(0, y0));
    const q = new URLSearchParams({ x0: qx0, x1: Math.max(qx0 + 1, Math.ceil(x1)), y0: qy0,
      y1: Math.max(qy0 + 1, Math.ceil(y1)), max_shapes: this.maxShapes });
    try {
      const data = await api(`${this.base}/memory-map?${q}`);
      if (seq !== this.fetchSeq) return;
      const keepFree = this.freeList;
      this.apply(data);
      if (!this.freeList.length) this.freeList = keepFree;
      this.redrawing = true;
      await this.draw(false);
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
    this.redrawing = true;
    const fl = this.div._fullLayout;
    const update = { shapes: this.layout(true).shapes };
    let moved = false;
    if (fl && fl.xaxis) {
      const [a, b] = fl.xaxis.range, x = i + this.shift;
      if (x < a || x > b) { update["xaxis.range"] = [x - (b - a) / 2, x + (b - a) / 2]; moved = true; }
    }
    Plotly.relayout(this.div, update).finally(() => {
      this.redrawing = false;
      if (moved) {
        if (this.opts.onXRange) this.opts.onXRange(this.div._fullLayout.xaxis.range.slice());
        this.refetch();
      }
    });
  }

  /** Show x range [a, b] (used to keep two maps aligned, and to jump to an event). */
  setXRange(range) {
    this.syncing = true;
    return Plotly.relayout(this.div, { "xaxis.range": range }).finally(() => { this.syncing = false; });
  }

  /** Center the view on event i, showing about `span` events. */
  focus(i, span) {
    const w = span || Math.max(20, Math.min(this.nEvents, 200)), c = i + this.shift;
    return this.setXRange([c - w / 2, c + w / 2]);
  }
}
