// Explanation cards: why an allocation failed, where two runs part and why best fit chose differently.
// Byte counts that decide an outcome are written out exactly (a 2,080 B gap must not round away).
import { el, fmtInt, fmtBytes, bothBytes, exactEl, tensorLabel } from "./common.js";

/**
 * oom: {tensor, needed, largest, total_free?, free_blocks?: FreeBlock[], separating?: [{tensor, op, offset, size}]}
 */
export function oomCard(oom, heading) {
  const { needed, largest } = oom;
  const total = oom.total_free;
  const card = el("section", { class: "card oom", id: "oom-card-body", role: "note" },
    el("h2", {}, heading || "Out of space"),
    el("p", { class: "big" }, el("span", { class: "tensor" }, tensorLabel(oom.tensor)), " needed ", exactEl(needed),
      "; the largest free block was ", exactEl(largest), "."),
    needed != null && largest != null ? el("p", { class: "short-by" }, "Short by ", exactEl(needed - largest), " in one block.") : null,
    oom.ggml_line ? el("p", { class: "ggml-line" }, "ggml's message: ", el("code", { id: "ggml-line" }, oom.ggml_line)) : null);
  if (total !== undefined && total !== null) {
    card.append(el("p", {}, "Free in total: ", exactEl(total),
      total >= needed ? [" — enough in total, but split: no single block holds ", fmtBytes(needed), " (fragmentation)."]
        : [" — less than needed even in total (", exactEl(needed - total), " short)."]));
  }
  const blocks = oom.free_blocks;
  if (Array.isArray(blocks) && blocks.length) {
    card.append(el("p", {}, `Free blocks (${fmtInt(blocks.length)}):`),
      el("ul", { class: "free-blocks" }, blocks.slice(0, 12).map((b) =>
        el("li", {}, b.size === null ? "endless last block" : exactEl(b.size), " at offset ", fmtInt(b.offset)))));
  }
  const sep = oom.separating;
  if (Array.isArray(sep) && sep.length) {
    card.append(el("p", {}, "Live tensors keeping them apart:"),
      el("ul", { class: "separating" }, sep.slice(0, 12).map((s) =>
        el("li", {}, el("span", { class: "tensor" }, tensorLabel(s.tensor, s.op, s.offset)), " · ", exactEl(s.size), " at offset ", fmtInt(s.offset)))));
  }
  return card;
}

// --- the first divergence in words -------------------------------------------------------------------
function blockText(b) { return b.size === null ? "the endless last block" : bothBytes(b.size); }

/** What one run's allocator did with the request: which block, and whether best fit explains it. */
function choiceText(c) {
  if (c.kind === "reuse") return `reused ${tensorLabel(c.parent)}'s bytes in place (no free-list search)`;
  if (c.kind === "oom" || c.offset === undefined || c.offset === null) return "found no block that holds it";
  const k = chosenIndex(c);
  const chosen = (c.freeBlocks || [])[k];
  const size = chosen ? chosen.size : c.block_size ?? null;
  const which = c.block < 0 ? `the last block (block ${k}, logged as block -1)` : `block ${k}`;
  return `took ${which}, ${size === null ? "endless" : bothBytes(size)}, at offset ${fmtInt(c.offset)}`;
}

/** The index of the chosen block in the free list (ggml logs the last-block fallback as -1). */
function chosenIndex(c) {
  const blocks = c.freeBlocks || [];
  if (c.block === undefined || c.block === null) return null;
  return c.block < 0 ? blocks.length - 1 : c.block;
}

/** The smallest block that holds `size`, by best fit's rule (endless counts as larger than any). */
function smallestFit(blocks, size) {
  let best = null;
  blocks.forEach((b, k) => {
    if (b.size !== null && b.size < size) return;
    if (best === null || (b.size !== null && (blocks[best].size === null || b.size < blocks[best].size))) best = k;
  });
  return best;
}

/** One run's free list as the allocator searched it, and whether its choice was the smallest fit. */
function sideReasoning(label, c, size) {
  const blocks = c.freeBlocks || [];
  if (c.kind === "reuse") return el("li", {}, `${label} ${choiceText(c)}.`);
  const shown = blocks.slice(0, 8).map((b, k) => `block ${k}: ${b.size === null ? "endless" : fmtBytes(b.size)} at ${fmtInt(b.offset)}`).join("; ");
  const fit = smallestFit(blocks, size), k = chosenIndex(c);
  let why = "";
  if (fit === null) why = "; no block held it";
  else if (fit === k) why = `, the smallest block that holds ${fmtBytes(size)}`;
  else if (k !== null && k >= 0) {
    why = `, although block ${fit} (${blockText(blocks[fit])}) was smaller: this generation uses the last block only when no other block fits`;
  }
  return el("li", {}, `${label} saw ${fmtInt(blocks.length)} free block${blocks.length === 1 ? "" : "s"} (${shown}${blocks.length > 8 ? "; …" : ""}) and ${choiceText(c)}${why}.`);
}

/** Where the two free lists differed when the allocator searched them. */
function listDifference(a, b, la, lb) {
  const A = a.freeBlocks || [], B = b.freeBlocks || [];
  if (!A.length || !B.length) return null;
  const differ = [];
  for (let k = 0; k < Math.max(A.length, B.length); k++) {
    const x = A[k], y = B[k];
    if (!x || !y || x.offset !== y.offset || x.size !== y.size) differ.push(k);
  }
  if (!differ.length) return "Both runs searched the same free list; they differ in the request or the rule.";
  const last = Math.max(A.length, B.length) - 1;
  if (differ.length === 1 && differ[0] === last && A.length === B.length) {
    let so = "";
    const [ka, kb] = [chosenIndex(a), chosenIndex(b)];
    for (const [label, k, other, blocks] of [[lb, kb, ka, B], [la, ka, kb, A]]) {
      if (k === last && other !== last && other !== null && blocks[last].size !== null && blocks[other]) {
        so = ` In ${label} the last block was finite and smaller than block ${other} (${blockText(blocks[other])}), so best fit took it.`;
      }
    }
    return `The free lists were the same except the last block: ${blockText(A[last])} in ${la}, ${blockText(B[last])} in ${lb}.${so}`;
  }
  return `The free lists differ in ${differ.length} block${differ.length === 1 ? "" : "s"} (first: block ${differ[0]}).`;
}

/** The divergence card: the request, both choices, and the best-fit reasoning. */
export function divergenceCard(d, la, lb, links) {
  const size = d.a.size ?? d.b.size;
  const name = tensorLabel(d.tensor);
  const headline = el("p", { class: "big", id: "divergence-words" },
    el("span", { class: "tensor" }, name), ` asked for ${bothBytes(size)}. ${la} ${choiceText(d.a)}; ${lb} ${choiceText(d.b)}.`);
  const diffLine = listDifference(d.a, d.b, la, lb);
  const reasoning = el("ul", { class: "reasoning", id: "divergence-reasoning" },
    el("li", {}, "Best fit takes the smallest free block that holds the request (the state below is before the choice)."),
    sideReasoning(la, d.a, size), sideReasoning(lb, d.b, size), diffLine ? el("li", {}, diffLine) : null);
  const ea = d.event_a, eb = d.event_b;
  return el("section", { class: "card diverge", id: "divergence-card", role: "note" },
    el("h2", {}, `First divergence: event ${fmtInt(ea)}${eb !== ea ? ` in ${la}, ${fmtInt(eb)} in ${lb}` : ""}`),
    headline, reasoning, links);
}

/** The first event where the free lists hold different finite blocks, placed relative to the divergence. */
export function freeListsCard(ffl, d, la, lb) {
  const ea = ffl.event_a, eb = ffl.event_b;
  const at = `event ${fmtInt(ea)}${eb !== ea ? ` / ${fmtInt(eb)}` : ""}`;
  let context = "";
  if (d && ea >= d.event_a) {
    context = `This follows from the divergence at event ${fmtInt(d.event_a)}: up to it the free lists differed at most in the last ` +
      `block; from ${at} on, the runs' different choices leave different free blocks.`;
  } else if (d) context = `The free lists already differed before the divergence at event ${fmtInt(d.event_a)}.`;
  const count = (s) => `${fmtInt((s.freeBlocks || []).length)} free block${(s.freeBlocks || []).length === 1 ? "" : "s"}`;
  return el("section", { class: "card", id: "free-lists-card" },
    el("h2", {}, `Free lists first hold different blocks: ${at}, before ${tensorLabel(ffl.tensor)} is placed`),
    el("p", {}, `${la}: ${count(ffl.a)} (${(ffl.a.freeBlocks || []).slice(0, 6).map(blockAt).join(", ")}); `,
      `${lb}: ${count(ffl.b)} (${(ffl.b.freeBlocks || []).slice(0, 6).map(blockAt).join(", ")}).`),
    context ? el("p", { class: "hint" }, context) : null);
}

function blockAt(b) { return `${b.size === null ? "endless" : bothBytes(b.size)} at ${fmtInt(b.offset)}`; }
