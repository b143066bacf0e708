// Whether the model reproduced a graph: a badge for the facts and the home list, and the list of what it got
// wrong (tensor, model offset, real offset, buffer, chunk) for an inconsistent graph.
import { consistency } from "./api.js";
import { el, clear, fmtInt } from "./common.js";

/** "exact up to N B" where the log cannot pin a size to the byte (what it lacks is the badge's title). */
const upTo = (n) => `yes, exact up to ${fmtInt(n)} B`;

/** "yes" / "yes, exact up to N B" / "no: N mismatches" / "–" (not checked), as a badge. */
export function consistencyBadge(g) {
  if (g.consistent === true && g.uncertainty_bytes) {
    return el("span", { class: "badge consistent uncertain", title: `exact up to ${fmtInt(g.uncertainty_bytes)} bytes: ${g.reason || "?"}` },
      upTo(g.uncertainty_bytes));
  }
  if (g.consistent === true) return el("span", { class: "badge consistent", title: "the model reproduced every placement, plan and buffer size" }, "yes");
  if (g.consistent === false) return el("span", { class: "badge oom inconsistent" }, "no");
  return el("span", { class: "hint", title: "nothing to check this graph against" }, "–");
}

/** The home list's cell: every graph consistent, or which are not (each a link to it). */
export function traceConsistency(t, href) {
  const checked = t.graphs.filter((g) => g.consistent !== null && g.consistent !== undefined);
  if (!checked.length) return el("span", { class: "hint" }, "–");
  const bad = checked.filter((g) => g.consistent === false);
  const unsure = checked.reduce((w, g) => (g.uncertainty_bytes > (w ? w.uncertainty_bytes : 0) ? g : w), null);
  if (!bad.length && unsure) {
    return el("span", { class: "badge consistent uncertain",
      title: `${checked.length} graphs checked; exact up to ${fmtInt(unsure.uncertainty_bytes)} bytes: ${unsure.reason || "?"}` },
    upTo(unsure.uncertainty_bytes));
  }
  if (!bad.length) return el("span", { class: "badge consistent", title: `${checked.length} graphs checked` }, "yes");
  return el("span", {}, el("span", { class: "badge oom inconsistent" }, `no: ${bad.length} of ${checked.length}`), " ",
    ...bad.slice(0, 4).map((g, k) => [k ? ", " : null, el("a", { href: href(g), class: "inconsistent-graph" }, `graph ${g.index}`)]).flat(),
    bad.length > 4 ? " …" : null);
}

const off = (v) => (v === null || v === undefined ? "–" : fmtInt(v));

/** Fill `box` with the mismatches of an inconsistent graph (hidden when consistent or unchecked). */
export async function showMismatches(box, ref, gs) {
  box.hidden = gs.consistent !== false;
  if (box.hidden) return;
  clear(box).append(el("h2", {}, "Model and real run disagree"));
  let c;
  try { c = await consistency(ref.id, ref.g); } catch (e) { box.append(el("p", { class: "error" }, e.message)); return; }
  const named = (b) => (b === null || b === undefined ? "–" : (c.buffer_types[b] ? `${b} (${c.buffer_types[b]})` : String(b)));
  box.append(el("p", { class: "hint" }, `${fmtInt(c.n_mismatches)} mismatch${c.n_mismatches === 1 ? "" : "es"}.` +
    (c.map_from === "recorded placements" ? ` The memory map shows what ggml did (its ${fmtInt(c.placements)} recorded placements).`
      : " The memory map shows the model's walk.") +
    (c.offsets.length ? " The placements model and recording disagree on:" : "")));
  if (c.offsets.length) {
    const head = el("tr", {}, ...["Tensor", "Model offset", "Real offset", "Buffer", "Chunk", "Placed by graph"].map((h, i) =>
      el("th", { class: i >= 1 && i <= 2 ? "num" : null }, h)));
    const rows = c.offsets.map((o) => el("tr", {},
      el("td", { class: "tensor" }, o.tensor), el("td", { class: "num" }, off(o.model_offset)),
      el("td", { class: "num" }, off(o.real_offset)), el("td", {}, named(o.buffer)), el("td", {}, off(o.chunk)),
      el("td", {}, o.graph === undefined ? "this" : String(o.graph))));
    box.append(el("div", { class: "table-wide" }, el("table", { class: "data", id: "mismatch-table" }, el("thead", {}, head), el("tbody", {}, rows))));
  }
  const other = c.mismatches.filter((m) => !/offset model/.test(m));
  if (other.length) box.append(el("ul", { id: "mismatch-notes" }, other.map((m) => el("li", { class: "tensor" }, m))));
}
