// Size attribution (diff page): a waterfall from a's high-water mark to b's, one step per family that
// moved and one for fragmentation, with the table of both peaks side by side. Clicking a family
// (bar or row) outlines its step and selects its row.
import { el, clear, bytesEl, fmtBytes, exactBytes, familyColor, plotConfig, plotTheme, loaded } from "./common.js";
import { plotText, byteTicks } from "./memmap.js";
import { familyColors } from "./palette.js";

const signed = (n) => `${n > 0 ? "+" : n < 0 ? "−" : "±"}${fmtBytes(Math.abs(n))}`;

/** Draw `att` (api.js diff()'s sizeAttribution) into `box`; la / lb label the two runs. */
export async function waterfall(box, att, la = "a", lb = "b") {
  loaded(box);
  clear(box);
  if (!att) { box.append(el("p", { class: "empty" }, "No size attribution for these graphs.")); return; }
  const moved = att.families.filter((f) => f.delta !== 0);
  familyColors.claim(att.families.map((f) => f.family));
  box.append(el("p", { id: "attribution-summary" }, "High-water mark ", bytesEl(att.a_bytes), " → ", bytesEl(att.b_bytes),
    ": ", el("strong", { title: exactBytes(att.delta) }, signed(att.delta)), ` (${moved.length} famil${moved.length === 1 ? "y" : "ies"} moved`,
    att.fragmentation_delta ? ", fragmentation " : "", att.fragmentation_delta ? el("span", { title: exactBytes(att.fragmentation_delta) }, signed(att.fragmentation_delta)) : "", ")."));
  const steps = [
    { label: la, measure: "absolute", value: att.a_bytes, family: null },
    ...moved.map((f) => ({ label: f.family, measure: "relative", value: f.delta, family: f.family })),
    ...(att.fragmentation_delta ? [{ label: "fragmentation", measure: "relative", value: att.fragmentation_delta, family: "fragmentation" }] : []),
    { label: lb, measure: "total", value: att.b_bytes, family: null },
  ];
  // category labels must be unique: a family named like a run label gets a suffix
  const seen = new Set();
  for (const s of steps) { let l = s.label; while (seen.has(l)) l += " "; seen.add(l); s.x = l; }
  const chart = el("div", { id: "attribution-chart", class: "chart", style: "height:320px" });
  box.append(chart);
  const theme = plotTheme();
  const axis = { gridcolor: theme.grid, zeroline: false, color: theme.muted };
  const layout = {
    margin: { l: 70, r: 10, t: 10, b: 90 }, showlegend: false, xaxis: { ...axis, type: "category", tickangle: -30 },
    yaxis: { ...axis, title: { text: "high-water mark" } }, shapes: [],
    paper_bgcolor: theme.paper, plot_bgcolor: theme.plot, font: { family: "system-ui, sans-serif", size: 12, color: theme.ink },
  };
  let lo = att.a_bytes, hi = att.a_bytes, run = att.a_bytes;
  for (const s of steps.slice(1, -1)) { run += s.value; lo = Math.min(lo, run); hi = Math.max(hi, run); }
  const t = byteTicks(0, Math.max(hi, att.b_bytes) * 1.05, 5);
  Object.assign(layout.yaxis, { range: [0, Math.max(hi, att.b_bytes) * 1.05], tickvals: t.tickvals, ticktext: t.ticktext });
  await Plotly.react(chart, [{
    type: "waterfall", x: steps.map((s) => plotText(s.x)), y: steps.map((s) => s.value), measure: steps.map((s) => s.measure),
    customdata: steps.map((s) => [s.family ?? "", s.measure === "relative" ? `${signed(s.value)} (${exactBytes(s.value)})` : `${fmtBytes(s.value)} (${exactBytes(s.value)})`]),
    hovertemplate: "%{x}: %{customdata[1]}<extra></extra>",
    increasing: { marker: { color: theme.bad } }, decreasing: { marker: { color: theme.good } }, totals: { marker: { color: theme.accent } },
    connector: { line: { color: theme.muted, width: 1 } },
  }], layout, plotConfig({ displayModeBar: false }));

  const status = el("p", { id: "attribution-selection", class: "hint", role: "status" }, "Click a family to see it in both peaks.");
  const tbody = el("tbody");
  const rows = [...att.families, { family: "fragmentation", a: att.a_fragmentation, b: att.b_fragmentation, delta: att.fragmentation_delta, status: "both" }];
  for (const r of rows) {
    tbody.append(el("tr", { dataset: { family: r.family }, onclick: () => select(r.family) },
      el("td", { class: "tensor" }, r.family === "fragmentation" ? "" : el("span", { class: "swatch", style: `background:${familyColor(r.family)}` }), " ", r.family, r.status !== "both" ? el("span", { class: "badge kind" }, ` ${r.status}`) : ""),
      el("td", { class: "num", title: exactBytes(r.a) }, fmtBytes(r.a)), el("td", { class: "num", title: exactBytes(r.b) }, fmtBytes(r.b)),
      el("td", { class: "num", title: exactBytes(r.delta) }, signed(r.delta))));
  }
  tbody.append(el("tr", { class: "total" }, el("td", {}, el("strong", {}, "high-water mark")), el("td", { class: "num", title: exactBytes(att.a_bytes) }, fmtBytes(att.a_bytes)),
    el("td", { class: "num", title: exactBytes(att.b_bytes) }, fmtBytes(att.b_bytes)), el("td", { class: "num", title: exactBytes(att.delta) }, signed(att.delta))));
  const table = el("table", { class: "data plain-head", id: "attribution-table" },
    el("thead", {}, el("tr", {}, el("th", {}, "family"), el("th", { class: "num", title: la }, "a"), el("th", { class: "num", title: lb }, "b"), el("th", { class: "num" }, "b − a"))), tbody);

  function select(family) {
    box.dataset.selected = family;
    for (const tr of tbody.querySelectorAll("tr")) tr.classList.toggle("selected", tr.dataset.family === family);
    const r = rows.find((x) => x.family === family);
    clear(status).append(`${family}: `, bytesEl(r.a), " in a, ", bytesEl(r.b), " in b, ",
      el("span", { title: exactBytes(r.delta) }, signed(r.delta)), ".");
    const k = steps.findIndex((s) => s.family === family);
    const shapes = k < 0 ? [] : [{ type: "rect", xref: "x", yref: "paper", x0: k - 0.5, x1: k + 0.5, y0: 0, y1: 1,
      line: { color: theme.warn, width: 2 }, fillcolor: "rgba(154,106,0,0.08)", name: `attribution:${family}` }];
    Plotly.relayout(chart, { shapes });
  }
  chart.on("plotly_click", (ev) => {
    const pt = ev && ev.points && ev.points[0];
    const fam = pt && pt.customdata && pt.customdata[0];
    if (fam) select(fam);
  });
  box.append(status, el("div", { class: "table-scroll" }, table));
  box.dataset.ready = "1";
}
