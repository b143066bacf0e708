// Peak panel (trace page): what is live at the graph's high-water mark, by family: a stacked bar,
// a sortable table, and a click on a family outlines its tensors on the memory map and jumps to the peak.
import { peak as getPeak } from "./api.js";
import { plotlyReady, el, clear, bytesEl, fmtBytes, exactBytes, fmtInt, familyColor, plotConfig, plotTheme, showError, loading, loaded,
  tensorLabel, FREE_COLOR, FREE_FILL, pct } from "./common.js";
import { plotText, byteTicks } from "./memmap.js";
import { familyColors } from "./palette.js";

/** A sortable table: `cols` = [{key, label, num, cell(row)}]; returns {table, select(family)}. */
function sortableTable(id, cols, rows, onPick) {
  let sortKey = "bytes", desc = true, selected = null;
  const tbody = el("tbody");
  const heads = cols.map((c) => el("th", { class: c.num ? "num sortable" : "sortable", dataset: { key: c.key }, role: "button",
    tabindex: "0", title: "sort", onclick: () => { desc = sortKey === c.key ? !desc : !!c.num; sortKey = c.key; render(); } }, c.label));
  const render = () => {
    const sorted = [...rows].sort((a, b) => {
      const x = a[sortKey], y = b[sortKey];
      const r = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
      return desc ? -r : r;
    });
    clear(tbody);
    for (const r of sorted) {
      tbody.append(el("tr", { class: r.family === selected ? "selected" : null, dataset: { family: r.family },
        onclick: () => onPick(r.family) }, cols.map((c) => c.cell(r))));
    }
    for (const h of heads) h.setAttribute("aria-sort", h.dataset.key === sortKey ? (desc ? "descending" : "ascending") : "none");
  };
  render();
  const table = el("table", { class: "data plain-head", id }, el("thead", {}, el("tr", {}, heads)), tbody);
  return { table, select: (f) => { selected = f; render(); } };
}

const bytesCell = (n) => el("td", { class: "num", title: exactBytes(n) }, fmtBytes(n));

/** The stacked bar: one segment per family (largest first), then the free bytes below the mark. */
async function drawBar(chart, pk, fams, fr) {
  const theme = plotTheme();
  const traces = fams.map((f) => ({
    type: "bar", orientation: "h", y: ["peak"], x: [f.bytes], name: plotText(f.family), marker: { color: familyColor(f.family), line: { color: theme.paper, width: 1 } },
    customdata: [[plotText(f.family), exactBytes(f.bytes), pct(f.share), fmtInt(f.tensors), f.family]],
    hovertemplate: "%{customdata[0]}: %{customdata[1]} (%{customdata[2]}), %{customdata[3]} tensors<extra></extra>",
  }));
  traces.push({ type: "bar", orientation: "h", y: ["peak"], x: [fr.free_below_peak || 0], name: "free (fragmentation)",
    marker: { color: FREE_FILL, line: { color: FREE_COLOR, width: 1 }, pattern: { shape: "/", fgcolor: FREE_COLOR, bgcolor: FREE_FILL, size: 7, solidity: 0.25 } },
    customdata: [["free below the mark", exactBytes(fr.free_below_peak || 0)]],
    hovertemplate: "%{customdata[0]}: %{customdata[1]}<extra></extra>" });
  const ticks = byteTicks(0, pk.bytes, 5);
  const axis = { gridcolor: theme.grid, zeroline: false, color: theme.muted };
  return (await plotlyReady()).react(chart, traces, {
    barmode: "stack", margin: { l: 20, r: 10, t: 10, b: 40 }, showlegend: true, legend: { orientation: "h", y: -0.5 },
    paper_bgcolor: theme.paper, plot_bgcolor: theme.plot, font: { family: "system-ui, sans-serif", size: 12, color: theme.ink },
    xaxis: { ...axis, range: [0, pk.bytes], tickvals: ticks.tickvals, ticktext: ticks.ticktext },
    yaxis: { ...axis, showticklabels: false, fixedrange: true },
  }, plotConfig({ displayModeBar: false }));
}

/** Draw the panel into `box`; `map` is the page's MemoryMap, `onEvent(i)` selects an event on the page. */
export async function peakPanel(box, id, g, { map, onEvent } = {}) {
  loading(box, "Finding the peak…");
  let p;
  try { p = await getPeak(id, g); } catch (e) { loaded(box); showError(box, e); return null; }
  loaded(box);
  clear(box);
  const pk = p.peak, fr = p.fragmentation, fams = p.families;
  familyColors.claim(fams.map((f) => f.family));  // every family of the panel gets a colour of its own
  if (pk.event === null || pk.event === undefined) {
    box.append(el("p", { class: "empty" }, "Nothing was allocated in this graph."));
    box.dataset.ready = "1";
    return p;
  }
  box.append(el("p", { id: "peak-summary" }, "High-water mark ", bytesEl(pk.bytes), ` set at event ${fmtInt(pk.event)} by `,
    el("span", { class: "tensor" }, tensorLabel(pk.tensor)), "; ", bytesEl(pk.live_bytes), " live in ",
    `${fmtInt(fams.length)} famil${fams.length === 1 ? "y" : "ies"}.`));
  box.append(el("p", { id: "peak-fragmentation", class: "hint" }, "Fragmentation: ", bytesEl(fr.free_below_peak),
    " free below the high-water mark, largest hole ", bytesEl(fr.largest_hole), ".",
    ...((fr.holes || []).filter((h) => h.freed.length).slice(0, 1).map((h) => el("span", { id: "peak-hole" },
      " It held ", h.freed.map((x) => `${x.label || x.tensor || "(unnamed)"} (freed at event ${fmtInt(x.freed_at)})`).join(", "), ".")))));
  if (p.failure) {
    const f = p.failure;
    box.append(el("p", { id: "peak-failure", class: "error" }, `Out of space at event ${fmtInt(f.event)}: `,
      el("span", { class: "tensor" }, tensorLabel(f.tensor)), " needed ", bytesEl(f.needed), "; ", bytesEl(f.free),
      " free in all, largest hole ", bytesEl(f.largest_hole), "."));
  }
  const chart = el("div", { id: "peak-bar", class: "chart", style: "height:150px;min-height:150px" });
  box.append(chart);
  await drawBar(chart, pk, fams, fr).catch((e) => chart.replaceWith(el("p", { class: "hint" }, `Chart unavailable: ${e.message}`)));

  const status = el("p", { id: "peak-selection", class: "hint", role: "status" }, "Click a family to outline its tensors on the memory map.");
  const cols = [
    { key: "family", label: "family", cell: (r) => el("td", { class: "tensor" }, el("span", { class: "swatch", style: `background:${familyColor(r.family)}` }), " ", r.family) },
    { key: "tensors", label: "tensors", num: true, cell: (r) => el("td", { class: "num" }, fmtInt(r.tensors)) },
    { key: "bytes", label: "bytes", num: true, cell: (r) => bytesCell(r.bytes) },
    { key: "share", label: "share", num: true, cell: (r) => el("td", { class: "num" }, pct(r.share)) },
    { key: "first_node", label: "first node", cell: (r) => el("td", { class: "tensor" }, tensorLabel(r.first_node)) },
    { key: "last_node", label: "last node", cell: (r) => el("td", { class: "tensor" }, tensorLabel(r.last_node)) },
  ];
  // a recording knows each family's largest tensor: type [ne] and how its bytes follow from them
  if (fams.some((f) => f.shape)) cols.push({ key: "shape", label: "largest tensor", cell: (r) => el("td", { class: "tensor shape" },
    !r.shape ? "–" : r.shape.formula || `${r.shape.type} [${r.shape.ne.join(", ")}]`) });
  const select = (family) => {
    tbl.select(family);
    box.dataset.selected = family;
    const mine = p.tensors.filter((t) => t.family === family);
    const total = mine.reduce((a, t) => a + t.bytes, 0);
    clear(status).append(`${family}: ${fmtInt(mine.length)} tensor${mine.length === 1 ? "" : "s"}, `, bytesEl(total),
      ` live at event ${fmtInt(pk.event)}, outlined on the memory map.`);
    if (map) {
      const bad = plotTheme().bad;
      const shapes = mine.map((t) => ({ type: "rect", xref: "x", yref: "y", x0: t.start + map.shift, x1: t.end + map.shift,
        y0: t.y0, y1: t.y0 + t.bytes, line: { color: bad, width: 2.5 }, fillcolor: "rgba(208,2,27,0.12)", name: `peak:${family}` }));
      shapes.push({ type: "line", xref: "x", yref: "paper", x0: pk.event + map.shift, x1: pk.event + map.shift, y0: 0, y1: 1,
        line: { color: bad, width: 1, dash: "dash" }, name: "peak" });
      map.setOverlay(shapes);
    }
    if (onEvent) onEvent(pk.event);
  };
  const tbl = sortableTable("peak-table", cols, fams, select);
  if (chart.on) chart.on("plotly_click", (ev) => {  // no .on when the chart could not be drawn
    const pt = ev && ev.points && ev.points[0];
    const fam = pt && pt.customdata && pt.customdata[4];
    if (fam && fams.some((f) => f.family === fam)) select(fam);
  });
  box.append(status, el("div", { class: "table-scroll" }, tbl.table));
  box.dataset.ready = "1";
  return p;
}
