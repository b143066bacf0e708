// PyTorch snapshots: timeline (server-side level of detail), state at any entry, OOM card, peak, diff.
// Self-contained: names from snapshots are always text, never markup.

const $ = (id) => document.getElementById(id);
const enc = encodeURIComponent;
const params = new URLSearchParams(location.search);

async function api(path, init) {
  const pre = window.__torchPrefetch || {};
  const early = !init && pre[path];
  if (early) delete pre[path];
  const r = early ? await early : await fetch(path, init);
  let body = null;
  try { body = await r.json(); } catch (_) { body = null; }
  if (!r.ok) throw new Error((body && typeof body.detail === "string") ? body.detail : `${r.status} ${r.statusText}`);
  return body;
}

function el(tag, attrs = {}, ...kids) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") n.className = v;
    else if (k.startsWith("on")) n.addEventListener(k.slice(2), v);
    else n.setAttribute(k, String(v));
  }
  for (const c of kids.flat()) if (c !== null && c !== undefined) n.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return n;
}
const clear = (n) => { while (n.firstChild) n.removeChild(n.firstChild); return n; };

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];
function fmtBytes(x) {
  if (x === null || x === undefined) return "–";
  let v = Math.abs(Number(x)), u = 0;
  while (v >= 1024 && u < UNITS.length - 1) { v /= 1024; u++; }
  const s = u === 0 ? String(v) : v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
  return `${Number(x) < 0 ? "-" : ""}${s} ${UNITS[u]}`;
}
const bytes = (x) => el("span", { title: `${Number(x).toLocaleString("en-US")} bytes` }, fmtBytes(x));
const int = (x) => (x === null || x === undefined ? "–" : Number(x).toLocaleString("en-US"));
const fact = (k, v) => el("div", {}, el("dt", {}, k), el("dd", {}, v));
const status = (msg, bad) => { const s = $("status"); s.textContent = msg || ""; s.className = bad ? "status error" : "status"; };

const PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#9d755d", "#eeca3b",
  "#ff9da6", "#79706e", "#5b8ff9", "#8c6d31", "#2ca02c", "#d62728", "#9467bd", "#17becf"];
function color(name) {
  let h = 0; const s = String(name);
  for (let i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) >>> 0;
  return PALETTE[h % PALETTE.length];
}
function table(head, rows, numeric = []) {
  return el("table", { class: "data" },
    el("thead", {}, el("tr", {}, head.map((h, i) => el("th", { class: numeric.includes(i) ? "num" : null }, h)))),
    el("tbody", {}, rows.map((r) => el("tr", {}, r.map((c, i) => el("td", { class: numeric.includes(i) ? "num" : (i === r.length - 1 ? "site" : null) }, c))))));
}

// ---------------------------------------------------------------------------------------- home
async function home() {
  $("home").hidden = false;
  const { traces } = await api("/api/traces");
  const mine = traces.filter((t) => t.source === "torch");
  const list = clear($("list"));
  if (!mine.length) list.append(el("p", { class: "empty" }, "No snapshots yet."));
  else list.append(table(["name", "devices", "entries", "peak requested", "peak reserved", "OOM"],
    mine.map((t) => [el("a", { href: `/torch?id=${enc(t.id)}` }, t.name), String(t.graphs.length),
      int(t.graphs.reduce((s, g) => s + g.n_events, 0)), bytes(Math.max(...t.graphs.map((g) => g.max_size || 0))),
      bytes(Math.max(...t.graphs.map((g) => g.buffer_size || 0))), t.graphs.some((g) => g.oom) ? "yes" : "–"]), [2, 3, 4]));
  for (const sel of [$("diff-a"), $("diff-b")]) {
    clear(sel);
    mine.forEach((t) => sel.append(el("option", { value: t.id }, `${t.name} (${t.id})`)));
  }
  if (mine.length > 1) $("diff-b").selectedIndex = 1;
  $("diff-form").onsubmit = (e) => { e.preventDefault(); location.href = `/torch?a=${enc($("diff-a").value)}&b=${enc($("diff-b").value)}`; };
  $("upload-form").onsubmit = async (e) => {
    e.preventDefault();
    const f = $("upload-file").files[0];
    if (!f) return;
    const form = new FormData(); form.append("file", f);
    status("Uploading…");
    try {
      const r = await api("/api/torch/traces", { method: "POST", body: form });
      location.href = `/torch?id=${enc(r.traces[0].id)}`;
    } catch (err) { status(err.message, true); }
  };
}

// ---------------------------------------------------------------------------------------- one trace
const view = { id: null, d: 0, info: null, skip: null, peakEvent: 0 };
const base = () => `/api/torch/traces/${enc(view.id)}/devices/${view.d}`;
const skipQ = () => (view.skip === null ? "" : `skip=${enc(view.skip)}`);

async function single(id, d) {
  Object.assign(view, { id, d });
  $("single").hidden = false;
  const sum = await api(`/api/torch/traces/${enc(id)}`);
  const dev = sum.devices.find((x) => x.device === d);
  if (!dev) throw new Error(`trace ${id} has no device ${d}`);
  view.info = dev;
  view.peakEvent = dev.peak_requested_event || 0;
  $("title").textContent = sum.name;
  clear($("facts")).append(fact("device", String(d)), fact("entries", int(dev.n_events)),
    fact("peak requested", bytes(dev.peak_requested)), fact("peak reserved", bytes(dev.peak_reserved)),
    fact("segments at snapshot", int(dev.n_segments)), fact("stacks", int(dev.n_stacks)),
    fact("rebuilt state = snapshot", dev.trace_matches_snapshot ? "yes" : "NO"),
    ...(dev.trace_complete === false ? [fact("trace", "wrapped or began late")] : []),
    ...(sum.devices.length > 1 ? [fact("devices", el("span", {}, sum.devices.map((x) =>
      el("a", { href: `/torch?id=${enc(id)}&device=${x.device}`, style: "margin-right:8px" }, String(x.device)))))] : []));
  $("state-event").max = dev.n_events;
  $("state-go").onclick = () => showState(Number($("state-event").value || 0));
  $("state-peak").onclick = () => showState(view.peakEvent + 1);
  $("state-end").onclick = () => showState(dev.n_events);
  $("skip-go").onclick = () => { view.skip = $("skip").value; showPeak(); };
  const jobs = [timeline(), showPeak(), oom()];
  await Promise.all(jobs);
  const at = params.get("event");
  if (params.get("view") === "oom" && dev.oom_events.length) await showState(dev.oom_events[0]);
  else await showState(at !== null ? Number(at) : dev.n_events);
}

async function timeline(x0, x1) {
  const q = new URLSearchParams({ max_points: "800", max_bands: "120" });
  if (x0 !== undefined) { q.set("x0", String(Math.max(0, Math.floor(x0)))); q.set("x1", String(Math.ceil(x1))); }
  if (view.skip !== null) q.set("skip", view.skip);
  const t = await api(`${base()}/timeline?${q}`);
  const traces = [{ x: t.grid, y: t.allocated_max, name: "allocated (all)", type: "scatter", mode: "lines",
    line: { color: "#9aa3b2", width: 1 }, fill: "tozeroy", fillcolor: "rgba(154,163,178,0.25)", hoverinfo: "x+y" },
  { x: t.grid, y: t.reserved_max, name: "reserved", type: "scatter", mode: "lines", line: { color: "#c0352b", width: 1, dash: "dot" } }];
  for (const b of t.bands) {
    const top = b.base.map((v) => v + b.size);
    traces.push({ x: b.x.concat(b.x.slice().reverse()), y: b.base.concat(top.reverse()), type: "scatter", mode: "lines",
      fill: "toself", fillcolor: color(b.site), line: { width: 0.5, color: "rgba(255,255,255,0.6)" }, showlegend: false,
      hoveron: "fills", name: "", customdata: [b.alloc], text: `${fmtBytes(b.size)} · entries ${b.alloc}–${b.free ?? "end"} · ${b.site}${b.meta ? " · " + b.meta : ""}`, hoverinfo: "text" });
  }
  const shapes = [], annotations = [];
  t.annotations.forEach((a, i) => {
    const ext = a.kind === "annotation";
    shapes.push({ type: "rect", xref: "x", yref: "paper", x0: a.x0, x1: a.x1, y0: ext ? 0.94 : 0.88, y1: ext ? 1.0 : 0.94,
      fillcolor: ext ? (i % 2 ? "#dbe4f7" : "#c5d3f2") : (i % 2 ? "#f4e7c3" : "#ecd9a0"), line: { width: 0 }, layer: "below" });
    annotations.push({ x: (a.x0 + a.x1) / 2, y: ext ? 0.97 : 0.91, xref: "x", yref: "paper", text: a.name, showarrow: false,
      font: { size: 10 }, hovertext: `${a.name}: entries ${a.x0}–${a.x1}` });
  });
  const layout = { margin: { l: 70, r: 20, t: 10, b: 40 }, xaxis: { title: "trace entry" },
    yaxis: { title: "bytes", rangemode: "tozero" }, shapes, annotations, hovermode: "closest", showlegend: true,
    legend: { orientation: "h", y: -0.15 }, uirevision: "keep" };
  if (x0 !== undefined) layout.xaxis.range = [x0, x1];
  const div = $("timeline");
  await Plotly.react(div, traces, layout, { displaylogo: false, responsive: true });
  div.dataset.bands = String(t.bands.length);
  div.dataset.x0 = String(t.x0); div.dataset.x1 = String(t.x1);
  div.dataset.ready = "1";
  $("timeline-note").textContent = `Entries ${int(t.x0)}–${int(t.x1)} of ${int(t.n_events)}; ${t.bands.length} largest allocations drawn, ${int(t.omitted_allocations)} more only in the total.`;
  if (!div._wired) {
    div._wired = true;
    div.on("plotly_relayout", (ev) => {
      if (ev["xaxis.range[0]"] !== undefined) timeline(ev["xaxis.range[0]"], ev["xaxis.range[1]"]).catch((e) => status(e.message, true));
      else if (ev["xaxis.autorange"]) timeline().catch((e) => status(e.message, true));
    });
    div.on("plotly_click", (ev) => {
      if (!ev.points || !ev.points.length) return;
      const pt = ev.points[0], band = pt.data.customdata;
      if (band) showAllocation(band[0]).catch((e) => status(e.message, true));
      showState(Math.round(band ? band[0] : pt.x) + 1);
    });
  }
}

async function showAllocation(k) {
  const { entries } = await api(`${base()}/entries?start=${k}&limit=1&frames=true${view.skip === null ? "" : "&" + skipQ()}`);
  const e = entries[0];
  const box = clear($("allocation"));
  box.hidden = false;
  box.append(el("h2", {}, `Allocation at entry ${int(e.i)}: ${fmtBytes(e.size)}`),
    el("p", {}, `${e.site}${e.meta ? " · " + e.meta : ""} · address 0x${e.addr.toString(16)} · stream ${e.stream}`),
    e.frames.length ? el("ol", { class: "mono" }, e.frames.map((f) => el("li", {}, `${f.name}  ${f.filename}:${f.line}`)))
      : el("p", { class: "hint" }, "No Python frames (made on the autograd thread)."));
}

async function oom() {
  const { oom: card } = await api(`${base()}/oom?${skipQ()}`);
  const box = clear($("oom-card"));
  if (!card) return;
  $("state-oom").hidden = false;
  $("state-oom").onclick = () => showState(card.event);
  box.append(el("section", { class: "panel oom-card", id: "oom" },
    el("h2", {}, `Out of memory at entry ${int(card.event)}`),
    el("dl", { class: "facts" }, fact("requested", bytes(card.requested)), fact("allocated", bytes(card.allocated)),
      fact("reserved", bytes(card.reserved)), fact("cached (reserved − allocated)", bytes(card.cached)),
      fact("largest free block (large pool)", bytes(card.largest_free.large)),
      fact("largest free block (small pool)", bytes(card.largest_free.small)),
      fact("device free", card.device_free === null ? "–" : bytes(card.device_free)),
      ...card.cache_releases.slice(-1).map((r) => fact("cache emptied before", `${r.segments} segments, ${fmtBytes(r.bytes)} at entries ${r.first}–${r.end - 1}`)),
      ...(card.meta ? [fact("metadata", card.meta)] : [])),
    el("p", {}, "Failing request from ", el("code", {}, card.site)),
    el("h2", {}, "Who held the memory"),
    table(["bytes", "share", "allocations", "call site"], card.holders.map((g) => [bytes(g.bytes), `${(g.share * 100).toFixed(1)}%`, int(g.count), g.site]), [0, 1, 2])));
}

async function showPeak() {
  const p = await api(`${base()}/peak?${skipQ()}`);
  view.peakEvent = p.event;
  if (view.skip === null) $("skip").placeholder = "site-packages/torch/, <frozen …";
  $("peak-note").textContent = `Peak of ${fmtBytes(p.peak_requested)} requested at entry ${int(p.event)}: ${int(p.live_allocations)} live allocations, grouped by their first frame outside the skipped files.`;
  clear($("peak-table")).append(table(["bytes", "share", "allocations", "call site"],
    p.by_call_site.map((g) => [bytes(g.bytes), `${(g.share * 100).toFixed(1)}%`, int(g.count), g.site]), [0, 1, 2]));
}

async function showState(k) {
  k = Math.max(0, Math.min(k, view.info.n_events));
  $("state-event").value = String(k);
  const s = await api(`${base()}/state?event=${k}&max_blocks=20000&${skipQ()}`);
  const t = s.totals;
  clear($("state-totals")).append(fact("after entry", int(s.event)), fact("segments", int(t.segments)),
    fact("reserved", bytes(t.reserved)), fact("allocated", bytes(t.allocated)), fact("requested", bytes(t.requested)),
    fact("reserved − allocated", bytes(t.cached)), fact("pending free", bytes(t.pending_free)),
    fact("largest free (large)", bytes(t.largest_free.large)), fact("largest free (small)", bytes(t.largest_free.small)),
    ...(s.next ? [fact("next entry", `${s.next.action} ${fmtBytes(s.next.size)}`)] : []));
  const by = { allocated: { x: [], y: [], base: [], text: [] }, pending_free: { x: [], y: [], base: [], text: [] }, free: { x: [], y: [], base: [], text: [] } };
  const labels = s.segments.map((g, i) => `${i}: ${g.pool} ${fmtBytes(g.size)}`);
  s.segments.forEach((g, i) => g.blocks.forEach((b) => {
    const bin = by[b.state] || by.free;
    bin.x.push(b.size); bin.base.push(b.offset); bin.y.push(labels[i]);
    bin.text.push(`${b.state} ${fmtBytes(b.size)} at +${fmtBytes(b.offset)}${b.site ? " · " + b.site : ""}${b.alloc !== null ? " · entry " + b.alloc : ""}`);
  }));
  const colors = { allocated: "#4c78a8", pending_free: "#f58518", free: "#54a24b" };
  const data = Object.entries(by).map(([state, v]) => ({ type: "bar", orientation: "h", name: state, x: v.x, y: v.y, base: v.base,
    marker: { color: colors[state], line: { width: 0.5, color: "#fff" } }, text: v.text, hoverinfo: "text", textposition: "none" }));
  const div = $("segments");
  const h = Math.min(Math.max(220, 16 * s.segments.length + 80), 2400);
  div.style.height = `${h}px`;
  await Plotly.react(div, data, { barmode: "overlay", margin: { l: 130, r: 20, t: 10, b: 40 }, xaxis: { title: "offset in segment (bytes)" },
    yaxis: { autorange: "reversed", type: "category", categoryorder: "array", categoryarray: labels, tickfont: { size: 9 } }, legend: { orientation: "h", y: -0.1 } }, { displaylogo: false, responsive: true });
  div.dataset.event = String(s.event);
  div.dataset.segments = String(s.segments.length);
  $("state-note").textContent = `Each row is a segment; blocks: allocated (blue), freed but waiting for its stream (orange), free/cached (green).${s.truncated ? " Only the first 20,000 blocks are drawn." : ""}`;
}

// ---------------------------------------------------------------------------------------- diff
async function diff(a, b) {
  $("diff").hidden = false;
  const d = await api(`/api/torch/diff?a=${enc(a)}&b=${enc(b)}`);
  $("title").textContent = `Diff: ${d.a.name} (A) → ${d.b.name} (B)`;
  clear($("facts")).append(fact("A peak requested", bytes(d.a.peak_requested)), fact("B peak requested", bytes(d.b.peak_requested)),
    fact("Δ requested", bytes(d.delta_requested)), fact("A peak reserved", bytes(d.a.peak_reserved)),
    fact("B peak reserved", bytes(d.b.peak_reserved)), fact("Δ reserved", bytes(d.reserved.delta_peak_reserved)));
  const p = d.decomposition, r = d.reserved;
  clear($("diff-parts")).append(
    el("p", { class: "sum-line", id: "delta-sum" }, `Δ peak requested ${fmtBytes(d.delta_requested)} = resized ${fmtBytes(p.resized.bytes)} (${int(p.resized.count)} allocations live at both peaks, ${int(p.resized.changed)} changed size) + live only at B's peak ${fmtBytes(p.only_b.bytes)} − live only at A's peak ${fmtBytes(p.only_a.bytes)}`),
    el("p", { class: "sum-line" }, `Δ peak reserved ${fmtBytes(r.delta_peak_reserved)} = Δ peak requested ${fmtBytes(r.delta_requested_peak)} + Δ(reserved − requested) ${fmtBytes(r.delta_peak_reserved - r.delta_requested_peak)}`));
  clear($("diff-sites")).append(table(["A bytes", "B bytes", "Δ", "A allocs", "B allocs", "call site"],
    d.by_call_site.map((s) => [bytes(s.a_bytes), bytes(s.b_bytes), el("span", { class: s.delta > 0 ? "pos" : s.delta < 0 ? "neg" : null }, bytes(s.delta)), int(s.a_count), int(s.b_count), s.site]), [0, 1, 2, 3, 4]));
  const al = d.alignment;
  $("align-note").textContent = `${int(al.paired)} allocations paired by stack and occurrence (${al.same_sequence ? "the same call-site sequence" : "first divergence at allocation " + int(al.first_divergence)}${al.in_order ? ", in order" : ""}); ${int(al.only_a)} only in A, ${int(al.only_b)} only in B; ${int(al.same_size)} same size, ${int(al.grew)} grew, ${int(al.shrank)} shrank${al.size_ratio && al.size_ratio.median !== null ? `; median size ratio B/A ${al.size_ratio.median.toFixed(2)}` : ""}.`;
  if (al.sequence) {
    await Plotly.react($("sequence"), [
      { x: al.sequence.index, y: al.sequence.a_bytes, name: `A ${d.a.name}`, type: "scatter", mode: "lines", line: { shape: "hv" } },
      { x: al.sequence.index, y: al.sequence.b_bytes, name: `B ${d.b.name}`, type: "scatter", mode: "lines", line: { shape: "hv" } }],
    { margin: { l: 70, r: 20, t: 10, b: 40 }, xaxis: { title: "aligned allocation (A's order)" }, yaxis: { title: "bytes per bucket" } }, { displaylogo: false, responsive: true });
    $("sequence").dataset.ready = "1";
  }
}

// ---------------------------------------------------------------------------------------- start
(async () => {
  try {
    if (params.get("a") && params.get("b")) await diff(params.get("a"), params.get("b"));
    else if (params.get("id")) await single(params.get("id"), Number(params.get("device") || 0));
    else await home();
    document.body.dataset.loaded = "1";
  } catch (err) { status(err.message, true); document.body.dataset.loaded = "error"; }
})();
