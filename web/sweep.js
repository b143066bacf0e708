// Sweep view: compute buffer size against the swept parameter, one line per profile (and batch when
// both are swept); hover shows the dominant families, failing points are crosses in the error colour.
// The sweep's request lives in the URL, so a link reruns it.
import { presets, sweep } from "./api.js";
import { $, el, clear, bytesEl, fmtBytes, exactBytes, fmtInt, topNav, opColor, plotConfig, plotTheme, urlParam,
  setUrlParams, tensorLabel } from "./common.js";
import { plotText, byteTicks } from "./memmap.js";
import { listRecorded, showRecorded } from "./sweep-recorded.js";
import { errorPage, problem } from "./errors.js";

const FIELDS = [["preset", "preset"], ["profile", "profiles"], ["n_ctx", "n_ctx"], ["n_batch", "n_batch"], ["metal_concurrency", "metal"]];
const famText = (p) => p.top_families.slice(0, 3).map((f) => `${f.family} ${fmtBytes(f.bytes)}`).join(", ");
const dominant = (p) => (p.top_families[0] ? p.top_families[0].family : null);

/** The form's request: every list without spaces, empty lists left out (the server's defaults). */
function request() {
  const r = {};
  for (const [key, id] of FIELDS) r[key] = $(id).value.replace(/\s+/g, "");
  return r;
}

/** The chart: one line per profile (per profile and batch when both vary); `ring` outlines a family's points. */
function draw(points, key, ring) {
  const theme = plotTheme();
  const other = key === "n_ctx" ? "n_batch" : "n_ctx";
  const several = new Set(points.map((p) => p[other])).size > 1;
  const groups = new Map();
  for (const p of points) {
    if (p.max_size === null) continue;
    const g = several ? `${p.profile}, ${other} ${p[other]}` : p.profile;
    if (!groups.has(g)) groups.set(g, []);
    groups.get(g).push(p);
  }
  const traces = [...groups.entries()].map(([name, ps], k) => ({
    type: "scatter", mode: "lines+markers", name: plotText(name), x: ps.map((p) => p[key]), y: ps.map((p) => p.max_size),
    line: { color: opColor(`sweep:${name}`), dash: ["solid", "dash", "dot", "dashdot"][k % 4], width: 2 },
    marker: { size: ps.map((p) => (p.oom ? 13 : 9)), symbol: ps.map((p) => (p.oom ? "x" : "circle")),
      color: ps.map((p) => (p.oom ? theme.bad : opColor(`sweep:${name}`))),
      line: { width: ps.map((p) => (ring && dominant(p) === ring ? 2.5 : 0)), color: theme.accent } },
    customdata: ps.map((p) => [fmtBytes(p.max_size), exactBytes(p.max_size), plotText(famText(p)), p.oom ? "out of space" : "fits"]),
    hovertemplate: `${key} %{x}: %{customdata[0]} (%{customdata[1]}), %{customdata[3]}<br>dominant: %{customdata[2]}<extra>%{fullData.name}</extra>`,
  }));
  const top = Math.max(1, ...points.map((p) => p.max_size || 0));
  const t = byteTicks(0, top * 1.05, 6);
  const axis = { gridcolor: theme.grid, zeroline: false, color: theme.muted };
  return Plotly.react($("sweep-chart"), traces, {
    margin: { l: 80, r: 20, t: 20, b: 50 }, hovermode: "closest", legend: { orientation: "h", y: -0.2 },
    paper_bgcolor: theme.paper, plot_bgcolor: theme.plot, font: { family: "system-ui, sans-serif", size: 12, color: theme.ink },
    xaxis: { ...axis, title: { text: key }, type: "linear", tickvals: [...new Set(points.map((p) => p[key]))] },
    yaxis: { ...axis, title: { text: "compute buffer (measure max_size)" }, range: [0, top * 1.05], tickvals: t.tickvals, ticktext: t.ticktext },
  }, plotConfig());
}

function table(points, onFamily) {
  const tbody = el("tbody");
  for (const p of points) {
    tbody.append(el("tr", { class: p.oom ? "bad" : null, dataset: { family: dominant(p) || "" } },
      el("td", {}, p.profile), el("td", { class: "num" }, fmtInt(p.n_ctx)), el("td", { class: "num" }, fmtInt(p.n_batch)),
      el("td", { class: "num", title: p.max_size === null ? null : exactBytes(p.max_size) }, p.max_size === null ? "–" : fmtBytes(p.max_size)),
      el("td", {}, p.error ? p.error : p.oom ? el("span", { class: "badge oom" }, "out of space") : el("span", { class: "badge ok" }, "fits")),
      el("td", {}, p.top_families.slice(0, 3).map((f, i) => el("span", {}, i ? ", " : "",
        el("button", { type: "button", class: "link family", dataset: { family: f.family }, onclick: () => onFamily(f.family) }, f.family),
        " ", bytesEl(f.bytes))))));
  }
  clear($("sweep-table")).append(el("thead", {}, el("tr", {}, ["profile", "n_ctx", "n_batch", "compute buffer", "", "dominant families"]
    .map((h, i) => el("th", { class: i && i < 4 ? "num" : null }, h)))), tbody);
}

/** Ring the points a family dominates, in the chart and the table. */
function select(points, key, family) {
  $("result").dataset.selected = family;
  const hits = points.filter((p) => dominant(p) === family);
  for (const tr of $("sweep-table").querySelectorAll("tbody tr")) tr.classList.toggle("selected", tr.dataset.family === family);
  const sizes = hits.map((p) => p.top_families[0].bytes);
  clear($("sweep-selection")).append(`${family} dominates ${hits.length} of ${points.length} points` +
    (hits.length ? `, from ${fmtBytes(Math.min(...sizes))} to ${fmtBytes(Math.max(...sizes))}.` : "."));
  draw(points, key, family);
}

async function run() {
  const status = $("sweep-status"), req = request();
  status.className = "status";
  clear(status).append(el("span", { class: "spinner", "aria-hidden": "true" }), "Replaying every point…");
  $("result").setAttribute("aria-busy", "true");
  $("run").disabled = true;
  try {
    const out = await sweep(req);
    setUrlParams(req);
    const points = out.points;
    const count = (k) => new Set(points.map((p) => p[k])).size;
    const key = count("n_ctx") >= count("n_batch") ? "n_ctx" : "n_batch";
    $("result").hidden = false;
    clear($("onset")).append(...out.oomOnset.map((o) => el("p", { class: "error onset" },
      `${o.profile} runs out of space from n_ctx ${fmtInt(o.n_ctx)}, n_batch ${fmtInt(o.n_batch)}` +
      (o.oom ? `: ${tensorLabel(o.oom.tensor)} needed ${fmtBytes(o.oom.needed)}, largest block ${fmtBytes(o.oom.largest)}` : ""))));
    table(points, (family) => select(points, key, family));
    await draw(points, key, null);
    $("result").dataset.ready = "1";
    status.textContent = `${points.length} points.`;
  } catch (e) {
    status.className = "status error"; status.textContent = `Sweep failed: ${e.message}`;
  } finally { $("run").disabled = false; $("result").removeAttribute("aria-busy"); }
}

async function recorded(id) {
  try { await showRecorded(id); } catch (e) {
    // a stale or mistyped link: the friendly page, not the server's validation message
    if ([400, 404, 422].includes(e.status)) { errorPage(problem(e, "sweep", String(id).slice(0, 40))); return; }
    $("rec-status").className = "status error"; $("rec-status").textContent = `Sweep ${id}: ${e.message}`;
  }
}

async function main() {
  topNav("sweep");
  listRecorded(recorded);
  if (urlParam("id")) recorded(urlParam("id"));
  try {
    for (const p of (await presets()).presets || []) $("preset").append(el("option", { value: p.name }, p.name));
  } catch (e) { $("sweep-status").className = "status error"; $("sweep-status").textContent = `Presets unavailable: ${e.message}`; }
  $("preset").value = urlParam("preset") || "llama-7b";
  for (const [key, id] of FIELDS.slice(1)) if (urlParam(key)) $(id).value = urlParam(key);
  $("sweep-form").addEventListener("submit", (ev) => { ev.preventDefault(); run(); });
  if (urlParam("preset") && urlParam("profile")) run();
}
main();
