// Diff view: two graphs' memory maps on one aligned axis, the first divergence with best fit's reasoning,
// out-of-space explanations and the table of differing decisions. The shared zoom lives in the URL.
import { diff as getDiff, getTrace, oomEvent } from "./api.js";
import { $, el, clear, fmtBytes, exactBytes, fmtInt, topNav, showError, enc, parseRef, loading, loaded, urlParam,
  setUrlParams, tensorLabel, plotTheme } from "./common.js";
import { MemoryMap, plotText } from "./memmap.js";
import { oomCard, divergenceCard, freeListsCard } from "./cards.js";
import { drawState } from "./statebar.js";
import { waterfall } from "./waterfall.js";
import { errorPage, problem, isTraceId } from "./errors.js";

topNav("diff");
const refA = parseRef(urlParam("a")), refB = parseRef(urlParam("b"));

function summaryTable(a, b, deltas, la, lb) {
  const rows = [
    ["events", "events", false], ["allocations", "allocs", false], ["reuses", "reuses", false], ["frees", "frees", false],
    ["max size", "max_size", true], ["peak live bytes", "peak_live", true], ["high water", "high_water", true], ["buffer capacity", "capacity", true],
  ];
  const cell = (v, bytes) => el("td", { class: "num", title: bytes && v != null ? exactBytes(v) : null }, v == null ? "–" : bytes ? fmtBytes(v) : fmtInt(v));
  const body = rows.map(([label, key, bytes]) => {
    const va = a[key], vb = b[key];
    const d = deltas[key] !== undefined ? deltas[key] : (va != null && vb != null ? vb - va : null);
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
    const choice = (c) => c.kind === "reuse" ? `reused ${tensorLabel(c.parent)}` : c.kind === "oom" ? "no block fits"
      : `block ${c.block ?? "–"}${c.block_size != null ? ` (${fmtBytes(c.block_size)})` : ""}, offset ${fmtInt(c.offset)}`;
    out.push(["first divergence", d.tensor, choice(d.a), choice(d.b), (d.fields || []).join(", "), d.event_a]);
  }
  for (const r of deltas.offsets || []) out.push(["offset", r.tensor, fmtInt(r.a), fmtInt(r.b), `${r.delta > 0 ? "+" : ""}${fmtInt(r.delta)} B`, null]);
  for (const r of deltas.sizes || []) out.push(["size", r.tensor, exactBytes(r.a), exactBytes(r.b), `${r.delta > 0 ? "+" : ""}${fmtInt(r.delta)} B`, null]);
  for (const r of deltas.reuse || []) out.push(["reused parent", r.tensor, r.a ?? "(none)", r.b ?? "(none)", "", null]);
  if (!out.length) return el("p", { class: "empty" }, "No decisions differ.");
  const tbody = el("tbody");
  for (const [what, tensor, va, vb, delta, ev] of out) {
    tbody.append(el("tr", { class: what === "first divergence" ? "selected" : null },
      el("td", {}, what), el("td", { class: "tensor" }, tensorLabel(tensor)), el("td", {}, va), el("td", {}, vb), el("td", { class: "num" }, delta),
      el("td", {}, ev != null ? el("button", { class: "link", type: "button", onclick: () => jump() }, `event ${fmtInt(ev)}`) : "")));
  }
  const more = deltas.reuse_count > (deltas.reuse || []).length ? el("p", { class: "hint" }, `${fmtInt(deltas.reuse_count)} reuse differences in all; the first ${deltas.reuse.length} are listed.`) : null;
  return el("div", {}, el("div", { class: "table-scroll" }, el("table", { class: "data plain-head", id: "decisions-table" },
    el("thead", {}, el("tr", {}, el("th", {}, "what"), el("th", {}, "tensor"), el("th", {}, la), el("th", {}, lb), el("th", { class: "num" }, "difference"), el("th", {}, ""))),
    tbody)), more);
}

/** The default shared x range: when one run stopped early (an OOM), frame the shorter run and the
 * divergence instead of squeezing it into a sliver of the longer one. */
function defaultRange(nA, nB, shiftB, ea) {
  const lo = Math.min(0, shiftB), hiAll = Math.max(nA, nB + shiftB);
  const shorter = Math.min(nA, nB + shiftB);
  if (shorter - lo >= 0.5 * (hiAll - lo)) return [lo, hiAll];
  const hi = Math.min(hiAll, Math.max(shorter, ea ?? 0) + Math.max(20, 0.15 * (shorter - lo)));
  return [lo, hi];
}

/** Two PyTorch snapshots: the peak delta, the first allocation that differs, the call sites side by side. */
function torchDiff(d, ta, tb) {
  for (const id of ["maps", "ooms", "summary", "decisions", "attribution"]) {
    const node = $(id).closest("section") || $(id);
    node.hidden = true;
  }
  const sign = (v) => `${v > 0 ? "+" : v < 0 ? "−" : ""}${fmtBytes(Math.abs(v))}`;
  $("refs").append(el("strong", {}, "a"), ` ${ta.name} · device ${d.a.device}  vs  `, el("strong", {}, "b"), ` ${tb.name} · device ${d.b.device}`);
  const al = d.alignment, first = d.first_difference;
  const side = (x) => (x ? `#${fmtInt(x.index)} ${fmtBytes(x.size)} at ${x.site}` : "none");
  const rows = d.by_call_site.map((r) => el("tr", {}, el("td", { class: "num" }, fmtBytes(r.a_bytes)), el("td", { class: "num" }, fmtBytes(r.b_bytes)),
    el("td", { class: "num", title: exactBytes(r.delta) }, sign(r.delta)), el("td", { class: "tensor" }, r.site)));
  $("divergence").append(el("section", { class: "panel", id: "torch-diff" },
    el("h2", {}, "Peak requested"),
    el("p", {}, `${fmtBytes(d.a.peak_requested)} → ${fmtBytes(d.b.peak_requested)}: `,
      el("strong", { id: "torch-diff-peak-delta", title: exactBytes(d.delta_requested) }, sign(d.delta_requested)),
      ` (reserved ${sign(d.reserved.delta_peak_reserved)})`),
    el("p", { id: "torch-diff-aligned" }, `${fmtInt(al.paired)} allocations aligned${al.same_sequence ? " (same call-site sequence)" : ""}, ${fmtInt(al.only_a)} only in a, ${fmtInt(al.only_b)} only in b; ${fmtInt(al.grew)} grew, ${fmtInt(al.shrank)} shrank`),
    el("p", { id: "torch-diff-first" }, first ? `First allocation that differs (${first.differs_in}): a ${side(first.a)}; b ${side(first.b)}` : "Both runs allocated the same sizes from the same stacks, in order."),
    el("div", { class: "table-scroll" }, el("table", { class: "data plain-head", id: "torch-diff-sites" },
      el("thead", {}, el("tr", {}, el("th", { class: "num" }, "a"), el("th", { class: "num" }, "b"), el("th", { class: "num" }, "b − a"), el("th", {}, "call site"))),
      el("tbody", {}, rows)))));
}

async function main() {
  const asked = `a=${(urlParam("a") || "").slice(0, 30)}, b=${(urlParam("b") || "").slice(0, 30)}`;
  if (!refA || !refB || !isTraceId(refA.id) || !isTraceId(refB.id)) {
    errorPage(problem({ status: 422 }, "diff", asked));
    return;
  }
  loading($("divergence"), "Comparing the two runs…");
  loading($("attribution"), "Attributing the size difference…");
  let diff, ta, tb;
  try {
    [diff, ta, tb] = await Promise.all([getDiff(`${refA.id}:${refA.g}`, `${refB.id}:${refB.g}`),
      getTrace(refA.id), refB.id === refA.id ? null : getTrace(refB.id)]);
  } catch (e) {
    loaded($("divergence"));
    loaded($("attribution"));
    errorPage(problem(e, "diff", asked));
    return;
  }
  loaded($("divergence"));
  clear($("divergence"));
  loaded($("attribution"));
  tb = tb || ta;
  if (diff.torch) {
    torchDiff(diff.torch, ta, tb);
    return;
  }
  const ga = ta.graphs.find((g) => g.index === refA.g) || {}, gb = tb.graphs.find((g) => g.index === refB.g) || {};
  const A = diff.a, B = diff.b;
  const la = `a (${ga.role ?? `graph ${refA.g}`})`, lb = `b (${gb.role ?? `graph ${refB.g}`})`;
  const link = (t, ref) => el("a", { href: `/traces/${enc(ref.id)}?g=${ref.g}`, class: "tensor" }, `${t.name} · graph ${ref.g}`);
  $("refs").append(el("strong", {}, "a"), " ", link(ta, refA), el("span", { class: "hint" }, ` (${ga.role ?? "?"}, ${ta.generation ?? ""})`),
    "  vs  ", el("strong", {}, "b"), " ", link(tb, refB), el("span", { class: "hint" }, ` (${gb.role ?? "?"}, ${tb.generation ?? ""})`));

  if (diff.lead === "size") {  // another program or setting: the sizes are the answer, the divergence follows
    const att = $("attribution").closest("section"), grid = att.parentElement;
    grid.classList.add("size-first");
    grid.prepend(att);
    att.querySelector("h2").textContent = "Size attribution: a and b are different programs or settings";
  }
  const d = diff.firstDivergence;
  const ea = d ? d.event_a : null, eb = d ? d.event_b : null;
  const jumpButton = el("button", { id: "jump", type: "button", disabled: !d }, "Jump to the first divergence");
  if (d) {
    const links = el("p", {}, jumpButton, " ",
      el("a", { href: `/traces/${enc(refA.id)}?g=${refA.g}&event=${ea}`, id: "open-a" }, `open a at event ${fmtInt(ea)}`), " · ",
      el("a", { href: `/traces/${enc(refB.id)}?g=${refB.g}&event=${eb}`, id: "open-b" }, `open b at event ${fmtInt(eb)}`));
    const card = divergenceCard(d, la, lb, links);
    if (diff.lead === "size") {
      card.querySelector("h2").append(" (it follows from the sizes)");
      card.classList.add("follows");
    }
    $("divergence").append(card);
    // what best fit saw in each run just before the divergent placement, on one byte axis
    const top = Math.max(ga.buffer_size || 0, gb.buffer_size || 0, ga.max_size || 0, gb.max_size || 0);
    const seen = el("section", { class: "panel", id: "divergence-states" },
      el("h2", {}, `The allocator state before event ${fmtInt(ea)}${eb !== ea ? ` / ${fmtInt(eb)}` : ""} (what best fit searched)`));
    for (const [key, label, ref, ev, choice] of [["a", la, refA, ea, d.a], ["b", lb, refB, eb, d.b]]) {
      const box = el("div", { id: `state-${key}`, class: "chart bar" }), note = el("p", { class: "legend-note" });
      seen.append(el("h3", {}, label), box, note);
      loading(note, "Loading the allocator state…");
      drawState(box, note, ref, ev, top, { ...choice, tensor: d.tensor }).catch((e) => showError(note, e)).finally(() => loaded(note));
    }
    $("divergence").append(seen);
  } else {
    $("divergence").append(el("section", { class: "card fits", id: "no-divergence" }, el("h2", {}, "No divergence"),
      el("p", {}, "Both runs made the same placement decisions, tensor for tensor.")));
  }
  waterfall($("attribution"), diff.sizeAttribution, la, lb);
  if (diff.freeListsDiffer) $("divergence").append(freeListsCard(diff.freeListsDiffer, d, la, lb));

  // out-of-space cards numbered as the trace page numbers them: the graph's `oom` event
  for (const [side, label, ref] of [[A, la, refA], [B, lb, refB]]) {
    if (!side.oom) continue;
    const at = await oomEvent(ref.id, ref.g).catch(() => null);
    const separating = (side.oom.stranded_by || []).flatMap((g) => g.live || []);
    $("ooms").append(oomCard({ ...side.oom, separating }, `${label} ran out of space${at !== null ? ` at event ${fmtInt(at)}` : ""}`));
  }
  $("summary").append(summaryTable(A, B, diff.deltas, la, lb));

  // one aligned axis: b is shifted so the first divergence sits at the same x in both maps
  const shiftB = d && ea != null && eb != null ? ea - eb : 0;
  const nA = ga.n_events ?? A.events ?? 0, nB = gb.n_events ?? B.events ?? 0;
  const full = [Math.min(0, shiftB), Math.max(nA, nB + shiftB)];
  const saved = [Number(urlParam("x0")), Number(urlParam("x1"))];
  const xRange = urlParam("x0") !== null && saved.every(Number.isFinite) && saved[1] > saved[0] ? saved : defaultRange(nA, nB, shiftB, ea);
  const theme = plotTheme();
  const mark = (x, text) => ({
    shapes: [{ type: "line", xref: "x", yref: "paper", x0: x, x1: x, y0: 0, y1: 1, line: { color: theme.warn, width: 2.5, dash: "dash" } }],
    annotations: [{ xref: "x", yref: "paper", x, y: 1, yanchor: "bottom", showarrow: false,
      text: plotText(text), font: { color: theme.warn, size: 12 } }],
  });
  const maps = [];
  const sync = (src) => (range) => {
    for (const m of maps) if (m !== src) m.setXRange(range);
    setUrlParams({ x0: Math.round(range[0]), x1: Math.round(range[1]) });
  };
  const mA = new MemoryMap($("map-a"), refA, { title: `${la}: ${ta.name}`, xShift: 0, xRange, freeList: true });
  const mB = new MemoryMap($("map-b"), refB, { title: `${lb}: ${tb.name}`, xShift: shiftB, xRange, freeList: true });
  maps.push(mA, mB);
  mA.opts.onXRange = sync(mA); mB.opts.onXRange = sync(mB);
  if (d) {
    for (const [m, x] of [[mA, ea], [mB, eb + shiftB]]) {
      const mk = mark(x, `first divergence: ${tensorLabel(d.tensor)} (event ${fmtInt(m === mA ? ea : eb)})`);
      m.extraShapes = mk.shapes; m.extraAnnotations = mk.annotations;
    }
  }
  const jump = () => {
    if (!d) return;
    const span = Math.max(30, Math.min(Math.round(Math.max(nA, nB) / 3), 200));
    mA.focus(ea, span); mB.focus(eb, span);
    setUrlParams({ x0: Math.round(ea - span / 2), x1: Math.round(ea + span / 2) });
    $("maps").scrollIntoView({ behavior: "smooth", block: "start" });
  };
  $("decisions").append(decisionsTable(d, diff.deltas, la, lb, jump));
  jumpButton.addEventListener("click", jump);
  $("reset").addEventListener("click", () => { for (const m of maps) m.setXRange(full); setUrlParams({ x0: null, x1: null }); });
  try {
    await Promise.all([mA.load(ga), mB.load(gb)]);
    document.body.dataset.mapsReady = "1";
  } catch (e) { showError($("map-a"), e); }
}
main();
