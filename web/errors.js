// Friendly error pages: a stale or mistyped link (a deleted trace, a malformed diff ref, an unknown PyTorch
// id) answers a page that says what went wrong in words and offers a way back, never a raw server message
// or a validation pattern. Every page uses `errorPage`; `problem` turns an API error into the words.
import { el } from "./common.js";

const HOME = { href: "/", text: "All traces" };
const TORCH = { href: "/torch", text: "PyTorch snapshots" };

/** Whether `id` has the shape of a trace id (8 hex digits), before asking the server. */
export const isTraceId = (id) => /^[0-9a-f]{8}$/.test(String(id ?? ""));

/** What a failed request means for a link to `what` ("trace", "diff", "snapshot", "page"): {title, text}. */
export function problem(err, what = "trace", ref = "") {
  const status = err && err.status;
  const named = ref ? ` ${ref}` : "";
  if (status === 404 && what === "diff") {
    return { title: "A trace of this comparison is not in the store",
      text: `One of the graphs${named} was not found: its trace may have been deleted, or the link comes from another store.` };
  }
  if (status === 404) {
    if (what === "page") return { title: "No such page", text: "This address is not a page of the dashboard." };
    return { title: `This ${what} is not in the store`,
      text: `The ${what}${named} was not found: it may have been deleted, or the link comes from another store ` +
        "(every command and server reads the store given by --store or $ALLOCTRACE_STORE)." };
  }
  if (status === 400 || status === 422) {
    return { title: "This link is not valid",
      text: `The link does not name a ${what} the dashboard can open${named ? ` (${named.trim()})` : ""}: ${howTo(what)}` };
  }
  if (status === 0) return { title: "The server cannot be reached", text: "Is `alloctrace serve` still running?" };
  return { title: `The ${what} could not be shown`, text: String((err && err.message) || err) };
}

function howTo(what) {
  if (what === "diff") return "a diff link reads /diff?a=ID:GRAPH&b=ID:GRAPH, with an 8-digit trace id and a graph number (e.g. a=3bbd1c36:0&b=3bbd1c36:1).";
  if (what === "sweep") return "a recorded sweep's link reads /sweep?id=ID, with the id that `alloctrace sweep` printed (the list on /sweep has every one).";
  if (what === "snapshot") return "a PyTorch link reads /torch?id=ID, with an 8-digit trace id (e.g. /torch?id=60e70dbe).";
  return "a trace link reads /traces/ID, with the 8-digit trace id that `alloctrace list` shows (e.g. /traces/3bbd1c36).";
}

/**
 * Replace the page's content with the error: a heading, the words, and links back (the home list first, the
 * PyTorch list for PyTorch pages). The page's header stays; `data-loaded="error"` tells tests it settled.
 */
export function errorPage({ title, text }, { torch = false, main = document.querySelector("main") } = {}) {
  for (const n of main.children) n.hidden = true;
  const links = torch ? [TORCH, HOME] : [HOME, TORCH];
  const card = el("section", { class: "card error-page", id: "error-page", role: "alert" },
    el("h1", {}, title), el("p", {}, text),
    el("p", { class: "way-back" }, links.map((l, k) => [k ? " · " : null, el("a", { href: l.href }, k ? l.text : `← ${l.text}`)])));
  main.append(card);
  document.title = `alloctrace · ${title}`;
  document.body.dataset.loaded = "error";
  return card;
}

/** The not-found page the server answers for an address that is no page (notfound.html). */
export function notFoundPage() {
  const trace = /^\/traces\/([^/?#]*)/.exec(location.pathname);
  const shown = trace ? decodeURIComponent(trace[1]).slice(0, 40) : "";
  errorPage(trace ? problem({ status: 422 }, "trace", shown) : problem({ status: 404 }, "page"));
}


