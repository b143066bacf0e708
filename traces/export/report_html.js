// alloctrace report: draws the charts of a self-contained report from the JSON inside the page (no network).
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const GiB = 1073741824, MiB = 1048576, KiB = 1024;
  const fmt = (n) => (n >= GiB ? `${(n / GiB).toFixed(2)} GiB` : n >= MiB ? `${(n / MiB).toFixed(2)} MiB` : n >= KiB ? `${(n / KiB).toFixed(1)} KiB` : `${n} B`);
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

  function ggmlMap(d) {
    const c = document.getElementById(d.id), g = c.getContext("2d"), s = d.shapes;
    const [x0, x1, y0, y1] = d.window, W = c.width - 60, H = c.height - 30;
    const X = (v) => 50 + ((v - x0) / Math.max(1, x1 - x0)) * W, Y = (v) => 10 + H - ((v - y0) / Math.max(1, y1 - y0)) * H;
    g.fillStyle = "#fff"; g.fillRect(0, 0, c.width, c.height);
    for (let i = 0; i < s.x0.length; i++) {
      g.fillStyle = hue(s.tensor[i] || "?");
      g.fillRect(X(s.x0[i]), Y(s.y1[i]), Math.max(1, X(s.x1[i]) - X(s.x0[i])), Math.max(1, Y(s.y0[i]) - Y(s.y1[i])));
    }
    const top = d.buffer_size || d.max_size;
    if (top) { g.strokeStyle = "#c0392b"; g.beginPath(); g.moveTo(50, Y(top)); g.lineTo(50 + W, Y(top)); g.stroke(); }
    g.fillStyle = "#334"; g.font = "11px sans-serif";
    g.fillText(fmt(y1), 2, 14); g.fillText("0", 2, 10 + H); g.fillText(`events ${x0}–${x1}`, 50, c.height - 6);
    c.dataset.ready = "1"; c.dataset.boxes = String(s.x0.length);
  }

  for (const d of data) (d.kind === "torch-timeline" ? torchTimeline : ggmlMap)(d);
  document.body.dataset.drawn = "1";
})();
