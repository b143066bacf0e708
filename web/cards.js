// Explanation cards: why an allocation failed, where two runs part.
import { el, bytesEl, fmtInt, pick } from "/static/common.js";

/** "not enough space: needed N, largest free block M", with the free blocks and what separates them. */
export function oomCard(oom, heading) {
  const needed = pick(oom, "needed");
  const largest = pick(oom, "largest_available", "largest_free", "largest");
  const total = pick(oom, "total_free");
  const card = el("section", { class: "card oom", id: "oom-card-body", role: "note" },
    el("h2", {}, heading || "Out of space"),
    el("p", { class: "big" }, "not enough space: needed ", bytesEl(needed), ", largest free block ", bytesEl(largest),
      total !== undefined ? [", total free ", bytesEl(total)] : null,
      pick(oom, "tensor") ? [" (tensor ", el("span", { class: "tensor" }, oom.tensor), ")"] : null));
  if (total !== undefined && needed !== undefined && total >= needed) {
    card.append(el("p", {}, "There is enough free memory in total, but it is split: no single block is large enough (fragmentation)."));
  }
  const blocks = pick(oom, "free_blocks", "blocks");
  if (Array.isArray(blocks) && blocks.length) {
    card.append(el("p", {}, `Free blocks (${fmtInt(blocks.length)}):`),
      el("ul", {}, blocks.slice(0, 12).map((b) => {
        const [off, size] = Array.isArray(b) ? b : [pick(b, "offset"), pick(b, "size")];
        return el("li", {}, bytesEl(size), " at offset ", fmtInt(off));
      })));
  }
  const sep = pick(oom, "separating", "separating_live", "between");
  if (Array.isArray(sep) && sep.length) {
    card.append(el("p", {}, "Live tensors separating them:"),
      el("ul", {}, sep.slice(0, 12).map((s) => typeof s === "string" ? el("li", { class: "tensor" }, s)
        : el("li", {}, el("span", { class: "tensor" }, pick(s, "tensor", "name") ?? ""), " · ", bytesEl(pick(s, "size")), " at offset ", fmtInt(pick(s, "offset"))))));
  }
  if (pick(oom, "words")) card.append(el("p", { class: "hint" }, oom.words));
  return card;
}
