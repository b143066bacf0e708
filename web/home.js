// Home: the stored traces, and upload by drag and drop or file picker with progress.
import { api, el, clear, bytesEl, fmtInt, topNav, showError, enc } from "/static/common.js";

topNav("home");
const listBox = document.getElementById("traces");
const filter = document.getElementById("filter");
let traces = [];

function maxSize(t) {
  const sizes = (t.graphs || []).map((g) => g.max_size).filter((v) => v !== null && v !== undefined);
  return sizes.length ? Math.max(...sizes) : null;
}

function oomGraphs(t) { return (t.graphs || []).filter((g) => g.oom); }

function traceRow(t) {
  const graphs = t.graphs || [];
  const ooms = oomGraphs(t);
  const status = ooms.length
    ? el("span", { class: "badge oom", title: ooms.map((g) => `graph ${g.index}: needed ${g.oom.needed} B, largest ${g.oom.largest_available} B`).join("\n") },
      `OOM in graph ${ooms.map((g) => g.index).join(", ")}`)
    : el("span", { class: "badge ok" }, "fits");
  const cut = graphs.filter((g) => g.complete === false);
  const status2 = cut.length
    ? el("span", { class: "badge oom incomplete", title: "the log ends inside this graph walk" },
      `incomplete graph ${cut.map((g) => g.index).join(", ")}`)
    : null;
  const links = el("td", {}, el("a", { href: `/traces/${enc(t.id)}`, class: "open-trace" }, "trace"));
  if (graphs.length >= 2) {
    const a = graphs[0].index ?? 0, b = graphs[1].index ?? 1;
    links.append(" · ", el("a", { href: `/diff?a=${enc(`${t.id}:${a}`)}&b=${enc(`${t.id}:${b}`)}`, class: "open-diff" }, `diff ${a} vs ${b}`));
  }
  const del = el("button", { class: "danger", title: "Delete this trace", "aria-label": `Delete ${t.name}` }, "delete");
  del.addEventListener("click", async () => {
    if (!confirm(`Delete trace "${t.name}"?`)) return;
    try { await api(`/api/traces/${enc(t.id)}`, { method: "DELETE" }); await load(); } catch (e) { alert(e.message); }
  });
  return el("tr", { dataset: { id: t.id } },
    el("td", {}, el("a", { href: `/traces/${enc(t.id)}`, class: "tensor trace-name" }, t.name ?? t.id),
      el("div", { class: "hint" }, t.source ?? "")),
    el("td", {}, el("code", {}, t.generation ?? "–")),
    el("td", { class: "num" }, fmtInt(graphs.length),
      el("div", { class: "hint" }, graphs.map((g) => g.role).filter(Boolean).join(", "))),
    el("td", { class: "num" }, bytesEl(maxSize(t))),
    el("td", {}, status, status2 ? " " : null, status2),
    el("td", { class: "hint" }, t.created ? new Date(t.created).toLocaleString() : "–"),
    links,
    el("td", {}, del));
}

function render() {
  const q = filter.value.trim().toLowerCase();
  const shown = traces.filter((t) => !q || String(t.name ?? "").toLowerCase().includes(q));
  clear(listBox);
  if (!traces.length) { listBox.append(el("p", { class: "empty" }, "No traces yet. Upload a ggml log above, or run a replay.")); return; }
  const head = el("tr", {}, ...["Name", "Generation", "Graphs", "Max size", "Status", "Created", "Open", ""].map((h, i) =>
    el("th", { class: i === 2 || i === 3 ? "num" : null }, h)));
  listBox.append(el("table", { class: "data", id: "trace-table" }, el("thead", {}, head), el("tbody", {}, shown.map(traceRow))));
}

async function load() {
  try {
    const body = await api("/api/traces");
    traces = (body && (body.traces || body.items)) || (Array.isArray(body) ? body : []);
    render();
  } catch (e) { showError(listBox, e); }
}
filter.addEventListener("input", render);

// --- upload ------------------------------------------------------------------------
const drop = document.getElementById("drop");
const picker = document.getElementById("file");
const bar = document.getElementById("upload-progress");
const status = document.getElementById("upload-status");
const nameInput = document.getElementById("upload-name");

function upload(file) {
  const form = new FormData();
  form.append("file", file, file.name);
  if (nameInput.value.trim()) form.append("name", nameInput.value.trim());
  const xhr = new XMLHttpRequest();
  xhr.open("POST", "/api/traces");
  xhr.setRequestHeader("Accept", "application/json");
  bar.hidden = false; bar.value = 0;
  status.className = "status"; status.textContent = `Uploading ${file.name}…`;
  xhr.upload.addEventListener("progress", (e) => {
    if (e.lengthComputable) bar.value = Math.round((100 * e.loaded) / e.total);
  });
  xhr.addEventListener("load", () => {
    let body = null;
    try { body = JSON.parse(xhr.responseText); } catch (_) { /* not JSON */ }
    if (xhr.status >= 200 && xhr.status < 300) {
      bar.value = 100;
      const added = (body && body.traces) || [];
      status.textContent = `Stored ${added.length || 1} trace${added.length > 1 ? "s" : ""} from ${file.name}.`;
      nameInput.value = "";
      load();
    } else {
      status.className = "status error";
      status.textContent = `Upload refused: ${(body && body.detail) ? (typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail)) : xhr.status}`;
    }
  });
  xhr.addEventListener("error", () => { status.className = "status error"; status.textContent = "Upload failed: the server could not be reached."; });
  xhr.send(form);
}

picker.addEventListener("change", () => { if (picker.files.length) upload(picker.files[0]); picker.value = ""; });
drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (e) => {
  e.preventDefault(); drop.classList.remove("over");
  for (const f of e.dataTransfer.files) upload(f);
});
drop.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); picker.click(); } });

load();
