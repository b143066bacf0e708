// alloctrace report: draws the charts of a self-contained report from the JSON inside the page (no network).
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("report-data").textContent);
  // A copy of fmtBytes from web/common.js (this page loads nothing): tests/util/test_sizes.py checks the copies are the
  // same text and write what the CLI's fmt_bytes writes.
  const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  function fmtBytes(n) {
    if (n === null || n === undefined || Number.isNaN(Number(n))) return "–";
    let v = Math.abs(Number(n)), u = 0;
    const neg = Number(n) < 0;
    while (v >= 1024 && u < UNITS.length - 1) { v /= 1024; u++; }
    return `${neg ? "-" : ""}${u === 0 ? String(Math.trunc(v)) : v.toFixed(2)} ${UNITS[u]}`;
  }
  const fmt = fmtBytes;
  const hue = (s) => { let h = 0; for (let i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) >>> 0; return `hsl(${h % 360},55%,58%)`; };

  function torchTimeline(d) {
    const t = d.timeline, div = document.getElementById(d.id);
    const traces = [{ x: t.grid, y: t.allocated_max, name: "allocated (all)", type: "scatter", mode: "lines",
      line: { color: "#8e96a3", width: 1 }, fill: "tozeroy", fillcolor: "rgba(142,150,163,0.25)" },
    { x: t.grid, y: t.reserved_max, name: "reserved", type: "scatter", mode: "lines", line: { color: "#c0392b", width: 1, dash: "dot" } }];
    for (const b of t.bands) {
      const top = b.base.map((v) => v + b.size);
      traces.push({ x: b.x.concat(b.x.slice().reverse()), y: b.base.concat(top.reverse()), type: "scatter", mode: "lines",
        fill: "toself", fillcolor: hue(b.site), line: { width: 0.5, color: "#fff" }, showlegend: false, hoveron: "fills",
        name: "", text: `${fmt(b.size)} · entries ${b.alloc}–${b.free === null ? "end" : b.free} · ${b.site}`, hoverinfo: "text" });
    }
    const shapes = (t.annotations || []).map((a, i) => ({ type: "rect", xref: "x", yref: "paper", x0: a.x0, x1: a.x1,
      y0: a.kind === "annotation" ? 0.95 : 0.9, y1: a.kind === "annotation" ? 1 : 0.95, line: { width: 0 }, layer: "below",
      fillcolor: a.kind === "annotation" ? `rgba(76,120,168,${i % 2 ? 0.2 : 0.32})` : `rgba(238,202,59,${i % 2 ? 0.25 : 0.4})` }));
    Plotly.newPlot(div, traces, { margin: { l: 70, r: 20, t: 10, b: 40 }, hovermode: "closest", shapes,
      xaxis: { title: { text: "trace entry" }, tickformat: ",d" }, yaxis: { title: { text: "bytes" }, rangemode: "tozero" },
      legend: { orientation: "h", y: -0.15 } }, { displaylogo: false, responsive: true })
      .then(() => { div.dataset.ready = "1"; div.dataset.bands = String(t.bands.length); });
  }

  /** About n round tick values from lo to hi (powers of two for bytes, 1-2-5 steps otherwise). */
  function ticks(lo, hi, n, binary = false) {
    const raw = Math.max(1e-9, (hi - lo) / n), p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = binary ? Math.pow(2, Math.ceil(Math.log2(raw))) : [1, 2, 5, 10].map((m) => m * p).find((v) => v >= raw);
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi; v += step) out.push(v);
    return out;
  }

  // The memory map as the dashboard draws it: axes named and ticked (events across, offset in the buffer up),
  // and a legend: the largest tensors' colours and the buffer's red line.
  function ggmlMap(d) {
    const c = document.getElementById(d.id), g = c.getContext("2d"), s = d.shapes;
    const L = 78, B = 42, T = 10, R = 12;
    const [x0, x1, y0, y1] = d.window, W = c.width - L - R, H = c.height - T - B;
    const X = (v) => L + ((v - x0) / Math.max(1, x1 - x0)) * W, Y = (v) => T + H - ((v - y0) / Math.max(1, y1 - y0)) * H;
    g.fillStyle = "#fff"; g.fillRect(0, 0, c.width, c.height);
    for (let i = 0; i < s.x0.length; i++) {
      g.fillStyle = hue(s.tensor[i] || "?");
      g.fillRect(X(s.x0[i]), Y(s.y1[i]), Math.max(1, X(s.x1[i]) - X(s.x0[i])), Math.max(1, Y(s.y0[i]) - Y(s.y1[i])));
    }
    const top = d.buffer_size || d.max_size;
    const line = top && top <= y1;
    if (line) { g.strokeStyle = "#c0392b"; g.lineWidth = 2; g.beginPath(); g.moveTo(L, Y(top)); g.lineTo(L + W, Y(top)); g.stroke(); }
    g.strokeStyle = "#556"; g.lineWidth = 1; g.beginPath(); g.moveTo(L, T); g.lineTo(L, T + H); g.lineTo(L + W, T + H); g.stroke();
    g.fillStyle = "#334"; g.font = "11px sans-serif";
    g.textAlign = "right"; g.textBaseline = "middle";
    for (const v of ticks(y0, y1, 5, true)) { g.fillText(fmt(v), L - 6, Y(v)); g.fillRect(L - 3, Y(v), 3, 1); }
    g.textAlign = "center"; g.textBaseline = "top";
    for (const v of ticks(x0, x1, 8)) { g.fillText(Math.round(v).toLocaleString("en-US"), X(v), T + H + 5); g.fillRect(X(v), T + H, 1, 3); }
    g.font = "12px sans-serif"; g.fillText("event", L + W / 2, T + H + 24);
    g.save(); g.translate(12, T + H / 2); g.rotate(-Math.PI / 2); g.textBaseline = "middle";
    g.fillText("offset in the buffer (bytes)", 0, 0); g.restore();
    c.dataset.axes = "event|offset in the buffer (bytes)";
    // the legend: the largest tensors by their colour, and the buffer line
    const biggest = new Map();
    for (let i = 0; i < s.x0.length; i++) {
      const name = s.tensor[i] || "?";
      biggest.set(name, Math.max(biggest.get(name) || 0, s.size ? s.size[i] || 0 : s.y1[i] - s.y0[i]));
    }
    const legend = document.createElement("div");
    legend.className = "legend"; legend.id = `${d.id}-legend`;
    const item = (swatch, text) => {
      const span = document.createElement("span"), sw = document.createElement("i");
      sw.style.cssText = swatch; span.append(sw, text); legend.append(span);
    };
    if (line) item("background:none;border-top:2px solid #c0392b;height:0;margin-top:6px", `buffer (${fmt(top)})`);
    for (const [name] of [...biggest].sort((a, b) => b[1] - a[1]).slice(0, 10)) item(`background:${hue(name)}`, name);
    c.after(legend);
    c.dataset.ready = "1"; c.dataset.boxes = String(s.x0.length);
  }

  for (const d of data) (d.kind === "torch-timeline" ? torchTimeline : ggmlMap)(d);
  document.body.dataset.drawn = "1";
})();
