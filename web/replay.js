// Replay view: pick a preset, profile and sizes, run the replay, land in the diff of measure vs eval.
// The defaults reproduce llama.cpp PR #2627's failure: llama2-70b, ggml-2023-08-16, Metal's order.
import { presets as getPresets, replay } from "./api.js";
import { $, el, clear, exactEl, topNav, enc, urlParam } from "./common.js";

topNav("replay");
const DEFAULTS = { preset: "llama2-70b", profile: "ggml-2023-08-16", metal: "true" };
const NUMBERS = [  // [field, label, smallest allowed, required]
  ["n_ctx", "Context (n_ctx)", 1, true], ["n_batch", "Batch (n_batch)", 1, true],
  ["eval_tokens", "Eval tokens", 1, false], ["n_past", "n_past", 0, false]];

function fill(select, items, preferred) {
  clear(select);
  for (const it of items) select.append(el("option", { value: it.name }, it.description ? `${it.name} — ${it.description}` : it.name));
  if (preferred && [...select.options].some((o) => o.value === preferred)) select.value = preferred;
}

async function init() {
  $("replay-status").textContent = "Loading presets…";
  try {
    const p = await getPresets();
    fill($("preset"), p.presets, urlParam("preset") || DEFAULTS.preset);
    const byName = new Map(p.presets.map((x) => [x.name, x]));
    const sizes = () => {  // a preset's own context and batch, as its program used them
      const pr = byName.get($("preset").value);
      if (pr) { $("n_ctx").value = pr.n_ctx; $("n_batch").value = pr.n_batch; }
    };
    $("preset").addEventListener("change", sizes);
    sizes();
    fill($("profile"), p.profiles.map((name) => ({ name })), urlParam("profile") || DEFAULTS.profile);
    $("replay-status").textContent = "";
  } catch (e) {
    $("replay-status").className = "status error";
    $("replay-status").textContent = `Presets unavailable: ${e.message}`;
  }
  $("metal").value = urlParam("metal_concurrency") || DEFAULTS.metal;
  for (const [k] of NUMBERS) if (urlParam(k)) $(k).value = urlParam(k);
}

/** The request, or the first invalid field named in words (and focused). */
function readForm() {
  const req = { preset: $("preset").value, profile: $("profile").value, metal_concurrency: $("metal").value === "true" };
  for (const f of document.querySelectorAll("[aria-invalid]")) f.removeAttribute("aria-invalid");
  for (const [k, label, min, required] of NUMBERS) {
    const text = $(k).value.trim();
    if (text === "" && !required) continue;
    const v = Number(text);
    if (text === "" || !Number.isInteger(v) || v < min) {
      $(k).setAttribute("aria-invalid", "true");
      $(k).focus();
      return { error: `${label}: ${text === "" ? "required" : `must be a whole number ≥ ${min}, not “${text}”`}` };
    }
    req[k] = v;
  }
  if (!req.preset) return { error: "Model preset: choose one" };
  if (!req.profile) return { error: "Allocator generation: choose one" };
  return { req };
}

$("replay-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const status = $("replay-status");
  const { req, error } = readForm();
  if (error) { status.className = "status error"; status.textContent = error; return; }
  status.className = "status"; status.textContent = "Running the replay…";
  $("run").disabled = true;
  try {
    const r = await replay(req);
    const target = `/diff?a=${enc(`${r.traceId}:0`)}&b=${enc(`${r.traceId}:1`)}`;
    const res = clear($("result"));
    res.hidden = false;
    res.append(el("h2", {}, r.reused ? "Replay already stored" : "Replay stored"),
      el("dl", { class: "facts" },
        el("div", {}, el("dt", {}, "measure max_size"), el("dd", {}, exactEl(r.measure.max_size))),
        el("div", {}, el("dt", {}, "compute buffer"), el("dd", {}, exactEl(r.measure.compute_buffer_total))),
        el("div", {}, el("dt", {}, "eval max_size"), el("dd", {}, exactEl(r.eval.max_size))),
        el("div", {}, el("dt", {}, "eval"), el("dd", {}, r.eval.oom ? el("span", { class: "badge oom" }, "out of space") : el("span", { class: "badge ok" }, "fits")))),
      r.firstDivergence && r.firstDivergence.words ? el("p", {}, r.firstDivergence.words) : null,
      el("p", {}, el("a", { href: target, id: "to-diff" }, "Open the diff of measure vs eval →")));
    status.textContent = r.reused ? "Done (an identical replay was stored before; opening it)." : "Done.";
    location.assign(target);
  } catch (e) {
    status.className = "status error"; status.textContent = `Replay failed: ${e.message}`;
  } finally { $("run").disabled = false; }
});

init();
