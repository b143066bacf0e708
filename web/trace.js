// Trace view: one graph's memory map, free list, events and allocator state, all linked.
import { api, el, clear, bytesEl, fmtBytes, exactBytes, fmtInt, topNav, showError, enc, graphBase, pick } from "/static/common.js";
import { MemoryMap } from "/static/memmap.js";
import { EventTable } from "/static/events-table.js";
import { drawState } from "/static/statebar.js";
import { oomCard } from "/static/cards.js";

topNav("trace");
const id = decodeURIComponent(location.pathname.replace(/^\/traces\//, "").replace(/\/$/, ""));
const params = new URLSearchParams(location.search);
const $ = (x) => document.getElementById(x);

function fact(label, value) { return el("div", {}, el("dt", {}, label), el("dd", {}, value)); }

function selectionPanel(i, e, hit) {
  const box = clear($("selection"));
  const rows = [];
  if (e) {
    for (const k of ["kind", "tensor", "op", "size", "offset", "block", "chunk", "parent", "reason", "n_free", "largest_free", "total_free", "needed", "largest", "node"]) {
      const v = e[k];
      if (v === undefined || v === null) continue;
      const bytes = ["size", "offset", "largest_free", "total_free", "needed", "largest"].includes(k);
      rows.push(el("div", {}, el("dt", {}, k.replace(/_/g, " ")), el("dd", { class: k === "tensor" || k === "parent" ? "tensor" : null, title: bytes ? exactBytes(v) : null },
        bytes ? `${fmtBytes(v)}${k === "offset" ? ` (${fmtInt(v)})` : ""}` : String(v))));
    }
  }
  box.append(el("p", {}, el("strong", {}, `Event ${fmtInt(i)}`),
    hit ? el("span", { class: "hint" }, " · clicked tensor ", el("span", { class: "tensor" }, hit.tensor)) : null));
  if (rows.length) box.append(el("dl", { class: "facts" }, rows));
}

async function main() {
  let t;
  try { t = await api(`/api/traces/${enc(id)}`); } catch (e) {
    $("title").textContent = "Trace not available";
    for (const n of document.querySelectorAll("main > section, main > .grid-2")) n.hidden = true;
    showError($("oom-card"), e);
    return;
  }
  const graphs = t.graphs || [];
  const g = Number(params.get("g") ?? (graphs[0] ? graphs[0].index : 0));
  const gs = graphs.find((x) => x.index === g) || graphs[0] || { index: g };
  document.title = `alloctrace · ${t.name ?? id}`;
  $("title").textContent = t.name ?? id;
  $("facts").append(fact("generation", el("code", {}, t.generation ?? "–")), fact("source", t.source ?? "–"),
    fact("graph", `${gs.index} (${gs.role ?? "?"})`), fact("events", fmtInt(gs.n_events)),
    fact("max size", bytesEl(gs.max_size)), fact("buffer", bytesEl(gs.buffer_size)),
    ...(gs.complete === false ? [fact("complete", el("span", { class: "badge oom incomplete" }, "no: the log ends inside this walk"))] : []));

  const bar = $("graph-bar");
  bar.append(el("span", { class: "hint" }, "Graph:"));
  for (const x of graphs) {
    const a = el("a", { href: `/traces/${enc(id)}?g=${x.index}`, class: `badge ${x.index === gs.index ? "role" : "kind"}` },
      `${x.index} · ${x.role ?? ""}${x.oom ? " · OOM" : ""}${x.complete === false ? " · incomplete" : ""}`);
    if (x.index === gs.index) a.setAttribute("aria-current", "page");
    bar.append(a);
  }
  if (graphs.length >= 2) {
    const other = graphs.find((x) => x.index !== gs.index);
    const [a, b] = gs.index < other.index ? [gs.index, other.index] : [other.index, gs.index];
    bar.append(el("span", { class: "spacer" }), el("a", { href: `/diff?a=${enc(`${id}:${a}`)}&b=${enc(`${id}:${b}`)}`, class: "button secondary" }, `Compare graph ${a} with ${b}`));
  }
  if (gs.oom) $("oom-card").append(oomCard(gs.oom, `Graph ${gs.index} ran out of space`));
  const explainOom = async (ev) => {
    // the free list just before the failing event: which blocks there were and what kept them apart
    try {
      const st = await api(`${graphBase(id, gs.index)}/state?event=${encodeURIComponent(ev)}`);
      const blocks = (st.free_blocks || []).map((b) => (Array.isArray(b) ? b : [b.offset, b.size, b.chunk]));
      const finite = blocks.filter((b) => b[1] !== null && b[1] !== undefined);
      const lo = finite.length ? finite[0][0] : 0, hi = finite.length ? finite[finite.length - 1][0] : 0;
      const separating = (st.live || []).filter((t) => t.offset > lo && t.offset < hi);
      const total = pick(st.free_summary || {}, "total") ?? finite.reduce((a, b) => a + b[1], 0);
      clear($("oom-card")).append(oomCard({ ...gs.oom, total_free: total, free_blocks: finite, separating },
        `Graph ${gs.index} ran out of space at event ${fmtInt(ev)}`));
    } catch (_) { /* keep the short card */ }
  };

  const base = graphBase(id, gs.index);
  let map = null;
  const pickEvent = async (i, hit) => {
    const e = await table.select(i, false);
    selectionPanel(i, e, hit);
    if (map) map.setMarker(i);
    try { await drawState($("state"), $("state-note"), base, i, gs.buffer_size || gs.max_size, gs.n_events); }
    catch (err) { $("state-note").textContent = `State unavailable: ${err.message}`; }
  };
  const table = new EventTable($("events"), base, { onSelect: (i) => pickEvent(i) });
  table.load(0);
  try {
    map = new MemoryMap($("map"), { id, g: gs.index }, { onPick: (i, hit) => pickEvent(i, hit) });
    await map.load(gs);
    $("map-note").textContent = [
      map.colorBy === "tensor" ? "This log names no op for its allocations, so rectangles are colored by tensor name." : "",
      map.truncated ? "Zoomed out: small tensors are merged; zoom in for every tensor." : ""].filter(Boolean).join(" ");
    const asked = params.get("event");
    if (map.oom && map.oom.event !== undefined && map.oom.event !== null) explainOom(map.oom.event);
    if (asked !== null && Number.isInteger(Number(asked)) && Number(asked) >= 0) {
      const i = Math.min(Number(asked), Math.max(0, (gs.n_events ?? 1) - 1));
      await map.focus(i, Math.max(30, Math.min(200, Math.round((gs.n_events || 0) / 4))));
      pickEvent(i);
    } else if (map.oom && map.oom.event !== undefined && map.oom.event !== null) pickEvent(map.oom.event);
  } catch (e) { showError($("map"), e); }
}
main();
