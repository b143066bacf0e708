// The event table: paged from the server, keyboard navigable (arrows, j/k, PageUp/Down, Home/End) from
// anywhere on the page, linked to the map through onSelect / select(i).
import { events } from "./api.js";
import { el, clear, fmtBytes, exactBytes, fmtInt, loading, loaded, tensorLabel } from "./common.js";

const PAGE = 200;
const KIND_CLASS = (k) => `badge kind kind-${String(k).replace(/[^a-z_]/g, "")}`;

export class EventTable {
  /** box: container; ref: {id, g}; opts: {onSelect(i, event)} */
  constructor(box, ref, opts = {}) {
    this.box = box; this.ref = ref; this.opts = opts;
    this.start = 0; this.total = 0; this.events = []; this.selected = null; this.filters = { kind: "", tensor: "" };
    this.build();
  }

  build() {
    this.kind = el("select", { "aria-label": "Filter by kind" },
      ["", "alloc", "free", "reuse", "view", "exec", "oom", "abort", "input", "output", "barrier", "free_extra", "realloc", "buffer"]
        .map((k) => el("option", { value: k }, k || "all kinds")));
    this.tensor = el("input", { type: "search", placeholder: "tensor name", "aria-label": "Filter by tensor name" });
    this.info = el("span", { class: "hint" });
    this.prev = el("button", { class: "secondary", type: "button" }, "◀ prev");
    this.next = el("button", { class: "secondary", type: "button" }, "next ▶");
    const apply = () => { this.filters = { kind: this.kind.value, tensor: this.tensor.value.trim() }; this.load(0); };
    this.kind.addEventListener("change", apply);
    this.tensor.addEventListener("change", apply);
    this.prev.addEventListener("click", () => this.load(Math.max(0, this.start - PAGE)));
    this.next.addEventListener("click", () => this.load(this.start + PAGE));
    this.scroll = el("div", { class: "table-scroll", tabindex: "0", id: "event-scroll",
      "aria-label": "Events: use arrow keys or j/k to move" });
    this.tbody = el("tbody");
    const th = (t, num) => el("th", { class: num ? "num" : null }, t);
    this.scroll.append(el("table", { class: "data events", id: "event-table" },
      el("thead", {}, el("tr", {}, th("#", 1), th("kind"), th("tensor"), th("op"), th("size", 1), th("offset", 1),
        th("block", 1), th("n free", 1), th("largest free", 1))), this.tbody));
    // the keys work wherever the focus is, except while typing in a field
    document.addEventListener("keydown", (e) => {
      const t = e.target;
      if (e.ctrlKey || e.metaKey || e.altKey || (t && (t.isContentEditable || ["INPUT", "SELECT", "TEXTAREA"].includes(t.tagName)))) return;
      if (t && t.tagName === "BUTTON" && (e.key === " " || e.key === "Enter")) return;
      this.key(e);
    });
    clear(this.box).append(
      el("div", { class: "toolbar" }, this.kind, el("div", { style: "max-width:200px" }, this.tensor), el("span", { class: "spacer" }),
        this.info, this.prev, this.next),
      this.scroll,
      el("p", { class: "hint" }, "Click a row to mark it on the map. Keys: ", el("span", { class: "kbd" }, "↑"), " ",
        el("span", { class: "kbd" }, "↓"), " or ", el("span", { class: "kbd" }, "j"), " ", el("span", { class: "kbd" }, "k"),
        " move, ", el("span", { class: "kbd" }, "PgUp"), " ", el("span", { class: "kbd" }, "PgDn"), " page (anywhere on the page)."));
  }

  async load(start) {
    if (!this.events.length) {
      clear(this.tbody).append(el("tr", {}, el("td", { colspan: 9 }, el("span", { class: "loading-cell" }))));
      loading(this.tbody.querySelector(".loading-cell"), "Loading events…");
    }
    this.scroll.setAttribute("aria-busy", "true");
    try {
      const page = await events(this.ref.id, this.ref.g, { start: Math.max(0, start), limit: PAGE, ...this.filters });
      this.start = page.start;
      this.total = page.total;
      this.events = page.events;
      this.render();
    } catch (e) {
      clear(this.tbody).append(el("tr", {}, el("td", { colspan: 9, class: "error" }, e.message)));
    } finally { loaded(this.scroll); }
  }

  render() {
    clear(this.tbody);
    for (const e of this.events) {
      const off = e.offset;
      const tr = el("tr", { dataset: { i: e.i }, class: [e.kind === "oom" || e.kind === "abort" ? "bad" : "", e.i === this.selected ? "selected" : ""].join(" ").trim() || null },
        el("td", { class: "num" }, fmtInt(e.i)),
        el("td", {}, el("span", { class: KIND_CLASS(e.kind) }, e.kind ?? "")),
        el("td", { class: "tensor", title: e.tensor ?? null }, e.tensor !== undefined ? tensorLabel(e.tensor, e.op, off) : ""),
        el("td", {}, e.op ?? ""),
        el("td", { class: "num", title: e.size != null ? exactBytes(e.size) : null }, e.size != null ? fmtBytes(e.size) : ""),
        el("td", { class: "num", title: off != null ? exactBytes(off) : null }, off != null ? fmtInt(off) : ""),
        el("td", { class: "num" }, e.block ?? ""),
        el("td", { class: "num" }, e.n_free ?? ""),
        el("td", { class: "num", title: e.largest_free != null ? exactBytes(e.largest_free) : null }, e.largest_free != null ? fmtBytes(e.largest_free) : ""));
      tr.addEventListener("click", () => this.select(e.i, true));
      this.tbody.append(tr);
    }
    if (!this.events.length) this.tbody.append(el("tr", {}, el("td", { colspan: 9, class: "empty" }, "No events match.")));
    const last = this.start + this.events.length;
    this.info.textContent = this.total ? `${fmtInt(this.start)}–${fmtInt(Math.max(this.start, last - 1))} of ${fmtInt(this.total)}` : "";
    this.prev.disabled = this.start <= 0;
    this.next.disabled = last >= this.total;
  }

  /** Select event i: load its page if needed, highlight, scroll into view; notify when from the user. */
  async select(i, fromUser = false) {
    if (i === null || i === undefined) return;
    let row = this.events.find((e) => e.i === i);
    if (!row) {
      if (this.filters.kind || this.filters.tensor) { this.filters = { kind: "", tensor: "" }; this.kind.value = ""; this.tensor.value = ""; }
      await this.load(Math.floor(i / PAGE) * PAGE);
      row = this.events.find((e) => e.i === i);
    }
    this.selected = i;
    for (const tr of this.tbody.querySelectorAll("tr.selected")) tr.classList.remove("selected");
    const tr = this.tbody.querySelector(`tr[data-i="${Number(i)}"]`);
    if (tr) {
      tr.classList.add("selected");
      // the row comes into view inside the table's own box; only a user's move may scroll the page to it
      // (a page that opens on a selected row keeps its first screen, e.g. the out-of-space card)
      const box = this.scroll.getBoundingClientRect(), r = tr.getBoundingClientRect(), head = 34;
      if (r.top < box.top + head) this.scroll.scrollTop -= box.top + head - r.top;
      else if (r.bottom > box.bottom) this.scroll.scrollTop += r.bottom - box.bottom;
      if (fromUser) tr.scrollIntoView({ block: "nearest" });
    }
    if (fromUser && this.opts.onSelect) this.opts.onSelect(i, row || null);
    return row;
  }

  async key(e) {
    const k = e.key;
    const idx = this.events.findIndex((x) => x.i === this.selected);
    let target = null;
    if (k === "ArrowDown" || k === "j") {
      if (idx < 0) target = this.events[0];
      else if (idx + 1 < this.events.length) target = this.events[idx + 1];
      else if (!this.next.disabled) { await this.load(this.start + PAGE); target = this.events[0]; }
    } else if (k === "ArrowUp" || k === "k") {
      if (idx > 0) target = this.events[idx - 1];
      else if (idx === 0 && this.start > 0) { await this.load(Math.max(0, this.start - PAGE)); target = this.events[this.events.length - 1]; }
    } else if (k === "PageDown") {
      target = this.events[Math.min(this.events.length - 1, Math.max(0, idx) + 20)];
    } else if (k === "PageUp") {
      target = this.events[Math.max(0, idx - 20)];
    } else if (k === "Home") target = this.events[0];
    else if (k === "End") target = this.events[this.events.length - 1];
    else return;
    e.preventDefault();
    if (target) this.select(target.i, true);
  }
}
