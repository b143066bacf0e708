// The what-if panel: caching-allocator settings (a few presets, or any), the real and the what-if run's numbers
// side by side, and their reserved memory over the trace's entries (two plots on one scale, the OOM marked).
// `mountWhatIf(root, {trace, device, settings, cap, run})` draws it into `root`; the PyTorch page embeds it for
// the snapshot it shows, and /whatif is the same panel on its own page (`whatIfPage()`).
import { torchWhatIf } from "./api.js";
import { el, clear, exactEl, fmtInt, fmtBytes, showError, plotConfig, plotTheme, loading, loaded, topNav, urlParam,
  plotlyReady } from "./common.js";
import { byteTicks } from "./memmap.js";

const FIELDS = [
  ["expandable_segments", "Expandable segments", "select", ["", "true", "false"], "as recorded / on / off"],
  ["max_split_size_mb", "max_split_size_mb", "text", null, "MiB, ≥ 20; 'none' for unlimited"],
  ["roundup_power2_divisions", "roundup_power2_divisions", "text", null, "one power of two, or 16 comma-separated"],
  ["garbage_collection_threshold", "garbage_collection_threshold", "text", null, "0..1 (acts under a cap only)"],
];

/** Settings worth a first look: the advice PyTorch's OOM message gives, and the usual fragmentation knobs. */
export const PRESETS = [
  { key: "expandable", text: "Expandable segments", settings: ["expandable_segments=true"] },
  { key: "maxsplit", text: "max_split_size_mb=128", settings: ["max_split_size_mb=128"] },
  { key: "roundup", text: "roundup_power2_divisions=4", settings: ["roundup_power2_divisions=4"] },
  { key: "recorded", text: "As recorded", settings: [] },
];

const pairs = (settings) => Object.fromEntries((settings || []).map((s) => s.split("=")).filter((p) => p.length === 2));

/** Draw the panel into `root`; `fixed` hides the trace and device inputs (the embedding page names them). */
export function mountWhatIf(root, opts = {}) {
  const preset = pairs(opts.settings);
  const input = (name, label, type, choices, hint) => {
    const id = `wi-${name}`;
    const ctl = type === "select"
      ? el("select", { id, name }, ...choices.map((c) => el("option", { value: c, selected: preset[name] === c || null },
        c === "" ? "as recorded" : c)))
      : el("input", { id, name, type: "text", value: preset[name] || "", placeholder: "as recorded" });
    return el("div", {}, el("label", { for: id }, label), ctl, el("div", { class: "hint" }, hint));
  };
  const where = opts.fixed ? [] : [
    el("div", {}, el("label", { for: "wi-trace" }, "Trace id"),
      el("input", { id: "wi-trace", name: "trace", value: opts.trace || "", required: true, pattern: "[0-9a-f]{8}" })),
    el("div", {}, el("label", { for: "wi-device" }, "Device"),
      el("input", { id: "wi-device", name: "device", type: "number", min: 0, value: opts.device || 0 }))];
  const form = el("form", { id: "whatif-form", novalidate: true },
    el("div", { class: "toolbar", id: "wi-presets" }, el("span", { class: "hint" }, "Presets:"),
      ...PRESETS.map((p) => el("button", { type: "button", class: "secondary", "data-preset": p.key }, p.text))),
    el("div", { class: "form-grid" }, ...where, ...FIELDS.map((f) => input(...f)),
      el("div", {}, el("label", { for: "wi-cap" }, "Memory cap"),
        el("input", { id: "wi-cap", name: "cap", value: opts.cap || "", placeholder: "as recorded, e.g. 6GiB" }),
        el("div", { class: "hint" }, "a size, or a fraction of the GPU: fraction:0.5 or 50%"))),
    el("div", { class: "toolbar", style: "margin-top:16px" },
      el("button", { type: "submit", id: "wi-run" }, "Run what-if"),
      el("a", { id: "wi-link", href: "#" }, "link to these settings"),
      el("span", { class: "status", id: "wi-status", role: "status", "aria-live": "polite" })));
  const result = el("div", { id: "whatif-result", hidden: true });
  clear(root).append(form, result);
  const target = () => opts.fixed ? { trace: opts.trace, device: opts.device || 0 }
    : { trace: String(form.elements.trace.value).trim(), device: Number(form.elements.device.value || 0) };
  const go = () => run(form, result, target());
  form.addEventListener("submit", (ev) => { ev.preventDefault(); go(); });
  form.addEventListener("input", () => { form.querySelector("#wi-link").href = pageUrl(target(), query(form)); });
  form.querySelector("#wi-link").href = pageUrl(target(), query(form));
  for (const p of PRESETS) {
    form.querySelector(`[data-preset="${p.key}"]`).addEventListener("click", () => {
      const chosen = pairs(p.settings);
      for (const [name] of FIELDS) form.elements[name].value = chosen[name] || "";
      form.querySelector("#wi-link").href = pageUrl(target(), query(form));
      go();
    });
  }
  if (opts.run && opts.trace) go();
}

/** The form's settings and cap as the API takes them. */
function query(form) {
  const settings = [];
  for (const [name] of FIELDS) {
    const v = String(form.elements[name].value || "").trim();
    if (v) settings.push(`${name}=${v}`);
  }
  return { settings, cap: String(form.elements.cap.value || "").trim() };
}

function pageUrl({ trace, device }, { settings, cap }) {
  const q = new URLSearchParams({ trace: trace || "", device: String(device || 0) });
  for (const s of settings) q.append("set", s);
  if (cap) q.set("cap", cap);
  return `/whatif?${q}`;
}

async function run(form, result, { trace, device }) {
  const status = form.querySelector("#wi-status");
  if (!/^[0-9a-f]{8}$/.test(trace || "")) { status.className = "status error"; status.textContent = "a trace id is 8 hex digits"; return; }
  status.className = "status";
  status.textContent = "";
  result.hidden = false;
  delete result.dataset.ready;
  loading(result, "Replaying the trace twice (as recorded, then with these settings)…");
  try {
    render(result, await torchWhatIf(trace, device, { ...query(form), points: 600 }));
  } catch (err) {
    showError(result, err);
  } finally {
    loaded(result);
  }
}

const oomText = (o) => o ? `entry ${fmtInt(o.event)} (${fmtBytes(o.size)} requested)` : "none";

function render(result, out) {
  const { real, whatif } = out;
  const row = (key, label, a, b) => el("tr", { "data-row": key }, el("th", { scope: "row" }, label),
    el("td", { class: "num" }, a), el("td", { class: "num" }, b));
  const table = el("table", { class: "data whatif-table" },
    el("thead", {}, el("tr", {}, el("th", {}, ""), el("th", { class: "num" }, "real"), el("th", { class: "num" }, "what-if"))),
    el("tbody", {},
      row("peak_reserved", "peak reserved", exactEl(real.peak_reserved), exactEl(whatif.peak_reserved)),
      row("peak_allocated", "peak allocated", exactEl(real.peak_allocated), exactEl(whatif.peak_allocated)),
      row("fragmentation_at_peak", "fragmentation at peak", exactEl(real.fragmentation_at_peak),
        exactEl(whatif.fragmentation_at_peak)),
      row("oom", "OOM", oomText(real.oom), oomText(whatif.oom))));
  const check = real.consistent
    ? el("p", { class: "ok", id: "wi-consistent" }, "The model replays the recorded run consistently: every segment and address matches.")
    : el("p", { class: "error", id: "wi-consistent" },
      `The model departs from the recorded run at entry ${real.mismatch ? fmtInt(real.mismatch.event) : "?"}; what-if numbers are approximate.`);
  const notes = [];
  if (whatif.stopped_at !== null && whatif.stopped_at !== undefined)
    notes.push(el("p", { class: "error" }, `The what-if run fails at entry ${fmtInt(whatif.stopped_at)}: the program would have stopped there.`));
  if (whatif.avoided_ooms && whatif.avoided_ooms.length)
    notes.push(el("p", {}, `The what-if run survives the recorded OOM at entry ${fmtInt(whatif.avoided_ooms[0])} (what the program did after it is not in the trace).`));
  const plots = el("div", { class: "whatif-plots", style: "display:grid;grid-template-columns:1fr 1fr;gap:12px" },
    el("div", { id: "wi-plot-real", class: "chart", style: "height:320px" }),
    el("div", { id: "wi-plot-whatif", class: "chart", style: "height:320px" }));
  clear(result).append(check, table, ...notes, plots);
  const s = out.series;
  const top = [s.real_reserved, s.whatif_reserved].reduce((m, a) => a.reduce((x, y) => Math.max(x, y || 0), m), 1) * 1.05;
  const theme = plotTheme();
  Promise.all([
    plot(plots.children[0], "real", s, s.real_reserved, s.real_allocated, real.oom, top, null, theme),
    plot(plots.children[1], "what-if", s, s.whatif_reserved, s.whatif_allocated, whatif.oom, top, s.whatif_stopped_at, theme),
  ]).then(() => { result.dataset.ready = "1"; });
}

/** One run's reserved and allocated bytes over the entries; both plots share the axes to compare at a glance. */
async function plot(div, title, s, reserved, allocated, oom, top, stoppedAt, theme) {
  let x = s.event, rr = reserved, ar = allocated;
  if (stoppedAt !== null && stoppedAt !== undefined) {       // nothing is known past the failing request
    const k = x.findIndex((e) => e > stoppedAt);
    if (k > 0) { x = x.slice(0, k); rr = rr.slice(0, k); ar = ar.slice(0, k); }
  }
  const traces = [
    { x, y: rr, name: "reserved", type: "scatter", mode: "lines", line: { shape: "hv", width: 1.5, color: theme.accent }, fill: "tozeroy" },
    { x, y: ar, name: "allocated", type: "scatter", mode: "lines", line: { shape: "hv", width: 1, dash: "dot", color: theme.warn } },
  ];
  if (oom) {
    const k = Math.max(0, x.findIndex((e) => e > oom.event) - 1);
    traces.push({ x: [oom.event], y: [rr.length ? rr[Math.min(k, rr.length - 1)] : 0], name: "OOM", type: "scatter",
      mode: "markers", marker: { symbol: "x", size: 12, color: theme.bad } });
  }
  const axis = { gridcolor: theme.grid, zeroline: false, color: theme.muted };
  const ticks = byteTicks(0, top, 6);
  return (await plotlyReady()).react(div, traces, {
    paper_bgcolor: theme.paper, plot_bgcolor: theme.plot, font: { family: "system-ui, sans-serif", size: 12, color: theme.ink },
    title: { text: title, font: { size: 14 } }, margin: { l: 70, r: 10, t: 30, b: 40 },
    xaxis: { ...axis, title: { text: "trace entry" }, range: [0, s.n_events], tickformat: ",d" },
    yaxis: { ...axis, range: [0, top], tickvals: ticks.tickvals, ticktext: ticks.ticktext },
    legend: { orientation: "h", y: -0.2 }, showlegend: true,
  }, plotConfig());
}

/** The /whatif page: the panel for ?trace=ID&device=D&set=K=V&cap=C, run at once when a trace is named. */
export function whatIfPage() {
  topNav("torch");
  const q = new URLSearchParams(location.search);
  const trace = urlParam("trace") || "";
  if (trace) document.getElementById("back").href = `/torch?id=${encodeURIComponent(trace)}`;
  mountWhatIf(document.getElementById("whatif"), {
    trace, device: Number(urlParam("device") || 0), settings: q.getAll("set"), cap: urlParam("cap") || "",
    run: Boolean(trace),
  });
}
