// Shared helpers: API calls, units, and DOM building that never turns data into markup.

/** GET or POST JSON; throws an Error carrying the server's `detail` so pages can show one clear line. */
export async function api(path, options = {}) {
  const init = { ...options, headers: { Accept: "application/json", ...(options.headers || {}) } };
  if (options.json !== undefined) {
    init.method = init.method || "POST";
    init.body = JSON.stringify(options.json);
    init.headers["Content-Type"] = "application/json";
    delete init.json;
  }
  const early = !options.method && !options.json && window.__prefetch && window.__prefetch[path];
  if (early) delete window.__prefetch[path];
  const resp = (early && (await early)) || (await fetch(path, init));
  let body = null;
  try { body = await resp.json(); } catch (_) { body = null; }
  if (!resp.ok) {
    let detail = body && body.detail;
    if (Array.isArray(detail)) detail = detail.map((d) => d.msg || JSON.stringify(d)).join("; ");
    throw new Error(detail ? String(detail) : `${resp.status} ${resp.statusText}`);
  }
  return body;
}

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
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

export function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];
/** 12304 -> "12.0 KiB"; exact bytes stay available through `exactBytes`. */
export function fmtBytes(n) {
  if (n === null || n === undefined || Number.isNaN(Number(n))) return "–";
  let v = Number(n), u = 0;
  const neg = v < 0; v = Math.abs(v);
  while (v >= 1024 && u < UNITS.length - 1) { v /= 1024; u++; }
  const s = u === 0 ? String(v) : v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
  return `${neg ? "-" : ""}${s} ${UNITS[u]}`;
}
export function exactBytes(n) {
  if (n === null || n === undefined) return "–";
  return `${Number(n).toLocaleString("en-US")} bytes`;
}
/** A byte count as text with its exact value on hover. */
export function bytesEl(n, tag = "span") {
  return el(tag, { title: exactBytes(n), class: "bytes" }, fmtBytes(n));
}
export function fmtInt(n) { return n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"); }

/** "ID:G" -> {id, g}; null when malformed. */
export function parseRef(ref) {
  if (!ref) return null;
  const i = String(ref).lastIndexOf(":");
  if (i <= 0) return null;
  const g = Number(ref.slice(i + 1));
  if (!Number.isInteger(g) || g < 0) return null;
  return { id: ref.slice(0, i), g };
}

export const enc = encodeURIComponent;
export const graphBase = (id, g) => `/api/traces/${enc(id)}/graphs/${enc(g)}`;

/** A stable, readable color per op name (a fixed palette, hashed). */
const PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#9d755d", "#eeca3b",
  "#ff9da6", "#79706e", "#5b8ff9", "#8c6d31", "#2ca02c", "#d62728", "#9467bd", "#17becf"];
const assigned = new Map();
/** Ops get palette colors in first-seen order, so a page's ops stay distinct and consistent. */
export function opColor(op) {
  const key = String(op || "?");
  if (!assigned.has(key)) assigned.set(key, assigned.size < PALETTE.length ? PALETTE[assigned.size] : hashColor(key));
  return assigned.get(key);
}
/** A color from a name's hash: for tensors, too many to give each its own. */
export function hashColor(name) {
  const s = String(name || "?");
  let h = 0;
  for (let i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) >>> 0;
  return PALETTE[h % PALETTE.length];
}

/** First present key of an object (the API's field names may vary slightly). */
export function pick(obj, ...keys) {
  if (!obj) return undefined;
  for (const k of keys) if (obj[k] !== undefined && obj[k] !== null) return obj[k];
  return undefined;
}

/** Normalize list payloads that might be either arrays of rows or objects of columns. */
export function rows(payload) {
  if (!payload) return [];
  if (Array.isArray(payload)) return payload;
  const keys = Object.keys(payload).filter((k) => Array.isArray(payload[k]));
  if (!keys.length) return [];
  const n = Math.max(...keys.map((k) => payload[k].length));
  const out = new Array(n);
  for (let i = 0; i < n; i++) {
    const r = {};
    for (const k of keys) r[k] = payload[k][i];
    out[i] = r;
  }
  return out;
}

/** The page header with the current section highlighted. */
export function topNav(here) {
  const link = (href, text, key) => el("a", { href, class: here === key ? "here" : null }, text);
  const header = el("header", { class: "top" },
    el("a", { class: "brand", href: "/" }, "alloctrace"),
    el("nav", {}, link("/", "Traces", "home"), link("/replay", "Replay", "replay")));
  document.body.prepend(header);
}

export function showError(container, err) {
  clear(container).append(el("p", { class: "error", role: "alert" }, String(err && err.message ? err.message : err)));
}

export const KIND_WORDS = {
  alloc: "allocated", free: "freed", reuse: "reused parent", oom: "out of space", abort: "aborted",
  view: "view", exec: "exec", input: "input", output: "output", graph: "graph start",
};
