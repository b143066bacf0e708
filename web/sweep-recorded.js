// Recorded sweeps (`alloctrace sweep --vary ... -- PROGRAM`): the compute buffer of every point against the
// first numeric varied flag, one line per setting of the other flags, and the chosen setting's buffer
// stacked by the families at its peak (the rest: other families and holes). Clicking a point (in the chart or
// the table) opens its card: the trace, and the diff to its neighbours along the axis.
import { recordedSweep, recordedSweeps } from "./api.js";
import { $, el, clear, bytesEl, fmtBytes, exactBytes, enc, opColor, plotConfig, plotTheme, setUrlParams } from "./common.js";
import { plotText, byteTicks } from "./memmap.js";

const total = (p) => Object.values(p.buffers || {}).reduce((a, b) => a + b, 0);
const settingOf = (p, axis) => Object.entries(p.values).filter(([k]) => k !== axis).map(([k, v]) => `${k}=${v}`).join(" ");
const isInt = (v) => /^\d+$/.test(String(v));

/** The axis: the first varied flag whose values are all whole numbers with more than one value. */
function axisOf(sweep) {
  for (const [flag, values] of sweep.vary) if (values.length > 1 && values.every(isInt)) return flag;
  return sweep.vary.length ? sweep.vary[0][0] : null;
}

function groups(points, axis) {
  const out = new Map();
  for (const p of points) {
    if (p.error && !p.trace) continue;
    const s = settingOf(p, axis);
    if (!out.has(s)) out.set(s, []);
    out.get(s).push(p);
  }
  for (const ps of out.values()) ps.sort((a, b) => (isInt(a.values[axis]) ? a.values[axis] - b.values[axis] : 0));
  return out;
}

const xOf = (p, axis) => (isInt(p.values[axis]) ? Number(p.values[axis]) : p.values[axis]);

function draw(sweep, axis, stackFor) {
  const theme = plotTheme();
  const gs = groups(sweep.points, axis);
  const traces = [];
  const stacked = gs.get(stackFor) || [];
  const fams = [...new Set(stacked.flatMap((p) => p.families.map((f) => f.family)))];
  for (const fam of fams) {
    traces.push({ type: "scatter", mode: "lines", stackgroup: "families", name: plotText(fam), legendgroup: "families",
      x: stacked.map((p) => xOf(p, axis)), y: stacked.map((p) => (p.families.find((f) => f.family === fam) || { bytes: 0 }).bytes),
      line: { width: 0.5, color: opColor(`family:${fam}`) }, hoverinfo: "skip", meta: { kind: "family", family: fam } });
  }
  if (stacked.length) {
    traces.push({ type: "scatter", mode: "lines", stackgroup: "families", name: "other families and holes", legendgroup: "families",
      x: stacked.map((p) => xOf(p, axis)), y: stacked.map((p) => total(p) - p.families.reduce((a, f) => a + f.bytes, 0)),
      line: { width: 0.5, color: theme.muted }, hoverinfo: "skip", meta: { kind: "family", family: null } });
  }
  let k = 0;
  for (const [setting, ps] of gs) {
    traces.push({ type: "scatter", mode: "lines+markers", name: plotText(setting || "compute buffer"),
      x: ps.map((p) => xOf(p, axis)), y: ps.map(total),
      line: { color: opColor(`sweep:${setting}`), dash: ["solid", "dash", "dot", "dashdot"][k++ % 4], width: 2 },
      marker: { size: 10, symbol: ps.map((p) => (p.consistent === false ? "x" : "circle")) },
      customdata: ps.map((p) => [fmtBytes(total(p)), exactBytes(total(p)), plotText(p.families.slice(0, 3).map((f) => `${f.family} ${fmtBytes(f.bytes)}`).join(", ")), sweep.points.indexOf(p)]),
      hovertemplate: `${plotText(axis)} %{x}: %{customdata[0]} (%{customdata[1]})<br>%{customdata[2]}<extra>%{fullData.name}</extra>`,
      meta: { kind: "setting", setting } });
  }
  const top = Math.max(1, ...sweep.points.map(total));
  const t = byteTicks(0, top * 1.05, 6);
  const axisStyle = { gridcolor: theme.grid, zeroline: false, color: theme.muted };
  const numeric = sweep.points.every((p) => isInt(p.values[axis]));
  const xs = [...new Set(sweep.points.map((p) => xOf(p, axis)))];
  return Plotly.react($("rec-chart"), traces, {
    margin: { l: 80, r: 20, t: 20, b: 50 }, hovermode: "closest", legend: { orientation: "h", y: -0.2 },
    paper_bgcolor: theme.paper, plot_bgcolor: theme.plot, font: { family: "system-ui, sans-serif", size: 12, color: theme.ink },
    xaxis: { ...axisStyle, title: { text: plotText(axis || "point") }, type: numeric && Math.max(...xs) / Math.min(...xs) > 16 ? "log" : (numeric ? "linear" : "category"), tickvals: xs },
    yaxis: { ...axisStyle, title: { text: "compute buffer (all buffer types)" }, range: [0, top * 1.05], tickvals: t.tickvals, ticktext: t.ticktext },
  }, plotConfig());
}

/** A point's card: its values, buffers, what the program printed, and links to its trace and neighbours' diffs. */
function showPoint(sweep, axis, index) {
  const p = sweep.points[index];
  $("rec-result").dataset.point = String(index);
  for (const tr of $("rec-table").querySelectorAll("tbody tr")) tr.classList.toggle("selected", tr.dataset.index === String(index));
  const card = clear($("rec-point"));
  card.hidden = false;
  const label = Object.entries(p.values).map(([k, v]) => `${k}=${v}`).join(" ");
  card.append(el("h3", {}, label));
  const facts = el("dl", { class: "facts" });
  for (const [buft, n] of Object.entries(p.buffers)) facts.append(el("div", {}, el("dt", {}, `${buft} compute buffer`), el("dd", {}, bytesEl(n), ` (${exactBytes(n)})`)));
  for (const [kind, per] of Object.entries(p.printed || {})) {
    if (kind === "compute") continue;
    facts.append(el("div", {}, el("dt", {}, `${kind.replace("_", " ")} (printed)`), el("dd", {}, Object.entries(per).map(([d, v]) => `${d} ${v.toFixed(2)} MiB`).join(", "))));
  }
  card.append(facts);
  const links = el("p", { class: "links" });
  if (p.trace) links.append(el("a", { id: "rec-open-trace", href: `/traces/${enc(p.trace)}?g=${p.graph ?? 0}` }, "Open its trace →"));
  const gs = groups(sweep.points, axis).get(settingOf(p, axis)) || [];
  const at = gs.indexOf(p);
  for (const [q, dir] of [[gs[at - 1], "previous"], [gs[at + 1], "next"]]) {
    if (!q || !q.trace || !p.trace) continue;
    const [a, b] = dir === "previous" ? [q, p] : [p, q];
    links.append(" ", el("a", { class: `rec-diff-${dir}`, href: `/diff?a=${enc(`${a.trace}:${a.graph ?? 0}`)}&b=${enc(`${b.trace}:${b.graph ?? 0}`)}` },
      `Diff to ${axis} ${q.values[axis]} →`));
  }
  card.append(links);
  if (p.error) card.append(el("p", { class: "error" }, p.error));
}

function table(sweep, axis, onPoint) {
  const flags = sweep.vary.map(([f]) => f);
  const bufts = [...new Set(sweep.points.flatMap((p) => Object.keys(p.buffers)))];
  const tbody = el("tbody");
  sweep.points.forEach((p, i) => {
    tbody.append(el("tr", { class: p.error ? "bad" : null, dataset: { index: String(i) }, tabindex: "0", onclick: () => onPoint(i),
      onkeydown: (ev) => { if (ev.key === "Enter") onPoint(i); } },
      ...flags.map((f) => el("td", { class: "num" }, p.values[f])),
      ...bufts.map((b) => el("td", { class: "num", title: exactBytes(p.buffers[b]) }, p.buffers[b] === undefined ? "–" : exactBytes(p.buffers[b]))),
      el("td", {}, p.consistent === null ? "–" : p.consistent ? el("span", { class: "badge ok" }, "consistent") : el("span", { class: "badge oom" }, "NOT consistent")),
      el("td", {}, p.error && !p.trace ? p.error : p.families.slice(0, 3).map((f, k) => el("span", {}, k ? ", " : "", f.family, " ", bytesEl(f.bytes))))));
  });
  clear($("rec-table")).append(el("thead", {}, el("tr", {}, [...flags, ...bufts.map((b) => `${b} compute`), "", "dominant families"]
    .map((h, i) => el("th", { class: i < flags.length + bufts.length ? "num" : null }, h)))), tbody);
}

function laws(sweep) {
  const ul = clear($("rec-laws"));
  for (const x of sweep.laws.slice(0, 8)) {
    const text = x.law ? x.law.formula + (x.law.kind === "shape" ? ` per ${/-\d+$/.test(x.law.example) ? "layer" : "tensor"} (${x.law.example}: ${x.law.type} [${x.law.dims.join(", ")}])` : "")
      : (x.by_setting || []).map((b) => `${Object.entries(b.setting).map(([k, v]) => `${k}=${v}`).join(" ")}: ${b.law ? b.law.formula : "no exact law"}`).join("; ") || "no exact law in these points";
    ul.append(el("li", {}, el("strong", {}, x.family), ": ", text));
  }
}

export async function showRecorded(id) {
  const status = $("rec-status");
  status.className = "status";
  status.textContent = "Loading the recorded sweep…";
  const sweep = await recordedSweep(id);
  if (sweep.fit) { location.replace(`/preflight?id=${enc(sweep.sweep)}`); return sweep; }  // one point: the search is there
  const axis = axisOf(sweep);
  $("rec-result").hidden = false;
  clear($("rec-title")).append(`Sweep ${sweep.sweep}: ${sweep.points.length} points `,
    el("a", { id: "rec-preflight", class: "preflight-link", href: `/preflight?id=${enc(sweep.sweep)}` }, "every buffer and KV cache, with a budget →"));
  const settings = [...groups(sweep.points, axis).keys()];
  const pick = clear($("rec-stack"));
  for (const s of settings) pick.append(el("option", { value: s }, s || "every point"));
  const onPoint = (i) => showPoint(sweep, axis, i);
  table(sweep, axis, onPoint);
  laws(sweep);
  await draw(sweep, axis, settings[0]);
  pick.onchange = () => draw(sweep, axis, pick.value);
  $("rec-chart").on("plotly_click", (ev) => {
    const pt = ev.points && ev.points[0];
    if (pt && pt.data.meta && pt.data.meta.kind === "setting") onPoint(pt.customdata[3]);
  });
  $("rec-result").dataset.ready = "1";
  status.textContent = `${sweep.points.length} points; stacked by family for ${pick.value || "every point"}.`;
  return sweep;
}

export async function listRecorded(onPick) {
  const list = clear($("rec-list"));
  let sweeps = [];
  try { sweeps = await recordedSweeps(); } catch (e) { list.append(el("li", { class: "error" }, `Recorded sweeps unavailable: ${e.message}`)); return; }
  if (!sweeps.length) list.append(el("li", { class: "hint" }, "None yet: alloctrace sweep --vary=-c=512,4096 -- PROGRAM ... records one."));
  for (const s of sweeps) {
    const curves = el("a", { class: "preflight-link", href: `/preflight?id=${enc(s.sweep)}` }, s.fit ? "fit: pre-flight page →" : "pre-flight page →");
    if (s.fit) {  // a fit's answer is one point: its whole search is drawn on the pre-flight page
      list.append(el("li", {}, el("a", { href: `/preflight?id=${enc(s.sweep)}` }, `${s.sweep}`), ` — fit of ${s.fit}, ${s.name}, ${s.created} · `, curves));
      continue;
    }
    list.append(el("li", {}, el("a", { href: `/sweep?id=${enc(s.sweep)}`, onclick: (ev) => { ev.preventDefault(); setUrlParams({ id: s.sweep }); onPick(s.sweep); } },
      `${s.sweep}`), ` — ${s.points} points, ${s.name}, ${s.created} · `, curves));
  }
}
