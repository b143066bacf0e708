// History view: buffer size per commit for a chosen set of tags, one line per config and buffer; every jump
// between neighbouring commits links to their comparison (the same page, ?base=&head=), shown below the chart
// with each changed buffer's size attribution by family. The view lives in the URL, so a link reopens it.
import { compare, history, storeTags } from "./api.js";
import { $, el, clear, fmtBytes, exactBytes, topNav, opColor, plotConfig, plotTheme, urlParam, setUrlParams } from "./common.js";
import { plotText, byteTicks } from "./memmap.js";

const PAGE = 50;
const signed = (n) => (n === null || n === undefined ? "–" : `${n > 0 ? "+" : n < 0 ? "−" : ""}${fmtBytes(Math.abs(n))}`);
const tagsOf = (text) => text.split(/\s+/).filter((t) => t.includes("="));
let view = { tags: [], key: "commit", offset: 0 };

function compareHref(key, tags, base, head) {
  const q = new URLSearchParams();
  for (const t of tags) q.append("tag", t);
  q.set("key", key); q.set("base", base); q.set("head", head);
  return `/history?${q}#compare`;
}

function draw(out) {
  const theme = plotTheme();
  const xs = out.commits.map((c) => c.value);
  const traces = out.series.map((s, k) => {
    const name = `${s.label} · ${s.buffer}`;
    return { type: "scatter", mode: "lines+markers", name: plotText(name), x: s.points.map((p) => p.commit),
      y: s.points.map((p) => p.size), line: { color: opColor(`history:${name}`), dash: ["solid", "dash", "dot"][k % 3], width: 2 },
      customdata: s.points.map((p) => [fmtBytes(p.size), exactBytes(p.size), p.trace]),
      hovertemplate: `%{x}: %{customdata[0]} (%{customdata[1]}), trace %{customdata[2]}<extra>%{fullData.name}</extra>` };
  });
  const top = Math.max(1, ...out.series.flatMap((s) => s.points.map((p) => p.size)));
  const t = byteTicks(0, top * 1.05, 6);
  const axis = { gridcolor: theme.grid, zeroline: false, color: theme.muted };
  return Plotly.react($("history-chart"), traces, {
    margin: { l: 80, r: 20, t: 20, b: 60 }, hovermode: "closest", legend: { orientation: "h", y: -0.25 },
    paper_bgcolor: theme.paper, plot_bgcolor: theme.plot, font: { family: "system-ui, sans-serif", size: 12, color: theme.ink },
    xaxis: { ...axis, title: { text: out.key }, type: "category", categoryorder: "array", categoryarray: xs },
    yaxis: { ...axis, title: { text: "buffer size" }, range: [0, top * 1.05], tickvals: t.tickvals, ticktext: t.ticktext },
  }, plotConfig());
}

function jumps(out) {
  const list = clear($("jumps"));
  if (!out.jumps.length) { list.append(el("li", { class: "hint" }, "No buffer changed between neighbouring commits on this page.")); return; }
  for (const j of out.jumps) {
    list.append(el("li", { class: j.delta > 0 ? "bad" : null },
      el("a", { href: compareHref(out.key, view.tags, j.base, j.head), class: "jump", dataset: { base: j.base, head: j.head },
        onclick: (ev) => { ev.preventDefault(); showCompare(j.base, j.head); } }, `${j.base} → ${j.head}`),
      ` ${j.label} · ${j.buffer}: ${fmtBytes(j.base_size)} → ${fmtBytes(j.head_size)} (${signed(j.delta)})`));
  }
}

async function showCompare(base, head) {
  setUrlParams({ base, head });
  const out = await compare([`${view.key}=${base}`], [`${view.key}=${head}`], view.tags);
  $("compare").hidden = false;
  clear($("compare-title")).append(`${view.key} ${base} → ${head}: ${out.failed ? "a buffer grew" : "no growth"}`);
  const tbody = el("tbody");
  const details = clear($("attribution"));
  for (const p of out.pairs) {
    const label = Object.entries(p.tags).map(([k, v]) => `${k}=${v}`).join(" ") || "(all)";
    for (const b of p.buffers) {
      tbody.append(el("tr", { class: b.delta > 0 ? "bad" : null }, el("td", {}, label), el("td", {}, b.buffer),
        el("td", { class: "num", title: exactBytes(b.base) }, fmtBytes(b.base)), el("td", { class: "num", title: exactBytes(b.head) }, fmtBytes(b.head)),
        el("td", { class: "num" }, signed(b.delta)), el("td", { class: "cause" }, b.cause || "")));
      if (!b.attribution) continue;
      const rows = b.attribution.families.filter((f) => f.delta).slice(0, 12).map((f) => el("tr", {},
        el("td", {}, f.family), el("td", { class: "num" }, fmtBytes(f.a)), el("td", { class: "num" }, fmtBytes(f.b)),
        el("td", { class: "num" }, signed(f.delta))));
      details.append(el("h3", {}, `${label} · ${b.buffer}: by family`), el("table", { class: "data plain-head attribution" },
        el("thead", {}, el("tr", {}, ["family", base, head, "delta"].map((h, i) => el("th", { class: i ? "num" : null }, h)))),
        el("tbody", {}, ...rows)));
    }
  }
  clear($("compare-table")).append(el("thead", {}, el("tr", {}, ["run", "buffer", base, head, "delta", "cause"]
    .map((h, i) => el("th", { class: i >= 2 && i <= 4 ? "num" : null }, h)))), tbody);
  $("compare").dataset.ready = "1";
}

async function show() {
  const status = $("history-status");
  status.className = "status"; status.textContent = "Loading…";
  try {
    const out = await history(view.tags, { key: view.key, offset: view.offset, limit: PAGE });
    setUrlParams({ tag: view.tags.join(" ") || null, key: view.key, offset: view.offset || null });
    $("result").hidden = false;
    await draw(out);
    jumps(out);
    $("prev").disabled = view.offset === 0;
    $("next").disabled = view.offset + PAGE >= out.total;
    status.textContent = `${out.commits.length} of ${out.total} commits, ${out.series.length} lines.`;
    $("result").dataset.ready = "1";
  } catch (e) { status.className = "status error"; status.textContent = `History unavailable: ${e.message}`; }
}

async function main() {
  topNav("history");
  const tags = new URLSearchParams(location.search).getAll("tag").flatMap(tagsOf);
  view = { tags, key: urlParam("key") || "commit", offset: Number(urlParam("offset")) || 0 };
  $("tags").value = view.tags.join(" "); $("key").value = view.key;
  $("history-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    view = { tags: tagsOf($("tags").value), key: $("key").value.trim() || "commit", offset: 0 };
    show();
  });
  $("prev").addEventListener("click", () => { view.offset = Math.max(0, view.offset - PAGE); show(); });
  $("next").addEventListener("click", () => { view.offset += PAGE; show(); });
  storeTags().then((t) => {
    const keys = Object.entries(t.tags).map(([k, vs]) => `${k} (${Object.keys(vs).length})`);
    $("known-tags").textContent = keys.length ? `Tag keys in this store: ${keys.join(", ")}` : "No trace is tagged yet (alloctrace import --tag commit=…).";
  }).catch(() => {});
  await show();
  if (urlParam("base") && urlParam("head")) await showCompare(urlParam("base"), urlParam("head"));
}
main();
