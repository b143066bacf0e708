// The what-if panel: a form of allocator settings, the real and the what-if run's numbers side by side, and
// their reserved memory over the trace's entries (two plots sharing one scale), with the OOM point marked.
// `mountWhatIf(container, {trace, device, settings, cap, run})` lets any page (the torch page too) embed it.
import { api, el, clear, bytesEl, fmtInt, showError } from "/static/common.js";

const FIELDS = [
  ["expandable_segments", "Expandable segments", "select", ["", "true", "false"], "as recorded / on / off"],
  ["max_split_size_mb", "max_split_size_mb", "text", null, "MiB, ≥ 20; 'none' for unlimited"],
  ["roundup_power2_divisions", "roundup_power2_divisions", "text", null, "one power of two, or 16 comma-separated"],
  ["garbage_collection_threshold", "garbage_collection_threshold", "text", null, "0..1 (acts under a cap only)"],
];

export function mountWhatIf(root, opts = {}) {
  const preset = Object.fromEntries((opts.settings || []).map((s) => s.split("=")).filter((p) => p.length === 2));
  const input = (name, label, type, choices, hint) => {
    const id = `wi-${name}`;
    const ctl = type === "select"
      ? el("select", { id, name }, ...choices.map((c) => el("option", { value: c, selected: preset[name] === c || null },
        c === "" ? "as recorded" : c)))
      : el("input", { id, name, type: "text", value: preset[name] || "", placeholder: "as recorded" });
    return el("div", {}, el("label", { for: id }, label), ctl, el("div", { class: "hint" }, hint));
  };
  const form = el("form", { class: "panel", id: "whatif-form", novalidate: true },
    el("div", { class: "form-grid" },
      el("div", {}, el("label", { for: "wi-trace" }, "Trace id"),
        el("input", { id: "wi-trace", name: "trace", value: opts.trace || "", required: true, pattern: "[0-9a-f]{8}" })),
      el("div", {}, el("label", { for: "wi-device" }, "Device"),
        el("input", { id: "wi-device", name: "device", type: "number", min: 0, value: opts.device || 0 })),
      ...FIELDS.map((f) => input(...f)),
      el("div", {}, el("label", { for: "wi-cap" }, "Memory cap"),
        el("input", { id: "wi-cap", name: "cap", value: opts.cap || "", placeholder: "as recorded, e.g. 6GiB" }),
        el("div", { class: "hint" }, "a size, or a fraction of the GPU: fraction:0.5 or 50%"))),
    el("div", { class: "toolbar", style: "margin-top:16px" },
      el("button", { type: "submit", id: "wi-run" }, "Run what-if"),
      el("span", { class: "status", id: "wi-status", role: "status", "aria-live": "polite" })));
  const result = el("section", { class: "panel", id: "whatif-result", hidden: true });
  clear(root).append(form, result);
  form.addEventListener("submit", (ev) => { ev.preventDefault(); run(form, result); });
  if (opts.run && opts.trace) run(form, result);
}

function query(form) {
  const f = new FormData(form);
  const q = new URLSearchParams();
  for (const [name] of FIELDS) {
    const v = String(f.get(name) || "").trim();
    if (v) q.append("set", `${name}=${v}`);
  }
  const cap = String(f.get("cap") || "").trim();
  if (cap) q.set("cap", cap);
  q.set("points", "600");
  return { trace: String(f.get("trace") || "").trim(), device: Number(f.get("device") || 0), q };
}

async function run(form, result) {
  const status = form.querySelector("#wi-status");
  const { trace, device, q } = query(form);
  if (!/^[0-9a-f]{8}$/.test(trace)) { status.className = "status error"; status.textContent = "a trace id is 8 hex digits"; return; }
  status.className = "status"; status.textContent = "replaying…";
  try {
    const out = await api(`/api/torch/traces/${trace}/devices/${device}/whatif?${q}`);
    status.textContent = "";
    render(result, out);
  } catch (err) {
    status.textContent = "";
    result.hidden = false;
    showError(result, err);
  }
}

function oomText(o) { return o ? `entry ${fmtInt(o.event)} (${(o.size / 2 ** 20).toFixed(1)} MiB)` : "none"; }

function render(result, out) {
  const { real, whatif } = out;
  const pad = "padding:3px 14px;text-align:right";
  const row = (label, a, b) => el("tr", {}, el("th", { scope: "row", style: "text-align:left;padding:3px 14px 3px 0" }, label),
    el("td", { style: pad }, a), el("td", { style: pad }, b));
  const table = el("table", { class: "whatif-table", style: "border-collapse:collapse;margin:8px 0" },
    el("thead", {}, el("tr", {}, el("th", {}, ""), el("th", { style: pad }, "real"), el("th", { style: pad }, "what-if"))),
    el("tbody", {},
      row("peak reserved", bytesEl(real.peak_reserved), bytesEl(whatif.peak_reserved)),
      row("peak allocated", bytesEl(real.peak_allocated), bytesEl(whatif.peak_allocated)),
      row("fragmentation at peak", bytesEl(real.fragmentation_at_peak), bytesEl(whatif.fragmentation_at_peak)),
      row("OOM", oomText(real.oom), oomText(whatif.oom))));
  const check = real.consistent
    ? el("p", { class: "ok", id: "wi-consistent" }, "The model replays the recorded run consistently: every segment and address matches.")
    : el("p", { class: "error", id: "wi-consistent" },
      `The model departs from the recorded run at entry ${real.mismatch ? fmtInt(real.mismatch.event) : "?"}; what-if numbers are approximate.`);
  const notes = [];
  if (whatif.stopped_at !== null && whatif.stopped_at !== undefined)
    notes.push(el("p", { class: "error" }, `The what-if run fails at entry ${fmtInt(whatif.stopped_at)}: the program would have stopped there.`));
  if (whatif.avoided_ooms && whatif.avoided_ooms.length)
    notes.push(el("p", {}, `The what-if run survives the recorded OOM at entry ${fmtInt(whatif.avoided_ooms[0])}.`));
  const plots = el("div", { class: "whatif-plots", style: "display:grid;grid-template-columns:1fr 1fr;gap:12px" },
    el("div", { id: "wi-plot-real", style: "height:320px" }), el("div", { id: "wi-plot-whatif", style: "height:320px" }));
  clear(result).append(check, table, ...notes, plots);
  result.hidden = false;
  const s = out.series;
  const ymax = Math.max(...s.real_reserved, ...s.whatif_reserved, 1) * 1.05;
  const xmax = s.n_events;                                       // one entry axis for both: compare at a glance
  plot("wi-plot-real", "real", s.event, s.real_reserved, s.real_allocated, real.oom, ymax, xmax, null);
  plot("wi-plot-whatif", "what-if", s.event, s.whatif_reserved, s.whatif_allocated, whatif.oom, ymax, xmax,
    s.whatif_stopped_at);
}

function plot(id, title, x, reserved, allocated, oom, ymax, xmax, stoppedAt) {
  if (typeof Plotly === "undefined") return;
  const gib = (a) => a.map((v) => v / 2 ** 30);
  let xr = x, rr = reserved, ar = allocated;
  if (stoppedAt !== null && stoppedAt !== undefined) {       // nothing is known past the failing request
    const k = x.findIndex((e) => e > stoppedAt);
    if (k > 0) { xr = x.slice(0, k); rr = reserved.slice(0, k); ar = allocated.slice(0, k); }
  }
  const traces = [
    { x: xr, y: gib(rr), name: "reserved", type: "scatter", mode: "lines", line: { shape: "hv", width: 1.5 }, fill: "tozeroy" },
    { x: xr, y: gib(ar), name: "allocated", type: "scatter", mode: "lines", line: { shape: "hv", width: 1, dash: "dot" } },
  ];
  if (oom) {
    const k = Math.max(0, x.findIndex((e) => e > oom.event) - 1);
    traces.push({ x: [oom.event], y: [rr.length ? rr[Math.min(k, rr.length - 1)] / 2 ** 30 : 0], name: "OOM",
      mode: "markers", marker: { symbol: "x", size: 12, color: "#c0392b" }, type: "scatter" });
  }
  Plotly.react(id, traces, {
    title: { text: title, font: { size: 14 } }, margin: { l: 50, r: 10, t: 30, b: 40 },
    xaxis: { title: { text: "trace entry" }, range: [0, xmax] }, yaxis: { title: { text: "GiB" }, range: [0, ymax / 2 ** 30] },
    legend: { orientation: "h", y: -0.2 }, showlegend: true,
  }, { displaylogo: false, responsive: true });
}
