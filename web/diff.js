// Diff view: two graphs' memory maps on one aligned axis, the first divergence in words,
// out-of-space explanations and the table of differing decisions.
import { api, el, clear, bytesEl, fmtBytes, exactBytes, fmtInt, topNav, showError, enc, parseRef, pick } from "/static/common.js";
import { MemoryMap, plotText } from "/static/memmap.js";
import { oomCard } from "/static/cards.js";
import { waterfall } from "/static/waterfall.js";

topNav("diff");
const $ = (x) => document.getElementById(x);
const params = new URLSearchParams(location.search);
const refA = parseRef(params.get("a")), refB = parseRef(params.get("b"));

const AMBER = "#d08a00";

function divergenceCard(d, ffl, refs) {
  const box = $("divergence");
  if (!d) {
    box.append(el("section", { class: "card fits", id: "no-divergence" }, el("h2", {}, "No divergence"),
      el("p", {}, "Both runs made the same placement decisions, tensor for tensor.")));
  } else {
    const ea = pick(d, "event_a", "a_event", "event"), eb = pick(d, "event_b", "b_event", "event");
    box.append(el("section", { class: "card diverge", id: "divergence-card", role: "note" },
      el("h2", {}, `First divergence: event ${fmtInt(ea)}${eb !== ea ? ` / ${fmtInt(eb)}` : ""}`),
      el("p", { class: "big", id: "divergence-words" }, d.words ?? ""),
      d.fields && d.fields.length ? el("p", { class: "hint" }, `differs in: ${d.fields.join(", ")}`) : null,
      el("p", {}, "Open at the divergence: ",
        el("a", { href: `/traces/${enc(refs[0].id)}?g=${refs[0].g}&event=${ea}`, id: "open-a" }, `a, event ${fmtInt(ea)}`), " · ",
        el("a", { href: `/traces/${enc(refs[1].id)}?g=${refs[1].g}&event=${eb}`, id: "open-b" }, `b, event ${fmtInt(eb)}`))));
  }
  if (ffl && ffl.words) box.append(el("section", { class: "card" }, el("h2", {}, "Free lists first differ"), el("p", {}, ffl.words)));
}

function sideLabel(side, ref) { return `${pick(side, "label") ?? ""}`.trim() || `${ref.id}:${ref.g}`; }

function summaryTable(a, b, deltas, la, lb) {
  const rows = [
    ["events", "events", false], ["allocations", "allocs", false], ["reuses", "reuses", false], ["frees", "frees", false],
    ["max size", "max_size", true], ["peak live bytes", "peak_live", true], ["high water", "high_water", true], ["buffer capacity", "capacity", true],
  ];
  const cell = (v, bytes) => el("td", { class: "num", title: bytes && v != null ? exactBytes(v) : null }, v == null ? "–" : bytes ? fmtBytes(v) : fmtInt(v));
  const body = rows.map(([label, key, bytes]) => {
    const va = a[key], vb = b[key];
    const d = deltas && deltas[key] !== undefined ? deltas[key] : (va != null && vb != null ? vb - va : null);
    const dcell = el("td", { class: "num", title: bytes && d != null ? exactBytes(d) : null },
      d == null ? "–" : d === 0 ? "same" : `${d > 0 ? "+" : ""}${bytes ? fmtBytes(d) : fmtInt(d)}`);
    return el("tr", {}, el("td", {}, label), cell(va, bytes), cell(vb, bytes), dcell);
  });
  return el("table", { class: "data plain-head", id: "summary-table" },
    el("thead", {}, el("tr", {}, el("th", {}, ""), el("th", { class: "num" }, la), el("th", { class: "num" }, lb), el("th", { class: "num" }, "b − a"))),
    el("tbody", {}, body));
}

function decisionsTable(d, deltas, la, lb, jump) {
  const out = [];
  if (d) {
    const ca = d.a || {}, cb = d.b || {};
    const choice = (c) => c.kind === "reuse" ? `reused ${c.parent ?? "parent"}` : c.kind === "oom" ? "no block fits"
      : `block ${c.block ?? "–"}${c.block_size != null ? ` (${fmtBytes(c.block_size)})` : ""}, offset ${fmtInt(c.offset)}`;
    out.push(["first divergence", d.tensor, choice(ca), choice(cb), (d.fields || []).join(", "), pick(d, "event_a", "a_event", "event")]);
  }
  for (const r of (deltas && deltas.offsets) || []) out.push(["offset", r.tensor, fmtInt(r.a), fmtInt(r.b), `${r.delta > 0 ? "+" : ""}${fmtInt(r.delta)} B`, null]);
  for (const r of (deltas && deltas.sizes) || []) out.push(["size", r.tensor, fmtBytes(r.a), fmtBytes(r.b), `${r.delta > 0 ? "+" : ""}${fmtBytes(r.delta)}`, null]);
  for (const r of (deltas && deltas.reuse) || []) out.push(["reused parent", r.tensor, r.a ?? "(none)", r.b ?? "(none)", "", null]);
  if (!out.length) return el("p", { class: "empty" }, "No decisions differ.");
  const tbody = el("tbody");
  for (const [what, tensor, va, vb, delta, ev] of out) {
    const tr = el("tr", { class: what === "first divergence" ? "selected" : null },
      el("td", {}, what), el("td", { class: "tensor" }, tensor ?? ""), el("td", {}, va), el("td", {}, vb), el("td", { class: "num" }, delta),
      el("td", {}, ev != null ? el("button", { class: "link", type: "button", onclick: () => jump() }, `event ${fmtInt(ev)}`) : ""));
    tbody.append(tr);
  }
  const more = deltas && deltas.reuse_count > ((deltas.reuse || []).length) ? el("p", { class: "hint" }, `${fmtInt(deltas.reuse_count)} reuse differences in all; the first ${deltas.reuse.length} are listed.`) : null;
  return el("div", {}, el("div", { class: "table-scroll" }, el("table", { class: "data plain-head", id: "decisions-table" },
    el("thead", {}, el("tr", {}, el("th", {}, "what"), el("th", {}, "tensor"), el("th", {}, la), el("th", {}, lb), el("th", { class: "num" }, "difference"), el("th", {}, ""))),
    tbody)), more);
}

async function main() {
  if (!refA || !refB) {
    for (const n of document.querySelectorAll("main > section")) n.hidden = true;
    showError($("divergence"), "This page compares two graphs: open it as /diff?a=ID:GRAPH&b=ID:GRAPH.");
    return;
  }
  let diff, ta, tb;
  try {
    [diff, ta, tb] = await Promise.all([api(`/api/diff?a=${enc(`${refA.id}:${refA.g}`)}&b=${enc(`${refB.id}:${refB.g}`)}`),
      api(`/api/traces/${enc(refA.id)}`), refB.id === refA.id ? null : api(`/api/traces/${enc(refB.id)}`)]);
  } catch (e) {
    for (const n of document.querySelectorAll("main > section")) n.hidden = true;
    showError($("divergence"), e);
    return;
  }
  tb = tb || ta;
  const ga = (ta.graphs || []).find((g) => g.index === refA.g) || {}, gb = (tb.graphs || []).find((g) => g.index === refB.g) || {};
  const A = diff.a || {}, B = diff.b || {};
  const la = `a: ${sideLabel(A, refA)}`, lb = `b: ${sideLabel(B, refB)}`;
  const link = (t, ref) => el("a", { href: `/traces/${enc(ref.id)}?g=${ref.g}`, class: "tensor" }, `${t.name ?? ref.id} · graph ${ref.g}`);
  $("refs").append(el("strong", {}, "a"), " ", link(ta, refA), el("span", { class: "hint" }, ` (${ga.role ?? "?"}, ${ta.generation ?? ""})`),
    "  vs  ", el("strong", {}, "b"), " ", link(tb, refB), el("span", { class: "hint" }, ` (${gb.role ?? "?"}, ${tb.generation ?? ""})`));

  const d = diff.first_divergence;
  divergenceCard(d, diff.first_free_list_divergence, [refA, refB]);
  waterfall($("attribution"), diff.size_attribution, la, lb);
  for (const [side, label] of [[A, la], [B, lb]]) {
    if (side.oom) $("ooms").append(oomCard({ ...side.oom, separating: (side.oom.stranded_by || []).flatMap((g) => g.live || []) }, `${label} ran out of space at event ${fmtInt(side.oom.event)}`));
  }
  $("summary").append(summaryTable(A, B, diff.deltas, la, lb));

  // one aligned axis: b is shifted so the first divergence sits at the same x in both maps
  const ea = d ? pick(d, "event_a", "a_event", "event") : null, eb = d ? pick(d, "event_b", "b_event", "event") : null;
  const shiftB = d && ea != null && eb != null ? ea - eb : 0;
  const nA = ga.n_events ?? A.events ?? 0, nB = gb.n_events ?? B.events ?? 0;
  const xRange = [Math.min(0, shiftB), Math.max(nA, nB + shiftB)];
  const mark = (x, text) => ({
    shapes: [{ type: "line", xref: "x", yref: "paper", x0: x, x1: x, y0: 0, y1: 1, line: { color: AMBER, width: 2.5, dash: "dash" } }],
    annotations: [{ xref: "x", yref: "paper", x, y: 1, yanchor: "bottom", xanchor: "left", showarrow: false,
      text: plotText(text), font: { color: "#8a5c00", size: 12 }, bgcolor: "rgba(255,244,214,0.9)" }],
  });
  const maps = [];
  const sync = (src) => (range) => { for (const m of maps) if (m !== src) m.setXRange(range); };
  const mA = new MemoryMap($("map-a"), refA, { title: la, xShift: 0, xRange, freeList: true });
  const mB = new MemoryMap($("map-b"), refB, { title: lb, xShift: shiftB, xRange, freeList: true });
  maps.push(mA, mB);
  mA.opts.onXRange = sync(mA); mB.opts.onXRange = sync(mB);
  if (d) {
    for (const [m, x] of [[mA, ea], [mB, eb + shiftB]]) {
      const mk2 = mark(x, `first divergence: ${d.tensor ?? ""}`);
      m.extraShapes = mk2.shapes; m.extraAnnotations = mk2.annotations;
    }
  }
  const jump = () => { if (d) { const span = Math.max(30, Math.min(Math.round(Math.max(nA, nB) / 3), 200));
    mA.focus(ea, span); mB.focus(eb, span); $("map-a").scrollIntoView({ behavior: "smooth", block: "start" }); } };
  $("decisions").append(decisionsTable(d, diff.deltas, la, lb, jump));
  $("jump").disabled = !d;
  $("jump").addEventListener("click", jump);
  $("reset").addEventListener("click", () => { for (const m of maps) m.setXRange(xRange); });
  try {
    await Promise.all([mA.load(ga), mB.load(gb)]);
    document.body.dataset.mapsReady = "1";
  } catch (e) { showError($("map-a"), e); }
}
main();
