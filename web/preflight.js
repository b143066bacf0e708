// Pre-flight page: a stored sweep, fit or `plan --vary` search as curves against its knob. One curve per buffer
// (every compute buffer, every printed size by kind and label: weights, each KV cache) or, for PyTorch, per
// category, with the total (reserved and allocated); the points that ran are filled markers on solid lines
// (a printed size's rounding as error bars), the law's predictions between them open markers on dashed
// lines; the budget is a horizontal line and the answer a star. Without ?id=, the list of stored results.
import { preflight, preflights } from "./api.js";
import { $, el, clear, fmtBytes, exactBytes, enc, opColor, plotConfig, plotTheme, topNav, urlParam, setUrlParams } from "./common.js";
import { plotText, byteTicks } from "./memmap.js";
import { errorPage, problem } from "./errors.js";

const KIND_WORDS = { sweep: "Sweep", fit: "Fit", plan: "PyTorch plan" };
const pm = (u) => (u ? ` ± ${fmtBytes(u)}` : "");

function lineOf(c, k, theme) {
  const strong = ["total", "reserved"].includes(c.kind);
  return { color: strong ? theme.ink : c.kind === "allocated" ? theme.accent : opColor(`preflight:${c.name}`),
    width: strong ? 3 : 2, dash: "solid" };
}

/** One curve's two traces: the points that ran, and the law's line with its predicted points. */
function curveTraces(r, c, k, theme) {
  const line = lineOf(c, k, theme);
  const law = c.law ? c.law.formula : "no straight line through these points";
  const lawAt = (x) => (c.law ? c.law.intercept + c.law.slope * x : null);
  const ran = c.points.filter((p) => !p.oom);
  const oom = c.points.filter((p) => p.oom);  // counted up to the failing request only: not on the line
  const out = [{
    type: "scatter", mode: "lines+markers", name: plotText(c.name), legendgroup: c.name, line,
    x: ran.map((p) => p.x), y: ran.map((p) => p.bytes),
    marker: { size: 9, symbol: "circle", color: line.color },
    // a plan's point carries its range over segment address orders; a parsed size, its printed rounding
    error_y: { type: "data", symmetric: false, array: ran.map((p) => (p.range ? p.range[1] - p.bytes : p.uncertainty_bytes)),
      arrayminus: ran.map((p) => (p.range ? p.bytes - p.range[0] : p.uncertainty_bytes)),
      visible: ran.some((p) => p.uncertainty_bytes > 0 || (p.range && p.range[0] !== p.range[1])), color: line.color, thickness: 1.5, width: 5 },
    customdata: ran.map((p) => [fmtBytes(p.bytes), exactBytes(p.bytes), pm(p.uncertainty_bytes), "ran", plotText(law),
      lawAt(p.x) === null ? "–" : exactBytes(Math.round(lawAt(p.x)))]),
    hovertemplate: `${plotText(r.axis)} %{x}: %{customdata[0]} (%{customdata[1]}%{customdata[2]}), %{customdata[3]}` +
      "<br>law: %{customdata[4]} → %{customdata[5]}<extra>%{fullData.name}</extra>",
    meta: { kind: "measured", curve: c.name, of: c.kind },
  }];
  if (oom.length) {
    out.push({ type: "scatter", mode: "markers", name: plotText(`${c.name}: out of memory`), legendgroup: c.name, showlegend: false,
      x: oom.map((p) => p.x), y: oom.map((p) => p.bytes), marker: { size: 10, symbol: "x", color: line.color },
      customdata: oom.map((p) => [fmtBytes(p.bytes), exactBytes(p.bytes)]),
      hovertemplate: `${plotText(r.axis)} %{x}: ran out of memory; %{customdata[0]} (%{customdata[1]}) before the failing request<extra>${plotText(c.name)}</extra>`,
      meta: { kind: "oom", curve: c.name, of: c.kind } });
  }
  if (c.law && c.predicted.length) {
    const all = [...ran.map((p) => ({ ...p, measured: true })), ...c.predicted].sort((a, b) => a.x - b.x);
    out.push({
      type: "scatter", mode: "lines+markers", name: plotText(`${c.name} (law)`), legendgroup: c.name, showlegend: false,
      line: { ...line, dash: "dash", width: 1.5 }, x: all.map((p) => p.x), y: all.map((p) => (p.measured ? Math.round(lawAt(p.x)) : p.bytes)),
      marker: { size: all.map((p) => (p.measured ? 0 : 8)), symbol: "circle-open", color: line.color },
      customdata: all.map((p) => [fmtBytes(p.bytes), exactBytes(p.bytes), plotText(law), p.measured ? "the law at a point that ran" : "predicted, not run"]),
      hovertemplate: `${plotText(r.axis)} %{x}: %{customdata[0]} (%{customdata[1]}), %{customdata[3]}<br>law: %{customdata[2]}<extra>${plotText(c.name)}</extra>`,
      meta: { kind: "predicted", curve: c.name, of: c.kind, xs: c.predicted.map((p) => p.x) },
    });
  }
  return out;
}

function draw(r, logY) {
  const theme = plotTheme();
  const traces = r.curves.flatMap((c, k) => curveTraces(r, c, k, theme));
  const xs = r.curves.flatMap((c) => [...c.points, ...c.predicted].map((p) => p.x));
  const lo = Math.min(...xs), hi = Math.max(...xs);
  if (r.budget !== null) {
    traces.push({ type: "scatter", mode: "lines", name: plotText(`budget ${fmtBytes(r.budget)}`), x: [lo, hi], y: [r.budget, r.budget],
      line: { color: theme.bad, dash: "dot", width: 2 }, hovertemplate: `budget ${exactBytes(r.budget)}<extra></extra>`, meta: { kind: "budget" } });
  }
  for (const a of r.answers) {
    if (a.value !== null) {
      traces.push({ type: "scatter", mode: "markers", name: plotText(`answer: ${r.axis} ${a.value}${a.setting ? ` (${a.setting})` : ""}`),
        x: [a.value], y: [a.bytes], marker: { symbol: "star", size: 18, color: theme.good, line: { color: theme.ink, width: 1 } },
        hovertemplate: `the largest ${plotText(r.axis)} that fits: %{x}, ${fmtBytes(a.bytes)} (${exactBytes(a.bytes)})<extra></extra>`,
        meta: { kind: "answer", value: a.value, setting: a.setting } });
    }
    if (a.law_value !== null && a.law_value !== a.value) {
      const total = r.curves.find((c) => c.setting === a.setting && ["total", "reserved"].includes(c.kind));
      const y = total && total.law ? Math.round(total.law.intercept + total.law.slope * a.law_value) : r.budget;
      traces.push({ type: "scatter", mode: "markers", name: plotText(`the law's answer: ${a.law_value}`), x: [a.law_value], y: [y],
        marker: { symbol: "star-open", size: 16, color: theme.good }, hovertemplate: `the law predicts ${plotText(r.axis)} %{x} fits (not run)<extra></extra>`,
        meta: { kind: "law-answer", value: a.law_value } });
    }
  }
  const top = Math.max(1, r.budget || 0, ...traces.flatMap((t) => t.y || []).filter((y) => y !== null));
  const t = byteTicks(0, top * 1.08, 6);
  const axisStyle = { gridcolor: theme.grid, zeroline: false, color: theme.muted };
  const narrow = window.innerWidth < 600;
  return Plotly.react($("pf-chart"), traces, {
    margin: { l: narrow ? 74 : 84, r: 10, t: 10, b: 50 }, hovermode: "closest", legend: { orientation: "h", y: narrow ? -0.32 : -0.18 },
    paper_bgcolor: theme.paper, plot_bgcolor: theme.plot, font: { family: "system-ui, sans-serif", size: narrow ? 10 : 12, color: theme.ink },
    xaxis: { ...axisStyle, title: { text: plotText(r.axis || "point") }, type: lo > 0 && hi / lo > 16 ? "log" : "linear" },
    yaxis: logY ? { ...axisStyle, type: "log", title: { text: narrow ? "" : "bytes" } }
      : { ...axisStyle, title: { text: narrow ? "" : "bytes" }, range: [0, top * 1.08], tickvals: t.tickvals, ticktext: t.ticktext },
  }, plotConfig());
}

function answerText(r) {
  if (r.budget === null) return `${r.curves.length} curves against ${r.axis}. Give a budget to see the largest ${r.axis} that fits it.`;
  const parts = r.answers.map((a) => {
    const where = a.setting ? ` (${a.setting})` : "";
    const law = a.law_value !== null && a.law_value !== a.value ? `; the law predicts up to ${a.law_value}` : "";
    const o = a.address_orders;
    const every = o && !o.certain ? `; it depends on where the driver puts segments: ${a.value_every_order ?? "nothing"} fits in every address order tried` : "";
    return a.value === null ? `nothing that ran fits${where}${law}${every}` : `${r.axis} ${a.value}${where}, ${fmtBytes(a.bytes)}${law}${every}`;
  });
  return `Largest ${r.axis} under ${fmtBytes(r.budget)} (${exactBytes(r.budget)}): ${parts.join("; ") || "–"}.`;
}

function table(r) {
  const xs = [...new Set(r.curves.flatMap((c) => c.points.map((p) => p.x)))].sort((a, b) => a - b);
  const cell = (c, x) => {
    const p = c.points.find((q) => q.x === x);
    if (!p) return el("td", { class: "num" }, "–");
    const spread = p.range && p.range[0] !== p.range[1] ? ` (${fmtBytes(p.range[0])}–${fmtBytes(p.range[1])} by where segments land)` : "";
    return el("td", { class: "num", title: exactBytes(p.bytes) + spread, "data-range": p.range ? p.range.join("-") : null },
      `${fmtBytes(p.bytes)}${pm(p.uncertainty_bytes)}${spread ? " ±" : ""}${p.oom ? " (OOM)" : ""}`);
  };
  clear($("pf-table")).append(
    el("thead", {}, el("tr", {}, el("th", { class: "num" }, r.axis), ...r.curves.map((c) => el("th", { class: "num" }, c.name)))),
    el("tbody", {}, xs.map((x) => el("tr", {}, el("td", { class: "num" }, String(x)), ...r.curves.map((c) => cell(c, x))))));
}

function laws(r) {
  clear($("pf-laws")).append(...r.curves.map((c) => el("li", {}, el("strong", {}, c.name), ": ",
    c.law ? `${c.law.formula} (${c.law.holds})` : "no straight line through these points")));
}

async function show(id) {
  const budget = urlParam("budget");
  let r;
  try { r = await preflight(id, budget); } catch (e) {
    if ([400, 404, 422].includes(e.status)) {
      if (e.status === 400 && budget) { $("pf-status").textContent = e.message; $("pf-result").hidden = false; return; }
      errorPage({ ...problem(e, "pre-flight result", String(id).slice(0, 40)),
        ...(e.status === 404 ? {} : { text: "A pre-flight link reads /preflight?id=ID, with the id that `alloctrace sweep`, `fit` or `plan --vary` printed (the list on /preflight has every one)." }) });
      return;
    }
    throw e;
  }
  $("pf-title").textContent = `${KIND_WORDS[r.kind]} ${r.id}: memory against ${r.axis}`;
  document.title = `alloctrace · pre-flight ${r.id}`;
  $("pf-result").hidden = false;
  $("pf-answer").textContent = answerText(r);
  $("pf-budget").value = budget || "";
  table(r);
  laws(r);
  const links = clear($("pf-links"));
  for (const t of r.traces.slice(0, 20)) links.append(el("a", { href: r.kind === "plan" ? `/torch?id=${enc(t)}` : `/traces/${enc(t)}` }, `trace ${t}`), " ");
  if (r.kind === "sweep") links.append(el("a", { href: `/sweep?id=${enc(r.id)}` }, "families on the sweep page →"));
  if (!r.curves.length) {  // no flag took whole-number values: nothing to draw against
    $("pf-answer").textContent = "No varied flag took whole numbers at two or more points: there is no curve to draw.";
    document.body.dataset.loaded = "1";
    return;
  }
  await draw(r, $("pf-log").checked);
  $("pf-log").onchange = () => draw(r, $("pf-log").checked);
  document.body.dataset.loaded = "1";
}

async function list() {
  $("pf-list-panel").hidden = false;
  const ul = clear($("pf-list"));
  const rs = await preflights();
  if (!rs.length) ul.append(el("li", { class: "hint" }, "None yet: alloctrace fit, sweep --vary or plan --vary stores one."));
  for (const r of rs) {
    ul.append(el("li", {}, el("a", { href: `/preflight?id=${enc(r.id)}` }, `${KIND_WORDS[r.kind]} ${r.id}`),
      ` — ${r.name}${r.points ? `, ${r.points} points` : ""}, ${r.created}`));
  }
  document.body.dataset.loaded = "1";
}

topNav("sweep");
$("pf-budget-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  setUrlParams({ budget: $("pf-budget").value.trim() || null });
  show(urlParam("id"));
});
if (urlParam("id")) show(urlParam("id")); else list();
