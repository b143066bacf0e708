// Home: the stored traces, and upload by drag and drop (anywhere on the page) or file picker with progress.
import { listTraces, deleteTrace, uploadTrace } from "./api.js";
import { $, el, clear, bytesEl, fmtInt, topNav, showError, enc, loading, loaded, exactBytes, words } from "./common.js";
import { traceConsistency } from "./consistency.js";

topNav("home", { onStored: (stored) => { $("upload-status").textContent = storedText(stored); $("upload-name").value = ""; load(); },
  uploadName: () => $("upload-name").value.trim() || null });
const listBox = $("traces");
const filter = $("filter");
const tagFilter = $("tag-filter");
let traces = [];
let picked = [];  // the ids ticked to diff, in the order they were ticked (a, then b)

function maxSize(t) {
  const sizes = t.graphs.map((g) => g.max_size).filter((v) => v !== null && v !== undefined);
  return sizes.length ? Math.max(...sizes) : null;
}

/** "1 measure, 301 eval": how many graphs of each role (a long run lists 302 graphs in one short line). */
function roleCounts(graphs) {
  const n = new Map();
  for (const g of graphs) if (g.role) n.set(g.role, (n.get(g.role) || 0) + 1);
  return [...n].map(([role, k]) => `${fmtInt(k)} ${role}`).join(", ");
}

/** "OOM in graph 1" linking to that graph (the trace view opens at the failing event). */
function statusBadge(t) {
  const ooms = t.graphs.filter((g) => g.oom);
  if (!ooms.length) return el("span", { class: "badge ok" }, "fits");
  const more = ooms.length > 3 ? el("span", { class: "hint" }, ` and ${fmtInt(ooms.length - 3)} more`) : null;
  return el("span", { class: "oom-badges" }, ooms.slice(0, 3).map((g, k) => [k ? " " : null,
    el("a", { href: `/traces/${enc(t.id)}?g=${g.index}`, class: "badge oom",
      title: `graph ${g.index}: ${g.oom.tensor || "a tensor"} needed ${exactBytes(g.oom.needed)}, largest free block ${exactBytes(g.oom.largest)}` },
    `OOM in graph ${g.index}`)]), more);
}

/** The graph of `t` a diff starts from: its first failing graph, else graph 0 (the measure pass). */
const startGraph = (t) => (t.graphs.find((g) => g.oom) || t.graphs[0] || { index: 0 });

/** b's graph that pairs with a's: the same role, the same place among that role's graphs; else b's graph 0. */
function pairedGraph(ta, ga, tb) {
  const nth = ta.graphs.filter((g) => g.role === ga.role).indexOf(ga);
  return tb.graphs.filter((g) => g.role === ga.role)[Math.max(0, nth)] || tb.graphs[0] || { index: 0 };
}

/** The diff page's address for graph (or device) ga of trace a and gb of trace b. */
const diffHref = (ta, ga, tb, gb) => `/diff?a=${enc(`${ta.id}:${ga}`)}&b=${enc(`${tb.id}:${gb}`)}`;

let pairing = null;  // {key, a, b}: the graphs paired for the ticked two; the user may change either

/** A graph picker for one side of the pairing. */
function graphSelect(id, t, chosen, onChange) {
  const sel = el("select", { id, "aria-label": `graph of ${t.name}` }, t.graphs.slice(0, 500).map((g) =>
    el("option", { value: String(g.index) }, `graph ${g.index}${g.role ? ` · ${g.role}` : ""}${g.oom ? " · OOM" : ""}`)));
  sel.value = String(chosen);
  sel.addEventListener("change", () => onChange(Number(sel.value)));
  return sel;
}

function showPicked() {
  const [a, b] = picked.map((id) => traces.find((t) => t.id === id));
  const link = $("diff-selected"), status = clear($("pick-status"));
  link.hidden = !(a && b);
  for (const box of listBox.querySelectorAll("input.pick")) box.checked = picked.includes(box.dataset.id);
  if (!(a && b)) {
    pairing = null;
    status.append(a ? `a: ${a.name}; tick a second trace to diff against it` : "Tick two traces to diff them.");
    return;
  }
  const key = `${a.id} ${b.id}`;
  if (!pairing || pairing.key !== key) {
    const ga = startGraph(a);
    pairing = { key, a: ga.index, b: pairedGraph(a, ga, b).index };
  }
  const update = () => { link.href = diffHref(a, pairing.a, b, pairing.b); };
  status.append("a: ", el("strong", {}, a.name), " ", graphSelect("pair-a", a, pairing.a, (g) => { pairing.a = g; update(); }),
    " against b: ", el("strong", {}, b.name), " ", graphSelect("pair-b", b, pairing.b, (g) => { pairing.b = g; update(); }));
  update();
}

function pick(id, on) {
  picked = picked.filter((x) => x !== id);
  if (on) picked = [...picked, id].slice(-2);  // a third tick replaces the oldest
  showPicked();
}

function traceRow(t) {
  const graphs = t.graphs;
  const cut = graphs.filter((g) => g.complete === false);
  const incomplete = cut.length
    ? el("span", { class: "badge oom incomplete", title: "the log ends inside this graph walk" },
      `incomplete graph ${cut.map((g) => g.index).join(", ")}`)
    : null;
  const links = el("td", {}, el("a", { href: `/traces/${enc(t.id)}`, class: "open-trace" }, "trace"));
  if (graphs.length >= 2) {
    const a = graphs[0].index, b = graphs[1].index;
    links.append(" · ", el("a", { href: `/diff?a=${enc(`${t.id}:${a}`)}&b=${enc(`${t.id}:${b}`)}`, class: "open-diff" }, `diff ${a} vs ${b}`));
  }
  const result = (t.tags || []).find((g) => /^(sweep|plan)=[0-9a-f]{1,32}$/.test(g));
  if (result) links.append(" · ", el("a", { href: `/preflight?id=${enc(result.split("=")[1])}`, class: "open-preflight" }, "pre-flight"));
  const del = el("button", { class: "danger write-only", title: "Delete this trace", "aria-label": `Delete ${t.name}` }, "delete");
  del.addEventListener("click", async () => {
    if (!confirm(`Delete trace "${t.name}"?`)) return;
    try { await deleteTrace(t.id); await load(); } catch (e) { alert(e.message); }
  });
  const box = el("input", { type: "checkbox", class: "pick", dataset: { id: t.id }, "aria-label": `Pick ${t.name} to diff` });
  box.checked = picked.includes(t.id);
  box.addEventListener("change", () => pick(t.id, box.checked));
  return el("tr", { dataset: { id: t.id } },
    el("td", {}, box),
    el("td", { class: "wrap" }, el("a", { href: `/traces/${enc(t.id)}`, class: "tensor trace-name" }, words(t.name)),
      el("div", { class: "hint source", title: t.source ?? "" }, t.source ?? ""),
      (t.tags || []).length ? el("div", { class: "tags" }, t.tags.map((g) => el("span", { class: "badge tag" }, g))) : null),
    el("td", {}, el("code", {}, t.generation ?? "–")),
    el("td", { class: "num graphs" }, fmtInt(graphs.length), el("div", { class: "hint" }, roleCounts(graphs))),
    el("td", { class: "num" }, bytesEl(maxSize(t))),
    el("td", { class: "consistency" }, traceConsistency(t, (g) => `/traces/${enc(t.id)}?g=${g.index}`)),
    el("td", {}, statusBadge(t), incomplete ? " " : null, incomplete),
    el("td", { class: "hint" }, t.created ? new Date(t.created).toLocaleString() : "–"),
    links,
    el("td", {}, del));
}

/** The tag choices: every key=value a stored trace carries. */
function fillTags() {
  const known = [...new Set(traces.flatMap((t) => t.tags || []))].sort();
  const keep = tagFilter.value;
  clear(tagFilter).append(el("option", { value: "" }, "every tag"), ...known.map((g) => el("option", { value: g }, g)));
  tagFilter.value = known.includes(keep) ? keep : "";
  tagFilter.hidden = !known.length;
}

function render() {
  const q = filter.value.trim().toLowerCase(), tag = tagFilter.value;
  const shown = traces.filter((t) => (!q || t.name.toLowerCase().includes(q) || t.id.startsWith(q)) &&
    (!tag || (t.tags || []).includes(tag)));
  picked = picked.filter((id) => traces.some((t) => t.id === id));
  clear(listBox);
  if (!traces.length) { listBox.append(el("p", { class: "empty" }, "No traces yet. Upload a ggml log above, or run a replay.")); return; }
  const head = el("tr", {}, el("th", {}, el("span", { class: "visually-hidden" }, "diff")), ...["Name", "Generation", "Graphs", "Max size", "Consistent", "Status", "Created", "Open", ""].map((h, i) =>
    el("th", { class: i === 2 || i === 3 ? "num" : null }, h)));
  listBox.append(el("div", { class: "table-wide" }, el("table", { class: "data", id: "trace-table" }, el("thead", {}, head), el("tbody", {}, shown.map(traceRow)))));
  showPicked();
}

async function load() {
  if (!traces.length) loading(listBox, "Loading traces…");
  try { traces = await listTraces(); fillTags(); render(); } catch (e) { showError(listBox, e); } finally { loaded(listBox); }
}
filter.addEventListener("input", render);
tagFilter.addEventListener("change", render);

// --- upload with the page's own drop zone and picker --------------------------------------------------
const drop = $("drop"), picker = $("file"), bar = $("upload-progress"), status = $("upload-status"), nameInput = $("upload-name");
const storedText = (added) => `Stored ${added.length || 1} trace${added.length > 1 ? "s" : ""}.`;

async function upload(file) {
  bar.hidden = false; bar.value = 0;
  status.className = "status"; status.textContent = `Uploading ${file.name}…`;
  try {
    const added = await uploadTrace(file, nameInput.value.trim() || null, (x) => { bar.value = Math.round(100 * x); });
    bar.value = 100;
    status.textContent = `${storedText(added).slice(0, -1)} from ${file.name}.`;
    nameInput.value = "";
    load();
  } catch (e) {
    bar.value = 0; bar.hidden = true;  // a refusal leaves no full bar beside it
    status.className = "status error";
    status.textContent = `Upload refused: ${e.message}`;
  }
}

picker.addEventListener("change", () => { if (picker.files.length) upload(picker.files[0]); picker.value = ""; });
drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (e) => {
  e.preventDefault(); e.stopPropagation(); drop.classList.remove("over");
  document.querySelector(".drop-overlay").hidden = true;
  for (const f of e.dataTransfer.files) upload(f);
});
drop.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); picker.click(); } });

load();
