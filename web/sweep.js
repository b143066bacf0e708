// Sweep view: compute buffer size against the swept parameter, one line per profile (and batch when
// both are swept); hover shows the dominant families, failing points are red crosses.
import { api, el, clear, bytesEl, fmtBytes, exactBytes, fmtInt, topNav, pick, opColor } from "/static/common.js";
import { plotText, byteTicks } from "/static/memmap.js";

topNav("replay");
const $ = (x) => document.getElementById(x);
const RING = "#d0021b";
let points = [], sweptKey = "n_ctx";

async function init() {
  const q = new URLSearchParams(location.search);
  try {
    const p = await api("/api/presets");
    const presets = Array.isArray(p) ? p : (p.presets || []);
    for (const it of presets) {
      const name = typeof it === "string" ? it : pick(it, "name");
      if (name) $("preset").append(el("option", { value: name }, name));
    }
  } catch (e) { $("sweep-status").className = "status error"; $("sweep-status").textContent = `Presets unavailable: ${e.message}`; }
  $("preset").value = q.get("preset") || "llama-7b";
  for (const [k, id] of [["profile", "profiles"], ["n_ctx", "n_ctx"], ["n_batch", "n_batch"]]) if (q.get(k)) $(id).value = q.get(k);
  if (q.get("metal_concurrency")) $("metal").value = q.get("metal_concurrency");
  if (q.get("preset") && q.get("profile")) run();
}

function query() {
  const q = new URLSearchParams({ preset: $("preset").value, profile: $("profiles").value.replace(/\s+/g, ""),
    n_ctx: $("n_ctx").value.replace(/\s+/g, ""), n_batch: $("n_batch").value.replace(/\s+/g, ""), metal_concurrency: $("metal").value });
  for (const k of ["n_ctx", "n_batch"]) if (!q.get(k)) q.delete(k);
  return q;
}

const famText = (p) => (p.top_families || []).slice(0, 3).map((f) => `${f.family} ${fmtBytes(f.bytes)}`).join(", ");

function draw(ring) {
  const key = sweptKey;
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
      color: ps.map((p) => (p.oom ? "#c0352b" : opColor(`sweep:${name}`))),
      line: { width: ps.map((p) => (ring && p.top_families[0] && p.top_families[0].family === ring ? 3 : 0)), color: RING } },
    customdata: ps.map((p) => [fmtBytes(p.max_size), exactBytes(p.max_size), plotText(famText(p)), p.oom ? "out of space" : "fits"]),
    hovertemplate: `${key} %{x}: %{customdata[0]} (%{customdata[1]}), %{customdata[3]}<br>dominant: %{customdata[2]}<extra>%{fullData.name}</extra>`,
  }));
  const top = Math.max(1, ...points.map((p) => p.max_size || 0));
  const t = byteTicks(0, top * 1.05, 6);
  return Plotly.react($("sweep-chart"), traces, {
    margin: { l: 80, r: 20, t: 20, b: 50 }, xaxis: { title: { text: key }, type: "linear", tickvals: [...new Set(points.map((p) => p[key]))] },
    yaxis: { title: { text: "compute buffer (measure max_size)" }, range: [0, top * 1.05], tickvals: t.tickvals, ticktext: t.ticktext },
    legend: { orientation: "h", y: -0.2 }, hovermode: "closest",
  }, { displaylogo: false, responsive: true });
}

function table() {
  const tbody = el("tbody");
  for (const p of points) {
    const fam = p.top_families && p.top_families[0];
    tbody.append(el("tr", { class: p.oom ? "bad" : null, dataset: { family: fam ? fam.family : "" } },
      el("td", {}, p.profile), el("td", { class: "num" }, fmtInt(p.n_ctx)), el("td", { class: "num" }, fmtInt(p.n_batch)),
      el("td", { class: "num", title: p.max_size === null ? null : exactBytes(p.max_size) }, p.max_size === null ? "–" : fmtBytes(p.max_size)),
      el("td", {}, p.error ? p.error : p.oom ? el("span", { class: "badge oom" }, "out of space") : el("span", { class: "badge ok" }, "fits")),
      el("td", {}, (p.top_families || []).slice(0, 3).map((f, i) => el("span", {}, i ? ", " : "",
        el("button", { type: "button", class: "link family", dataset: { family: f.family }, onclick: () => select(f.family) }, f.family),
        " ", bytesEl(f.bytes))))));
  }
  clear($("sweep-table")).append(el("thead", {}, el("tr", {}, ["profile", "n_ctx", "n_batch", "compute buffer", "", "dominant families"]
    .map((h, i) => el("th", { class: i && i < 4 ? "num" : null }, h)))), tbody);
}

function select(family) {
  $("result").dataset.selected = family;
  const hits = points.filter((p) => p.top_families[0] && p.top_families[0].family === family);
  for (const tr of $("sweep-table").querySelectorAll("tbody tr")) tr.classList.toggle("selected", tr.dataset.family === family);
  clear($("sweep-selection")).append(`${family} dominates ${hits.length} of ${points.length} points` +
    (hits.length ? `, from ${fmtBytes(Math.min(...hits.map((p) => p.top_families[0].bytes)))} to ${fmtBytes(Math.max(...hits.map((p) => p.top_families[0].bytes)))}.` : "."));
  draw(family);
}

async function run() {
  const q = query(), status = $("sweep-status");
  status.className = "status"; status.textContent = "Replaying every point…";
  $("run").disabled = true;
  try {
    const out = await api(`/api/sweep?${q}`);
    history.replaceState(null, "", `/sweep?${q}`);
    points = out.points || [];
    const vals = (k) => new Set(points.map((p) => p[k])).size;
    sweptKey = vals("n_ctx") >= vals("n_batch") ? "n_ctx" : "n_batch";
    $("result").hidden = false;
    clear($("onset")).append(...(out.oom_onset || []).map((o) => el("p", { class: "error onset" },
      `${o.profile} runs out of space from n_ctx ${fmtInt(o.n_ctx)}, n_batch ${fmtInt(o.n_batch)}` +
      (o.oom ? `: ${o.oom.tensor ?? ""} needed ${fmtBytes(o.oom.needed)}, largest block ${fmtBytes(o.oom.largest_available)}` : ""))));
    table();
    await draw(null);
    $("result").dataset.ready = "1";
    status.textContent = `${points.length} points.`;
  } catch (e) {
    status.className = "status error"; status.textContent = `Sweep failed: ${e.message}`;
  } finally { $("run").disabled = false; }
}

$("sweep-form").addEventListener("submit", (ev) => { ev.preventDefault(); run(); });
init();
