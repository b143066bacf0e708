// Replay view: pick a preset, profile and sizes, run the replay, land in the diff of measure vs eval.
import { api, el, clear, bytesEl, topNav, enc, pick } from "/static/common.js";

topNav("replay");
const $ = (x) => document.getElementById(x);
const FALLBACK_PROFILES = ["ggml-2023-08-16", "ggml-2023-08-28", "ggml-head"];

function fill(select, items, preferred) {
  clear(select);
  for (const it of items) {
    const name = typeof it === "string" ? it : pick(it, "name", "id", "preset");
    if (!name) continue;
    const desc = typeof it === "object" ? pick(it, "description", "title") : null;
    select.append(el("option", { value: name }, desc ? `${name} — ${desc}` : name));
  }
  if (preferred && [...select.options].some((o) => o.value === preferred)) select.value = preferred;
}

async function init() {
  try {
    const p = await api("/api/presets");
    const presets = Array.isArray(p) ? p : (p.presets || []);
    fill($("preset"), presets, "llama2-70b");
    const byName = new Map(presets.filter((x) => typeof x === "object").map((x) => [x.name, x]));
    const sizes = () => {  // a preset's own context and batch, as its program used them
      const pr = byName.get($("preset").value);
      if (pr && pr.n_ctx) $("n_ctx").value = pr.n_ctx;
      if (pr && pr.n_batch) $("n_batch").value = pr.n_batch;
    };
    $("preset").addEventListener("change", sizes);
    sizes();
    fill($("profile"), (p.profiles && p.profiles.length ? p.profiles : FALLBACK_PROFILES), "ggml-2023-08-16");
  } catch (e) {
    $("replay-status").className = "status error";
    $("replay-status").textContent = `Presets unavailable: ${e.message}`;
    fill($("profile"), FALLBACK_PROFILES, "ggml-2023-08-16");
  }
  const q = new URLSearchParams(location.search);
  for (const k of ["preset", "profile", "n_ctx", "n_batch", "eval_tokens", "n_past"]) if (q.get(k)) $(k).value = q.get(k);
}

/** Where a replay answer keeps the trace id and graph indexes of its measure and eval runs. */
export function diffTarget(body) {
  const r = body.replay || body;
  const m = r.measure || {}, e = r.eval || {};
  const firstId = (body.traces && body.traces[0] && body.traces[0].id) || null;
  const mid = pick(m, "trace_id", "trace", "id") ?? r.trace_id ?? firstId;
  const eid = pick(e, "trace_id", "trace", "id") ?? mid;
  if (!mid) return null;
  const mg = pick(m, "graph", "graph_index") ?? 0;
  const eg = pick(e, "graph", "graph_index") ?? (eid === mid ? 1 : 0);
  return `/diff?a=${enc(`${mid}:${mg}`)}&b=${enc(`${eid}:${eg}`)}`;
}

$("replay-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const num = (id) => ($(id).value.trim() === "" ? null : Number($(id).value));
  const req = { preset: $("preset").value, profile: $("profile").value, n_ctx: num("n_ctx"), n_batch: num("n_batch"),
    eval_tokens: num("eval_tokens"), n_past: num("n_past"), metal_concurrency: $("metal").value === "true" };
  for (const k of ["eval_tokens", "n_past"]) if (req[k] === null) delete req[k];
  const status = $("replay-status");
  status.className = "status"; status.textContent = "Running the replay…";
  $("run").disabled = true;
  try {
    const body = await api("/api/replay", { json: req });
    const r = body.replay || body;
    const target = diffTarget(body);
    const res = clear($("result"));
    res.hidden = false;
    res.append(el("h2", {}, "Replay stored"),
      el("dl", { class: "facts" },
        el("div", {}, el("dt", {}, "measure max_size"), el("dd", {}, bytesEl(pick(r.measure || {}, "max_size")))),
        el("div", {}, el("dt", {}, "compute buffer"), el("dd", {}, bytesEl(pick(r.measure || {}, "compute_buffer_total")))),
        el("div", {}, el("dt", {}, "eval max_size"), el("dd", {}, bytesEl(pick(r.eval || {}, "max_size")))),
        el("div", {}, el("dt", {}, "eval"), el("dd", {}, (r.eval && r.eval.oom) ? el("span", { class: "badge oom" }, "out of space") : el("span", { class: "badge ok" }, "fits")))),
      r.first_divergence && r.first_divergence.words ? el("p", {}, r.first_divergence.words) : null,
      target ? el("p", {}, el("a", { href: target, id: "to-diff" }, "Open the diff of measure vs eval →")) : null);
    status.textContent = "Done.";
    if (target) location.assign(target);
  } catch (e) {
    status.className = "status error"; status.textContent = `Replay failed: ${e.message}`;
  } finally { $("run").disabled = false; }
});

init();
