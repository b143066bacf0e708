// A long run at a glance (trace page): one point per graph, its own high water against the buffer and the
// allocator's max_size, failures marked; a click opens that graph. And the compact graph picker a run of
// hundreds of graphs needs instead of one button per graph.
import { overview as getOverview } from "./api.js";
import { el, clear, enc, fmtInt, exactBytes, plotlyReady, plotConfig, plotTheme, loading, loaded, showError } from "./common.js";
import { byteTicks, plotText } from "./memmap.js";

/** Runs with more graphs than this get the overview chart and the compact picker. */
export const LONG_RUN = 12;

const graphHref = (id, g) => `/traces/${enc(id)}?g=${g}`;
const graphText = (x) => `${x.index} · ${x.role ?? ""}${x.oom ? " · OOM" : ""}${x.complete === false ? " · incomplete" : ""}` +
  `${x.consistent === false ? " · inconsistent" : ""}`;

/** The graph picker: a button per graph for a short run; for a long one, previous / a list / next. */
export function graphPicker(t, gs) {
  const bar = el("span", { class: "graph-picker", id: "graph-picker" }, el("span", { class: "hint" }, "Graph:"));
  if (t.graphs.length <= LONG_RUN) {
    for (const x of t.graphs) {
      bar.append(el("a", { href: graphHref(t.id, x.index), class: `badge ${x.index === gs.index ? "role" : "kind"}`,
        "aria-current": x.index === gs.index ? "page" : null }, graphText(x)));
    }
    return bar;
  }
  const k = t.graphs.findIndex((x) => x.index === gs.index);
  const step = (d) => t.graphs[k + d];
  const nav = (d, text, label) => (step(d)
    ? el("a", { href: graphHref(t.id, step(d).index), class: "button secondary step", "aria-label": label, rel: d < 0 ? "prev" : "next" }, text)
    : el("span", { class: "button secondary step", "aria-disabled": "true" }, text));
  const select = el("select", { id: "graph-select", "aria-label": `graph (${fmtInt(t.graphs.length)} in this trace)` },
    t.graphs.map((x) => el("option", { value: String(x.index), selected: x.index === gs.index }, graphText(x))));
  select.addEventListener("change", () => location.assign(graphHref(t.id, select.value)));
  const ooms = t.graphs.filter((x) => x.oom);
  bar.append(nav(-1, "‹", "previous graph"), select, nav(1, "›", "next graph"),
    el("span", { class: "hint" }, `of ${fmtInt(t.graphs.length)}`));
  if (ooms.length) bar.append(el("a", { href: graphHref(t.id, ooms[0].index), class: "badge oom" }, `first OOM: graph ${ooms[0].index}`));
  return bar;
}

/** The run chart into `box` (a .chart), for trace `t` with graph `current` shown on the page. */
export async function runOverview(box, note, t, current) {
  loading(box, "Loading every graph's high water…");
  let o;
  try { o = await getOverview(t.id); } catch (e) { loaded(box); showError(box, e); return; }
  const theme = plotTheme(), gs = o.graphs;
  const x = gs.map((g) => g.index);
  const text = gs.map((g) => `graph ${g.index} (${g.role})`);
  const line = (name, ys, color, dash, width = 1.6) => ({ type: "scatter", mode: "lines", name, x, y: ys,
    line: { color, dash, width, shape: "hv" }, customdata: ys.map((v) => (v == null ? "–" : exactBytes(v))),
    text: text.map(plotText), hovertemplate: `%{text}<br>${name}: %{customdata}<extra></extra>` });
  const traces = [
    { type: "bar", name: "high water (each graph's own)", x, y: gs.map((g) => g.high_water),
      marker: { color: gs.map((g) => (g.index === current ? theme.warn : theme.accent)) },
      customdata: gs.map((g) => exactBytes(g.high_water)), text: text.map(plotText), textposition: "none",
      hovertemplate: "%{text}<br>high water: %{customdata}<br>click to open<extra></extra>" },
  ];
  if (gs.some((g) => g.buffer_size)) traces.push(line("buffer size", gs.map((g) => g.buffer_size), theme.bad, "dot"));
  if (gs.some((g) => g.max_size)) traces.push(line("allocator max_size", gs.map((g) => g.max_size), theme.ink, "dash", 1.2));
  const failed = gs.filter((g) => g.oom);
  if (failed.length) {
    traces.push({ type: "scatter", mode: "markers", name: "out of space", x: failed.map((g) => g.index),
      y: failed.map((g) => g.high_water), marker: { symbol: "x", size: 11, color: theme.bad },
      customdata: failed.map((g) => `${plotText(g.oom.tensor || "a tensor")} needed ${exactBytes(g.oom.needed)}, largest free block ${exactBytes(g.oom.largest)}`),
      hovertemplate: "graph %{x}: out of space<br>%{customdata}<extra></extra>" });
  }
  const top = Math.max(1, ...gs.map((g) => Math.max(g.high_water || 0, g.buffer_size || 0, g.max_size || 0)));
  const ticks = byteTicks(0, top * 1.05, 4);
  const axis = { gridcolor: theme.grid, zeroline: false, color: theme.muted };
  loaded(box);
  clear(box);
  const Plotly = await plotlyReady();
  await Plotly.react(box, traces, {
    margin: { l: 70, r: 12, t: 8, b: 40 }, bargap: 0.15, hovermode: "closest", showlegend: true,
    legend: { orientation: "h", y: -0.28, x: 0 }, paper_bgcolor: theme.paper, plot_bgcolor: theme.plot,
    font: { family: "system-ui, sans-serif", size: 12, color: theme.ink },
    xaxis: { ...axis, title: { text: "graph", font: { size: 11 } }, range: [x[0] - 0.5, x[x.length - 1] + 0.5] },
    yaxis: { ...axis, range: [0, top * 1.05], tickvals: ticks.tickvals, ticktext: ticks.ticktext, fixedrange: true },
  }, plotConfig({ displayModeBar: false }));
  box.on("plotly_click", (ev) => {
    const p = ev.points && ev.points[0];
    if (p && Number.isInteger(p.x) && p.x !== current) location.assign(graphHref(t.id, p.x));
  });
  const peak = gs.reduce((a, g) => (g.high_water > a.high_water ? g : a), gs[0]);
  note.textContent = `${fmtInt(gs.length)} graphs; the highest is graph ${peak.index} (${exactBytes(peak.high_water)})` +
    (failed.length ? `; ${fmtInt(failed.length)} ran out of space (first: graph ${failed[0].index})` : "; none ran out of space") +
    ". Click a bar to open that graph.";
  box.dataset.ready = "1";
}
