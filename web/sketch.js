// A still picture of a Plotly figure on a <canvas>, drawn from the same traces and layout the page hands to
// Plotly.react: the map is on screen while Plotly.js (about a second of parsing and start-up) still loads, and
// Plotly's chart then takes its place with the same colours, axes and plot area. It draws the subset the map
// and the PyTorch timeline use: scatter lines (filled polygons or to zero, steps, dashes), text, markers, line
// and rectangle shapes, annotations on x / paper references, one to three y axes, and the key (a column right
// of the plot or a row below it).

const DASH = { dot: [3, 3], dash: [9, 9], longdash: [15, 15], dashdot: [9, 3, 3, 3] };  // Plotly's, for widths <= 3
const unescape = (s) => String(s ?? "").replace(/&lt;/g, "<").replace(/&gt;/g, ">").replace(/&amp;/g, "&");

/**
 * Plotly's automatic ticks: the range over 5-10 parts (one per 80 px on x, 40 px on y), the part rounded up to
 * the next of 2, 5 or 10 x 10^n strictly above it (so 2,000 becomes 5,000, as Plotly does).
 */
function autoTicks(lo, hi, lengthPx, minPx) {
  const n = Math.min(9, Math.max(4, lengthPx / minPx)) + 1;
  const rough = Math.abs(hi - lo) / n;
  if (!(rough > 0)) return [lo];
  const base = 10 ** Math.floor(Math.log10(rough));
  const step = base * ([2, 5, 10].find((m) => m > rough / base) || 20);
  const out = [];
  for (let k = Math.ceil(lo / step); k * step <= hi && out.length < 50; k++) out.push(k * step || 0);  // never -0
  return out;
}

const intText = (v) => Math.round(v).toLocaleString("en-US");

/** One axis: its pixel span on the canvas and value -> pixel. */
function axis(spec, range, from, to, vertical) {
  const [a, b] = range;
  const len = to - from;
  const px = (v) => (vertical ? to - ((v - a) / (b - a || 1)) * len : from + ((v - a) / (b - a || 1)) * len);
  return { spec, range, from, to, px, len: Math.abs(len) };
}

/** An axis range from the data: x spans it exactly, y from zero with 5% room above (Plotly's autorange for lines). */
function dataRange(traces, key, which) {
  let lo = Infinity, hi = -Infinity;
  for (const t of traces) {
    if ((t[which] || (which === "yaxis" ? "y" : "x")) !== key) continue;
    for (const v of (which === "yaxis" ? t.y : t.x) || []) if (v !== null && v !== undefined) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  }
  if (!(hi >= lo)) return [0, 1];
  if (which === "xaxis") return hi > lo ? [lo, hi] : [lo - 1, hi + 1];
  return [0, hi > 0 ? hi * 1.05 : 1];
}

/**
 * Plotly's autorange of an x axis: the data and x-referenced shapes span it, and each x-referenced
 * annotation needs half its text's width (plus 2 px) inside the plot: of every pair of a lowest and a highest
 * point, the one needing the most units per pixel sets the range.
 */
function xAutoRange(ctx, traces, layout, len, family, size) {
  const [lo, hi] = dataRange(traces, "x", "xaxis");
  const pts = [{ v: lo, p: 0 }, { v: hi, p: 0 }];
  for (const s of layout.shapes || []) if (s.xref === "x") pts.push({ v: s.x0, p: 0 }, { v: s.x1, p: 0 });
  for (const a of layout.annotations || []) {
    if (a.xref !== "x") continue;
    ctx.font = `${(a.font || {}).size || size}px ${family}`;
    pts.push({ v: a.x, p: ctx.measureText(unescape(a.text)).width / 2 + 2 });
  }
  let best = null;
  for (const a of pts) {
    for (const b of pts) {
      if (!(b.v > a.v) || len - a.p - b.p <= 0) continue;
      const k = (b.v - a.v) / (len - a.p - b.p);
      if (!best || k > best.k) best = { k, a, b };
    }
  }
  return best ? [best.a.v - best.k * best.a.p, best.b.v + best.k * best.b.p] : [lo, hi];
}

function setLine(ctx, line = {}) {
  ctx.strokeStyle = line.color || "#444";
  ctx.lineWidth = line.width ?? 2;
  ctx.setLineDash(DASH[line.dash] || []);
}

/** Polylines (and polygons when filled) through x/y, split at nulls; `hv` draws steps. */
function drawLines(ctx, t, xa, ya) {
  const parts = [];
  let cur = [];
  for (let i = 0; i < t.x.length; i++) {
    if (t.x[i] === null || t.y[i] === null) { if (cur.length) parts.push(cur); cur = []; continue; }
    cur.push([xa.px(t.x[i]), ya.px(t.y[i])]);
  }
  if (cur.length) parts.push(cur);
  const hv = t.line && t.line.shape === "hv";
  const path = (pts) => {
    ctx.beginPath();
    pts.forEach(([x, y], i) => {
      if (i === 0) ctx.moveTo(x, y);
      else { if (hv) ctx.lineTo(x, pts[i - 1][1]); ctx.lineTo(x, y); }
    });
  };
  if (t.fill === "toself" || t.fill === "tozeroy") {
    ctx.fillStyle = t.fillcolor || (t.line && t.line.color) || "#888";
    const zero = ya.px(0);
    for (const p of parts) {
      path(p);
      if (t.fill === "tozeroy") { ctx.lineTo(p[p.length - 1][0], zero); ctx.lineTo(p[0][0], zero); }
      ctx.closePath(); ctx.fill();
    }
  }
  if ((t.line && t.line.width === 0)) return t.fill === "toself" ? parts.length : 0;
  setLine(ctx, t.line);
  for (const p of parts) { path(p); ctx.stroke(); }
  return t.fill === "toself" ? parts.length : 0;
}

function drawText(ctx, text, x, y, font, color, align = "center", baseline = "middle") {
  ctx.font = font;
  ctx.fillStyle = color;
  ctx.textAlign = align;
  ctx.textBaseline = baseline;
  ctx.fillText(unescape(text), x, y);
}

/**
 * Draw `traces` and `layout` (as given to Plotly.react) onto a canvas laid over `div`; returns the canvas,
 * with `data-shapes` set to the number of filled polygons drawn. The caller removes it once Plotly has drawn.
 */
export function sketchFigure(div, traces, layout) {
  const W = div.clientWidth || 1000, H = div.clientHeight || 500;
  const ratio = window.devicePixelRatio || 1;
  const canvas = document.createElement("canvas");
  canvas.className = "figure-sketch";
  canvas.width = Math.round(W * ratio); canvas.height = Math.round(H * ratio);
  Object.assign(canvas.style, { position: "absolute", left: "0", top: "0", width: `${W}px`, height: `${H}px`, zIndex: 1 });
  canvas.setAttribute("role", "img");
  canvas.setAttribute("aria-label", "the chart, as a still picture while the interactive one loads");
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  const m = layout.margin || { l: 80, r: 80, t: 100, b: 80 };
  const font = layout.font || {};
  const family = font.family || "sans-serif", ink = font.color || "#444", size = font.size || 12;
  const lg = layout.showlegend !== false && layout.legend ? layout.legend : null;
  const legendFont = lg ? `${(lg.font || {}).size || size}px ${family}` : "";
  const keyed = lg ? traces.filter((t) => t.showlegend !== false && t.name) : [];
  let right = m.r;
  const horizontal = lg && lg.orientation === "h";
  let bottom = m.b;
  if (horizontal && (lg.y ?? 1) < 0) {
    // a one-row key below the plot: Plotly widens the bottom margin until its 28 px (plus a 12 px pad),
    // hung at y (a fraction of the plot's height below it), fit
    const y = lg.y;
    bottom = Math.max(m.b, Math.round((40 + (m.t - H) * y) / (1 - y)));
  } else if (lg && (lg.x ?? 1.02) > 1) {
    // Plotly widens the right margin until a key placed right of the plot fits: its left edge sits at
    // x (a fraction of the plot's width) and it is 45 px wider than its longest name, plus a 12 px pad
    ctx.font = legendFont;
    const width = Math.ceil(45 + Math.max(0, ...keyed.map((t) => ctx.measureText(unescape(t.name)).width)));
    const x = lg.x ?? 1.02;
    right = Math.max(m.r, Math.round(W - m.l - (W - m.l - width - 12) / x));
  }
  const x0 = m.l, x1 = W - right, y0 = m.t, y1 = H - bottom, pw = x1 - x0, ph = y1 - y0;
  ctx.fillStyle = layout.paper_bgcolor || "#fff";
  ctx.fillRect(0, 0, W, H);

  // axes: x over the full width, each y over its domain (yaxis3 overlays yaxis2 on the right)
  const xs = layout.xaxis || {};
  const xa = axis(xs, xs.range || xAutoRange(ctx, traces, layout, pw, family, size), x0, x1, false);
  const ys = {};
  for (const key of ["y", "y2", "y3"]) {
    const name = key === "y" ? "yaxis" : `yaxis${key.slice(1)}`;
    const spec = layout[name];
    if (!spec && key !== "y") continue;
    const s = spec || {};
    const dom = s.overlaying ? (layout[`yaxis${s.overlaying.slice(1)}`] || {}).domain || [0, 1] : s.domain || [0, 1];
    ys[key] = axis(s, s.range || dataRange(traces, key, "yaxis"), y1 - dom[1] * ph, y1 - dom[0] * ph, true);
  }
  const own = Object.entries(ys).filter(([, a]) => !a.spec.overlaying);
  for (const [, ya] of own) {
    ctx.fillStyle = layout.plot_bgcolor || "#fff";
    ctx.fillRect(x0, ya.from, pw, ya.len);
  }
  const tickFont = `${size}px ${family}`;
  const xticks = xs.tickvals || autoTicks(xa.range[0], xa.range[1], pw, 80);
  ctx.setLineDash([]);
  ctx.lineWidth = 1;
  for (const [, ya] of own) {  // grid lines: x in every subplot, y in its own
    ctx.strokeStyle = xs.gridcolor || "#eee";
    for (const v of xticks) { const p = Math.round(xa.px(v)) + 0.5; ctx.beginPath(); ctx.moveTo(p, ya.from); ctx.lineTo(p, ya.to); ctx.stroke(); }
    const yt = ya.spec.tickvals || autoTicks(ya.range[0], ya.range[1], ya.len, 40);
    ctx.strokeStyle = ya.spec.gridcolor || "#eee";
    for (const v of yt) { const p = Math.round(ya.px(v)) + 0.5; if (p < ya.from || p > ya.to + 1) continue; ctx.beginPath(); ctx.moveTo(x0, p); ctx.lineTo(x1, p); ctx.stroke(); }
  }
  const axisBottom = ys.y2 ? ys.y2.to : ys.y.to;
  for (const v of xticks) {
    if (v < Math.min(...xa.range) || v > Math.max(...xa.range)) continue;
    drawText(ctx, xs.tickformat === ",d" ? intText(v) : String(v), xa.px(v), axisBottom + 4, tickFont, xs.color || ink, "center", "top");
  }
  // axis titles about where Plotly puts them: 36 px under the x axis, beside a y axis's widest tick label
  if (xs.title) drawText(ctx, xs.title.text, x0 + pw / 2, axisBottom + 36, `${(xs.title.font || {}).size || size + 2}px ${family}`, xs.color || ink);
  for (const [, ya] of Object.entries(ys)) {
    const s = ya.spec, right = s.side === "right";
    const vals = s.tickvals || autoTicks(ya.range[0], ya.range[1], ya.len, 40).filter((v) => !s.dtick || Number.isInteger(v));
    let widest = 0;
    vals.forEach((v, i) => {
      const p = ya.px(v);
      if (p < ya.from - 1 || p > ya.to + 1) return;
      const text = s.ticktext ? s.ticktext[i] : s.tickformat === ",d" ? intText(v) : String(v);
      drawText(ctx, text, right ? x1 + 4 : x0 - 4, p, tickFont, s.color || ink, right ? "left" : "right");
      widest = Math.max(widest, ctx.measureText(text).width);
    });
    if (s.title) {
      ctx.save();
      const tx = right ? x1 + widest + 15 : x0 - widest - 15;
      ctx.translate(tx, (ya.from + ya.to) / 2);
      ctx.rotate(right ? Math.PI / 2 : -Math.PI / 2);
      drawText(ctx, s.title.text, 0, 0, `${(s.title.font || {}).size || size + 2}px ${family}`, s.color || ink);
      ctx.restore();
    }
  }

  // shapes on the layer below the traces (bands), then the traces, each clipped to its subplot
  const paperY = (v) => y1 - v * ph;
  const shapeY = (s, v) => (s.yref === "paper" ? paperY(v) : (ys[s.yref || "y"] || ys.y).px(v));
  const drawShape = (s) => {
    if (s.type === "rect") {
      const a = xa.px(s.x0), b = xa.px(s.x1), c = shapeY(s, s.y0), d = shapeY(s, s.y1);
      if (s.fillcolor) { ctx.fillStyle = s.fillcolor; ctx.fillRect(Math.min(a, b), Math.min(c, d), Math.abs(b - a), Math.abs(d - c)); }
      if (s.line && s.line.width) { setLine(ctx, s.line); ctx.strokeRect(Math.min(a, b), Math.min(c, d), Math.abs(b - a), Math.abs(d - c)); }
    } else if (s.type === "line") {
      setLine(ctx, s.line);
      ctx.beginPath(); ctx.moveTo(xa.px(s.x0), shapeY(s, s.y0)); ctx.lineTo(xa.px(s.x1), shapeY(s, s.y1)); ctx.stroke();
    }
  };
  ctx.save();
  ctx.beginPath(); ctx.rect(x0, y1 - ph, pw, ph); ctx.clip();
  for (const s of layout.shapes || []) if (s.layer === "below") drawShape(s);
  ctx.restore();
  let shapes = 0;
  for (const t of traces) {
    const ya = ys[t.yaxis || "y"];
    if (!ya || !t.x) continue;
    ctx.save();
    ctx.beginPath(); ctx.rect(x0, ya.from, pw, ya.len); ctx.clip();
    const mode = t.mode || "lines";
    if (mode.includes("lines")) shapes += drawLines(ctx, t, xa, ya);
    if (mode.includes("markers")) {
      const mk = t.marker || {}, r = (mk.size || 6) / 2;
      ctx.strokeStyle = mk.color || ink; ctx.lineWidth = 2; ctx.setLineDash([]);
      t.x.forEach((x, i) => {
        if (x === null || t.y[i] === null) return;
        const px = xa.px(x), py = ya.px(t.y[i]);
        ctx.beginPath(); ctx.moveTo(px - r, py - r); ctx.lineTo(px + r, py + r); ctx.moveTo(px + r, py - r); ctx.lineTo(px - r, py + r); ctx.stroke();
      });
    }
    if (mode.includes("text") && t.text) {
      const tf = t.textfont || {};
      const left = (t.textposition || "").includes("left");
      t.x.forEach((x, i) => {
        if (x === null || t.y[i] === null) return;
        drawText(ctx, t.text[i], xa.px(x) + (left ? -8 : 0), ya.px(t.y[i]), `${tf.size || size}px ${tf.family || family}`,
          tf.color || ink, left ? "right" : "center");
      });
    }
    ctx.restore();
  }

  // shapes above the traces, and annotations placed in x and paper coordinates
  for (const s of layout.shapes || []) if (s.layer !== "below") drawShape(s);
  for (const a of layout.annotations || []) {
    if (a.xref !== "x" || a.yref !== "paper") continue;
    const f = a.font || {}, fs = f.size || size;
    const fnt = `${fs}px ${family}`;
    ctx.font = fnt;
    const w = ctx.measureText(unescape(a.text)).width;
    const px = xa.px(a.x) - (a.xanchor === "right" ? w : a.xanchor === "left" ? 0 : w / 2);
    const py = paperY(a.y) - (a.yanchor === "top" ? 0 : a.yanchor === "bottom" ? fs + 4 : (fs + 4) / 2);
    if (px + w < x0 || px > x1) continue;
    if (a.bgcolor) { ctx.fillStyle = a.bgcolor; ctx.fillRect(px - 2, py - 1, w + 4, fs + 4); }
    drawText(ctx, a.text, px, py + 1, fnt, f.color || ink, "left", "top");
  }

  // the key: one row per trace that shows in the legend
  if (lg) {
    const lf = legendFont;
    let lx = x0 + (lg.x ?? (horizontal ? 0 : 1.02)) * pw;
    let ly = y1 - (lg.y ?? 1) * ph + (horizontal ? 5 : 0);
    if (lg.title && lg.title.text) { drawText(ctx, lg.title.text, lx + 2, ly + 10, lf, (lg.title.font || {}).color || ink, "left"); ly += 20; }
    ctx.font = lf;
    let group;  // Plotly leaves 10 px between legend groups; a trace without a group is a group of its own
    keyed.forEach((t, i) => {
      if (!horizontal && i > 0 && (t.legendgroup === undefined || t.legendgroup !== group)) ly += 10;
      group = t.legendgroup;
      const cy = ly + 10;
      const advance = 45 + ctx.measureText(unescape(t.name)).width;
      if (t.fill === "toself" || t.fill === "tozeroy") {
        ctx.fillStyle = t.fillcolor || "#888"; ctx.fillRect(lx + 8, cy - 6, 24, 12);
        setLine(ctx, t.line); ctx.strokeRect(lx + 8, cy - 6, 24, 12);
      } else if ((t.mode || "").includes("lines")) {
        setLine(ctx, t.line); ctx.beginPath(); ctx.moveTo(lx + 5, cy); ctx.lineTo(lx + 35, cy); ctx.stroke();
      } else if ((t.mode || "").includes("markers")) {
        ctx.fillStyle = (t.marker || {}).color || ink; ctx.fillRect(lx + 17, cy - 3, 6, 6);
      }
      drawText(ctx, t.name, lx + 40, cy, lf, ink, "left");
      if (horizontal) lx += advance; else ly += 19;
    });
  }
  canvas.dataset.shapes = String(shapes);
  div.append(canvas);
  return canvas;
}
