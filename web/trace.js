// Trace view: one graph's memory map, free list, events and allocator state, all linked. The view (graph,
// zoom, selected event, tensor search) lives in the URL, so a link reopens the same picture.
import { getTrace, state, url } from "./api.js";
import { $, el, clear, exactEl, fmtInt, topNav, showError, enc, loading, loaded, urlParam, setUrlParams,
  tensorLabel, exactBytes, fmtBytes, words, fact } from "./common.js";
import { MemoryMap, nameMatcher } from "./memmap.js";
import { EventTable } from "./events-table.js";
import { drawState } from "./statebar.js";
import { oomCard } from "./cards.js";
import { peakPanel } from "./peak.js";
import { graphPicker, runOverview, LONG_RUN } from "./overview.js";
import { errorPage, problem, isTraceId } from "./errors.js";
import { consistencyBadge, showMismatches } from "./consistency.js";

topNav("trace");
const id = decodeURIComponent(location.pathname.replace(/^\/traces\//, "").replace(/\/$/, ""));

const BYTE_FIELDS = new Set(["size", "offset", "largest_free", "total_free", "needed", "largest"]);
function selectionPanel(i, e, hit) {
  const box = clear($("selection"));
  const rows = [];
  if (e) {
    for (const k of ["kind", "tensor", "op", "size", "offset", "block", "chunk", "parent", "reason", "n_free", "largest_free", "total_free", "needed", "largest", "node"]) {
      const v = k === "tensor" && e.tensor !== undefined ? tensorLabel(e.tensor, e.op, e.offset) : e[k];
      if (v === undefined || v === null) continue;
      rows.push(el("div", {}, el("dt", {}, k.replace(/_/g, " ")),
        el("dd", { class: k === "tensor" || k === "parent" ? "tensor" : null },
          BYTE_FIELDS.has(k) ? (k === "offset" ? `${fmtInt(v)} (${fmtBytes(v)})` : exactEl(v)) : String(v))));
    }
  }
  box.append(el("p", {}, el("strong", { id: "selected-event" }, `Event ${fmtInt(i)}`),
    hit ? el("span", { class: "hint" }, " · clicked tensor ", el("span", { class: "tensor" }, tensorLabel(hit.tensor, hit.op, hit.offset))) : null));
  if (rows.length) box.append(el("dl", { class: "facts" }, rows));
}

/** The out-of-space card (drawn first, see main) again with the free list the failing allocation searched. */
async function showOom(gs, ref, event) {
  if (event === null || event === undefined) return;
  try {
    const st = await state(ref.id, ref.g, event);
    const finite = st.freeBlocks.filter((b) => b.size !== null);
    const lo = finite.length ? finite[0].offset : 0, hi = finite.length ? finite[finite.length - 1].offset : 0;
    const separating = st.live.filter((t) => t.offset > lo && t.offset < hi);
    const total = st.freeSummary ? st.freeSummary.total : finite.reduce((a, b) => a + b.size, 0);
    clear($("oom-card")).append(oomCard({ ...gs.oom, total_free: total, free_blocks: finite, separating },
      `Graph ${gs.index} ran out of space at event ${fmtInt(event)}`));
  } catch (_) { /* keep the short card */ }
}

function header(t, gs) {
  document.title = `alloctrace · ${t.name}`;
  clear($("title")).append(...words(t.name));
  clear($("facts")).append(fact("generation", el("code", {}, t.generation ?? "–")), fact("source", t.source ?? "–"),
    fact("graph", `${gs.index} (${gs.role ?? "?"})`), fact("events", fmtInt(gs.n_events)),
    fact("high water (this graph)", el("span", { id: "high-water" }, "…")),
    fact("allocator max_size", el("span", { id: "max-size", title: "ggml's max_size; in 2023 generations a running maximum over every graph the allocator measured" }, gs.max_size === null ? "–" : exactEl(gs.max_size))),
    fact("buffer", gs.buffer_size === null ? "–" : exactEl(gs.buffer_size)),
    fact("consistent", el("span", { id: "consistent" }, consistencyBadge(gs))),
    ...(gs.complete === false ? [fact("complete", el("span", { class: "badge oom incomplete" }, "no: the log ends inside this walk"))] : []));
  $("exports").append("Download: ",
    el("a", { href: url.export(t.id, "chrome"), download: `trace-${t.id}.chrome.json`, id: "export-chrome", title: "open it in Perfetto (ui.perfetto.dev) or chrome://tracing" }, "Chrome trace (Perfetto)"),
    el("a", { href: url.export(t.id, "jsonl"), download: `trace-${t.id}.jsonl` }, "JSON Lines"),
    el("a", { href: url.export(t.id, "csv"), download: `trace-${t.id}.csv` }, "CSV"));
  const bar = $("graph-bar");
  bar.append(graphPicker(t, gs));
  if (t.graphs.length > LONG_RUN) {
    $("run-panel").hidden = false;
    runOverview($("run-overview"), $("run-note"), t, gs.index);
  }
  if (t.graphs.length >= 2) {
    const other = t.graphs.find((x) => x.index !== gs.index);
    const [a, b] = gs.index < other.index ? [gs.index, other.index] : [other.index, gs.index];
    bar.append(el("span", { class: "spacer" }), el("a", { href: `/diff?a=${enc(`${t.id}:${a}`)}&b=${enc(`${t.id}:${b}`)}`, class: "button secondary" }, `Compare graph ${a} with ${b}`));
  }
}

function numberParam(key) {
  const v = urlParam(key);
  return v === null || v.trim() === "" || !Number.isFinite(Number(v)) ? null : Number(v);
}

async function main() {
  let t;
  try { t = await getTrace(id); } catch (e) {
    errorPage(problem(isTraceId(id) ? e : { status: 422 }, "trace", id.slice(0, 40)));
    return;
  }
  const gParam = numberParam("g");
  // a run that failed opens on the graph that failed (not the measure pass before it), unless the link names one
  const gs = t.graphs.find((x) => x.index === gParam) || (gParam === null && t.graphs.find((x) => x.oom)) ||
    t.graphs[0] || { index: 0, oom: null };
  const ref = { id: t.id, g: gs.index };
  if (gParam !== gs.index) setUrlParams({ g: gs.index });
  header(t, gs);
  if (gs.oom) clear($("oom-card")).append(oomCard(gs.oom, `Graph ${gs.index} ran out of space`));  // the answer, first
  showMismatches($("mismatches"), ref, gs);

  let map = null;
  const table = new EventTable($("events"), ref, { onSelect: (i) => pickEvent(i) });
  const pickEvent = async (i, hit) => {
    setUrlParams({ event: i });
    const e = await table.select(i, false);
    selectionPanel(i, e, hit);
    if (map) map.setMarker(i);
    loading($("state-note"), "Loading the allocator state…");
    try { await drawState($("state"), $("state-note"), ref, i, gs.buffer_size || gs.max_size, e); }
    catch (err) { $("state-note").textContent = `State unavailable: ${err.message}`; }
    finally { loaded($("state-note")); }
  };

  // the tensor search: highlight matches on the map, count them, filter the table on an exact single match
  const search = () => {
    const text = $("search").value.trim(), regex = $("search-regex").checked;
    setUrlParams({ q: text || null, re: regex && text ? 1 : null });
    let match = null;
    try { match = nameMatcher(text, regex); } catch (e) { $("search-count").textContent = `bad pattern: ${e.message}`; return; }
    if (!map) return;
    const hits = map.setSearch(match);
    const names = new Set(hits.map((r) => r.tensor));
    $("search-count").textContent = match ? `${fmtInt(names.size)} tensor${names.size === 1 ? "" : "s"} in view` +
      (map.reduced ? " (zoom in: small tensors are merged)" : "") : "";
    $("search-count").dataset.count = match ? String(names.size) : "";
  };
  $("search").value = urlParam("q") || "";
  $("search-regex").checked = urlParam("re") === "1";
  $("search").addEventListener("input", search);
  $("search-regex").addEventListener("change", search);

  try {
    const view = ["x0", "x1", "y0", "y1"].map(numberParam);
    map = new MemoryMap($("map"), ref, {
      onPick: (i, hit) => pickEvent(i, hit),
      onView: (v, reset) => setUrlParams(reset ? { x0: null, x1: null, y0: null, y1: null }
        : { x0: Math.round(v.x0), x1: Math.round(v.x1), y0: Math.round(v.y0), y1: Math.round(v.y1) }),
      onRefetch: () => { if ($("search").value.trim()) search(); },
    });
    map.pictured.then(() => table.load(0));  // the map's picture first; the table's rows (already fetched) after it
    await map.load(gs, view.every((v) => v !== null) ? { x0: view[0], x1: view[1], y0: view[2], y1: view[3] } : null);
    $("high-water").replaceWith(map.highWater ? exactEl(map.highWater) : "–");
    $("map-note").textContent = [
      map.colorBy === "tensor" ? "This log names no op for its allocations, so rectangles are colored by tensor name." : "",
      map.maxSize && map.highWater && map.maxSize > map.highWater ? `The allocator's max_size (${exactBytes(map.maxSize)}) is above this graph's own high water (${exactBytes(map.highWater)}): in 2023 generations it is a running maximum over every graph measured.` : "",
      map.bufferSize && map.highWater && map.bufferSize > map.highWater * 1.25 ? `The map is scaled to this graph's own peak (${exactBytes(map.highWater)}); the buffer (${exactBytes(map.bufferSize)}, sized for a larger graph) is the dotted line above it: zoom out to see it.` : "",
      map.reduced ? "Zoomed out: small tensors are merged; zoom in for every tensor." : ""].filter(Boolean).join(" ");
    if (gs.oom) showOom(gs, ref, map.oom ? map.oom.event : null);
    if ($("search").value.trim()) search();
    const asked = numberParam("event");
    if (asked !== null && asked >= 0) {
      const i = Math.min(Math.round(asked), Math.max(0, (gs.n_events ?? 1) - 1));
      if (view.some((v) => v === null)) await map.focus(i, Math.max(30, Math.min(200, Math.round((gs.n_events || 0) / 4))));
      pickEvent(i);
    } else if (map.oom && map.oom.event !== null && map.oom.event !== undefined) pickEvent(map.oom.event);
  } catch (e) {
    if (!map) table.load(0);
    if ($("map").dataset.overview) $("map-note").textContent = `The chart is a still picture: ${e.message}`;
    else showError($("map"), e);
  }
  peakPanel($("peak"), id, gs.index, { map, onEvent: (i) => {
    if (map) { map.focus(i, 60); $("map").scrollIntoView({ behavior: "smooth", block: "start" }); }
    pickEvent(i);
  } });
}
main();
