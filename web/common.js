// Shared by every page: DOM building that never turns data into markup, units, the op palette, the page
// header and navigation, Plotly's config and theme, loading indicators, view state in the URL, and upload
// by dropping a file anywhere. API calls live in api.js.
import { access, uploadTrace } from "./api.js";
import { COLORS, fnv1a, opColors, familyColors } from "./palette.js";

/** Build an element; children that are strings become text nodes (never parsed as HTML). */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = String(v);
    else if (k === "title") node.title = String(v);
    else if (k.startsWith("on") && typeof v === "function") node.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(node.dataset, v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

export function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }
export const $ = (id) => document.getElementById(id);
export const enc = encodeURIComponent;

// --- units ----------------------------------------------------------------------------------------
const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
/** 12304 -> "12.02 KiB": binary prefix, two decimals (the CLI's fmt_bytes writes the same strings; tests/util/test_sizes.py
 *  checks both on one table). Rounded: use `bytesEl` or `exactBytes` wherever the difference matters. */
export function fmtBytes(n) {
  if (n === null || n === undefined || Number.isNaN(Number(n))) return "–";
  let v = Math.abs(Number(n)), u = 0;
  const neg = Number(n) < 0;
  while (v >= 1024 && u < UNITS.length - 1) { v /= 1024; u++; }
  return `${neg ? "-" : ""}${u === 0 ? String(Math.trunc(v)) : v.toFixed(2)} ${UNITS[u]}`;
}
export function fmtInt(n) { return n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"); }
/** 58720256 -> "58,720,256 B" */
export function exactBytes(n) { return n === null || n === undefined ? "–" : `${fmtInt(n)} B`; }
/** "56.0 MiB (58,720,256 B)": both, for headers and cards where exact values matter. */
export function bothBytes(n) {
  if (n === null || n === undefined) return "–";
  return Math.abs(n) < 1024 ? exactBytes(n) : `${fmtBytes(n)} (${exactBytes(n)})`;
}
/** A byte count as text with its exact value on hover. */
export function bytesEl(n, tag = "span") { return el(tag, { title: exactBytes(n), class: "bytes" }, fmtBytes(n)); }
/** A byte count written out in full: human size and exact bytes. */
export function exactEl(n, tag = "span") { return el(tag, { class: "bytes exact" }, bothBytes(n)); }
/** One entry of a `<dl class="facts">`: its label and its value(s). */
export function fact(label, ...value) { return el("div", {}, el("dt", {}, label), el("dd", {}, ...value)); }
/** 0.123 -> "12.3%" */
export const pct = (share) => `${(share * 100).toFixed(1)}%`;

/** Text that wraps only between words: each word is kept whole (names like ggml-2023-08-16 never split). */
export function words(text) {
  const parts = String(text ?? "").split(/(\s+)/);
  return parts.map((w) => (/^\s+$/.test(w) || w === "" ? w : w.length <= 24 ? el("span", { class: "word" }, w)
    : pieces(w).flatMap((p, k) => [k ? el("wbr") : null, el("span", { class: "word" }, p)])));
}

/** A word too long for a phone's line, cut after its punctuation (_ - . = / :), else every 24 characters. */
function pieces(word) {
  const out = [];
  for (const p of word.split(/(?<=[_\-.=/:,])/)) for (let i = 0; i < p.length; i += 24) out.push(p.slice(i, i + 24));
  return out;
}

/** A tensor's name for people: unnamed tensors (ggml allows "") get their op and offset instead. */
export function tensorLabel(name, op, offset) {
  if (name !== undefined && name !== null && String(name).trim() !== "") return String(name);
  const what = op && op !== "NONE" ? `${op} result` : "tensor";
  return offset !== undefined && offset !== null ? `(unnamed ${what} at ${fmtInt(offset)})` : `(unnamed ${what})`;
}

/** "ID:G" -> {id, g}; null when malformed. */
export function parseRef(ref) {
  if (!ref) return null;
  const i = String(ref).lastIndexOf(":");
  if (i <= 0) return null;
  const g = Number(ref.slice(i + 1));
  if (!Number.isInteger(g) || g < 0) return null;
  return { id: ref.slice(0, i), g };
}

// --- colours ---------------------------------------------------------------------------------------
// palette.js: one colour-blind-safe palette for every panel; an op or a family has the same colour on
// every page, and keys shown together never share one. Free memory is drawn hatched grey, a look no op has.
export const FREE_COLOR = "#8e96a3";
export const FREE_FILL = "rgba(142,150,163,0.18)";

/** The colour of an op, the same on every page, graph and trace. */
export function opColor(op) { return opColors.of(op); }
/** The colour of a tensor family (peak panel, size attribution). */
export function familyColor(family) { return familyColors.of(family); }
/** A colour from a tensor name's hash (logs that name no op: too many names to keep apart). */
export function nameColor(name) { return COLORS[fnv1a(String(name || "?")) % COLORS.length]; }
/** The colour of one allocation of a PyTorch trace, from the entry that made it (its identity in the trace):
 * the same in the timeline, the allocator state and the flamegraph, and across reloads. */
export function allocColor(entry) { return COLORS[fnv1a(`allocation ${entry}`) % COLORS.length]; }

// --- Plotly ------------------------------------------------------------------------------------------
let plotlyLoading = null;
/**
 * Plotly.js, loaded once: pages that draw a first picture without it (the trace view's map) name it in a
 * `<link rel="preload" as="script" id="plotly-js">`, so it downloads while the page starts, and run it
 * (about a second of main-thread work) only once that picture is on screen. Pages that load it with a plain
 * `<script>` tag already have it.
 */
export function plotlyReady() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!plotlyLoading) {
    const link = document.getElementById("plotly-js");
    plotlyLoading = new Promise((resolve, reject) => {
      const s = el("script", { src: link ? link.href : "/vendor/plotly.min.js" });
      s.addEventListener("load", () => (window.Plotly ? resolve(window.Plotly) : reject(new Error("Plotly.js did not start"))));
      s.addEventListener("error", () => { plotlyLoading = null; reject(new Error("Plotly.js could not be loaded")); });
      document.head.append(s);
    });
  }
  return plotlyLoading;
}

/** Run Plotly.js `ms` from now unless the returned function is called first: a page that holds Plotly.js back
 * until its first picture is painted does not also hold it back for a slow answer. */
export function plotlyAfter(ms) {
  const timer = setTimeout(() => plotlyReady().catch(() => {}), ms);
  return () => clearTimeout(timer);
}

/** Resolves after the browser has painted what the page drew so far (a frame, then the task after it); at once
 * in a hidden tab, which paints nothing and runs no frames. */
export function afterPaint() {
  if (document.visibilityState === "hidden") return Promise.resolve();
  return new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
}

/** Plotly's config for every chart: nothing that sends a chart anywhere, no logo. */
export function plotConfig(extra = {}) {
  return { responsive: true, displaylogo: false, showSendToCloud: false, showEditInChartStudio: false,
    showLink: false, plotlyServerURL: "", modeBarButtonsToRemove: ["sendDataToCloud", "select2d", "lasso2d", "autoScale2d"],
    ...extra };
}
/** Chart colours from the page's CSS variables, so charts follow the light or dark theme. */
export function plotTheme() {
  const css = getComputedStyle(document.documentElement);
  const v = (name) => css.getPropertyValue(name).trim();
  return { paper: v("--panel"), plot: v("--plot-bg"), ink: v("--ink"), muted: v("--muted"), grid: v("--grid"),
    label: v("--label-bg"), accent: v("--accent"), bad: v("--bad"), warn: v("--warn"), good: v("--good") };
}

// --- page frame ----------------------------------------------------------------------------------------
/** The header's sections; a new page adds itself here. */
export const NAV = [
  { key: "home", href: "/", text: "Traces" },
  { key: "replay", href: "/replay", text: "Replay" },
  { key: "sweep", href: "/sweep", text: "Sweep" },
  { key: "history", href: "/history", text: "History" },
  { key: "torch", href: "/torch", text: "PyTorch" },
];

/** The page header with the current section highlighted, and upload by dropping a file anywhere. */
export function topNav(here, { onStored, uploadName } = {}) {
  const header = el("header", { class: "top" },
    el("a", { class: "brand", href: "/" }, "alloctrace"),
    el("nav", {}, NAV.map((n) => el("a", { href: n.href, class: here === n.key ? "here" : null,
      "aria-current": here === n.key ? "page" : null }, n.text))),
    el("span", { class: "hint drop-hint write-only" }, "drop a log anywhere to upload it"));
  document.body.prepend(header);
  // upload and delete controls (class write-only) stay hidden unless this caller may change the store
  access().then((a) => {
    if (!a.can_write) return;
    document.body.classList.add("can-write");
    installDropUpload(onStored, uploadName);
  }).catch(() => {});
}

export function showError(container, err) {
  clear(container).append(el("p", { class: "error", role: "alert" }, String(err && err.message ? err.message : err)));
}

/** A loading indicator in container until the page replaces it. */
export function loading(container, text = "Loading…") {
  container.setAttribute("aria-busy", "true");
  clear(container).append(el("p", { class: "loading", role: "status" }, el("span", { class: "spinner", "aria-hidden": "true" }), text));
}
export function loaded(container) { container.removeAttribute("aria-busy"); }

// --- view state in the URL --------------------------------------------------------------------------------
/** Read a query parameter. */
export function urlParam(key) { return new URLSearchParams(location.search).get(key); }
/** Merge values into the query string without a new history entry (null removes a key). */
export function setUrlParams(values) {
  const q = new URLSearchParams(location.search);
  for (const [k, v] of Object.entries(values)) {
    if (v === null || v === undefined || v === "") q.delete(k);
    else q.set(k, String(v));
  }
  const s = q.toString();
  history.replaceState(history.state, "", `${location.pathname}${s ? `?${s}` : ""}${location.hash}`);
}

// --- drop a file anywhere to upload it -------------------------------------------------------------------
function installDropUpload(onStored, uploadName) {
  const overlay = el("div", { class: "drop-overlay", hidden: true, role: "dialog", "aria-live": "polite" },
    el("div", { class: "drop-box" }, el("p", { class: "big" }, "Drop the log to upload it"),
      el("progress", { max: "100", value: "0", hidden: true }), el("p", { class: "status" })));
  document.body.append(overlay);
  const bar = overlay.querySelector("progress"), status = overlay.querySelector(".status");
  const hasFiles = (e) => e.dataTransfer && [...(e.dataTransfer.types || [])].includes("Files");
  let depth = 0;
  document.addEventListener("dragenter", (e) => { if (hasFiles(e)) { depth++; overlay.hidden = false; status.textContent = ""; } });
  document.addEventListener("dragleave", (e) => { if (hasFiles(e) && --depth <= 0) { depth = 0; overlay.hidden = true; } });
  document.addEventListener("dragover", (e) => { if (hasFiles(e)) e.preventDefault(); });
  document.addEventListener("drop", async (e) => {
    if (!hasFiles(e)) return;
    e.preventDefault();
    depth = 0;
    const files = [...e.dataTransfer.files];
    if (!files.length) { overlay.hidden = true; return; }
    const stored = [];
    try {
      for (const f of files) {
        bar.hidden = false; bar.value = 0;
        status.className = "status"; status.textContent = `Uploading ${f.name}…`;
        stored.push(...await uploadTrace(f, uploadName ? uploadName() : null, (x) => { bar.value = Math.round(100 * x); }));
      }
      status.textContent = `Stored ${stored.length} trace${stored.length === 1 ? "" : "s"}.`;
      if (onStored) { onStored(stored); setTimeout(() => { overlay.hidden = true; }, 600); }
      else if (stored.length) location.assign(`/traces/${enc(stored[0].id)}`);
    } catch (err) {
      bar.value = 0; bar.hidden = true;
      status.className = "status error";
      status.textContent = `Upload refused: ${err.message}`;
      setTimeout(() => { overlay.hidden = true; }, 4000);
    }
  });
}
