// One colour per op and per tensor family, the same on every panel and page, and distinct within a page.
// The colours are colour-blind safe: Okabe & Ito's eight (less black) and Paul Tol's "muted" set, then the
// same hues lightened for a second round. Each key has a home colour (common ggml ops a fixed one, any
// other key one from its name's hash); a page claims every key it will show, in name order, and a key
// whose home colour an earlier key of the page holds takes the next free colour. So a key keeps its colour
// across pages except where two keys of one page would share it.

/** Okabe-Ito (orange, sky blue, bluish green, yellow, blue, vermillion, reddish purple), then Tol muted. */
export const PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
  "#332288", "#882255", "#44AA99", "#999933", "#DDCC77", "#AA4499", "#117733"];
const LIGHT = PALETTE.map((c) => mix(c, "#ffffff", 0.45));
export const COLORS = [...PALETTE, ...LIGHT];

/** Fixed home colours of the ops most graphs hold, all different (aliases of one op share theirs). */
const HOME = {
  MUL_MAT: 0, ADD: 1, GET_ROWS: 2, RMS_NORM: 3, ROPE: 4, MUL: 5, SOFT_MAX: 6, SOFT_MAX_EXT: 6, CPY: 7, SCALE: 8,
  GELU: 9, SILU: 9, UNARY: 9, DIAG_MASK_INF: 10, CONT: 11, DUP: 11, NORM: 12, FLASH_ATTN_EXT: 13, FLASH_ATTN: 13,
  VIEW: 14, RESHAPE: 14, PERMUTE: 15, TRANSPOSE: 15, NONE: 16, SUB: 17, CONCAT: 18, SUM_ROWS: 19, GLU: 20,
};

function mix(a, b, t) {
  const p = (c, i) => parseInt(c.slice(1 + 2 * i, 3 + 2 * i), 16);
  const h = (v) => Math.round(v).toString(16).padStart(2, "0");
  return `#${[0, 1, 2].map((i) => h(p(a, i) * (1 - t) + p(b, i) * t)).join("")}`;
}

export function fnv1a(s) {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) { h ^= s.charCodeAt(i); h = Math.imul(h, 0x01000193) >>> 0; }
  return h;
}

/** The colour a key gets when nothing else on the page holds it. */
export function homeSlot(key, fixed = true) {
  const k = String(key ?? "?");
  const op = k.toUpperCase();
  if (fixed && op in HOME) return HOME[op];
  return fnv1a(fixed ? op : k) % COLORS.length;
}

/** The colours of one kind of key (ops, families) on this page. */
export class Scheme {
  /** `fixed`: keys are ops (case-insensitive, common ones with fixed homes); else names as they are. */
  constructor(fixed) { this.fixed = fixed; this.byKey = new Map(); this.taken = new Map(); }

  norm(key) { const k = String(key ?? "?"); return this.fixed ? k.toUpperCase() : k; }

  /** Give every key a colour before anything is drawn (name order, so the result depends on the set only). */
  claim(keys) {
    const fresh = [...new Set([...keys].map((k) => this.norm(k)))].filter((k) => !this.byKey.has(k)).sort();
    for (const k of fresh) this.place(k);
    return this;
  }

  place(k) {
    const home = homeSlot(k, this.fixed);
    let slot = home;
    // aliases (SOFT_MAX and SOFT_MAX_EXT) may share a home; any other holder sends the key on
    for (let n = 0; n < COLORS.length; n++) {
      const s = (home + n) % COLORS.length;
      const holder = this.taken.get(s);
      if (holder === undefined || (this.fixed && HOME[holder] === HOME[k] && k in HOME)) { slot = s; break; }
    }
    if (!this.taken.has(slot)) this.taken.set(slot, k);
    this.byKey.set(k, COLORS[slot]);
    return COLORS[slot];
  }

  /** The key's colour on this page (claimed now if no panel claimed it before). */
  of(key) { const k = this.norm(key); return this.byKey.get(k) || this.place(k); }
}

/** The page's op colours (memory maps, allocator state) and family colours (peak panel, size attribution). */
export const opColors = new Scheme(true);
export const familyColors = new Scheme(false);
