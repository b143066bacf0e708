// The dashboard's one client of the JSON API: every endpoint and every field name the pages read is named
// here, once. Pages call these functions and read the documented fields; nothing else builds an /api URL.
// Where two endpoints name the same fact differently (the largest free block of an out-of-space failure,
// free blocks as arrays or objects), the answer is normalized here so pages see one name.

const enc = encodeURIComponent;

/** Thrown for a non-2xx answer; `message` is the server's `detail`, validation errors name their field. */
export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

/** The server's `detail`: a string, or FastAPI's validation list ({loc, msg}) turned into "field: msg". */
export function detailText(body, status) {
  const detail = body && body.detail;
  if (Array.isArray(detail)) {
    return detail.map((d) => {
      const field = (d.loc || []).filter((p) => p !== "body" && p !== "query" && p !== "path").join(".");
      return field ? `${field}: ${d.msg}` : d.msg;
    }).join("; ");
  }
  return detail ? String(detail) : `HTTP ${status}`;
}

async function call(path, init = {}) {
  const resp = await fetch(path, { ...init, headers: { Accept: "application/json", ...(init.headers || {}) } });
  let body = null;
  try { body = await resp.json(); } catch (_) { body = null; }
  if (!resp.ok) throw new ApiError(resp.status, detailText(body, resp.status));
  return body;
}

/** {can_write, why}: whether this caller may upload, delete and replay (a read-only token may not). */
export function access() { return call("/api/access"); }

const post = (path, json) => call(path, { method: "POST", body: JSON.stringify(json),
  headers: { "Content-Type": "application/json" } });

/** Rectangles per map view: enough for detail, few enough to draw fast (prefetch.js uses the same rule). */
export function maxShapes() { return Math.max(1200, Math.min(3000, Math.round(window.innerWidth * 1.5))); }

// --- URLs -------------------------------------------------------------------------------------
export const url = {
  traces: () => "/api/traces",
  trace: (id) => `/api/traces/${enc(id)}`,
  graph: (id, g) => `/api/traces/${enc(id)}/graphs/${enc(g)}`,
  /** A download of the whole trace: format "chrome" (Perfetto, chrome://tracing), "jsonl" or "csv". */
  export: (id, format) => `/api/traces/${enc(id)}/export?format=${enc(format)}`,
  memoryMap: (id, g, win = {}, shapes = maxShapes()) => {
    const q = new URLSearchParams();
    for (const k of ["x0", "x1", "y0", "y1"]) if (win[k] !== undefined && win[k] !== null) q.set(k, win[k]);
    q.set("max_shapes", shapes);
    return `${url.graph(id, g)}/memory-map?${q}`;
  },
  events: (id, g, { start = 0, limit = 200, kind = "", tensor = "" } = {}) => {
    const q = new URLSearchParams({ start, limit });
    if (kind) q.set("kind", kind);
    if (tensor) q.set("tensor", tensor);
    return `${url.graph(id, g)}/events?${q}`;
  },
  diff: (a, b) => `/api/diff?a=${enc(a)}&b=${enc(b)}`,
};

// --- shapes of the answers ----------------------------------------------------------------------
/**
 * @typedef {{offset: number, size: number|null, chunk: number}} FreeBlock  size null: a measure run's endless last block
 * @typedef {{event: number|null, tensor: string, needed: number, largest: number}} Oom
 * @typedef {{index: number, role: string, n_events: number, max_size: number|null, buffer_size: number|null,
 *            oom: Oom|null, consistent: boolean|null}} GraphSummary
 * @typedef {{id: string, name: string, source: string, generation: string, profile: string, created: string,
 *            tags: string[], graphs: GraphSummary[]}} TraceSummary
 */
function freeBlock(b) {
  return Array.isArray(b) ? { offset: b[0], size: b[1], chunk: b[2] ?? 0 } : { offset: b.offset, size: b.size, chunk: b.chunk ?? 0 };
}

/** The three spellings of an out-of-space failure (graph summary, memory map, diff) as one Oom. */
function oom(o) {
  if (!o) return null;
  return { ...o, event: o.event ?? null, tensor: o.tensor ?? "", needed: o.needed,
    largest: o.largest_available ?? o.largest_free ?? o.largest,
    free_blocks: o.free_blocks ? o.free_blocks.map(freeBlock) : undefined };
}

function traceSummary(t) { return { ...t, graphs: (t.graphs || []).map((g) => ({ ...g, oom: oom(g.oom) })) }; }

// --- traces -------------------------------------------------------------------------------------
/** @returns {Promise<TraceSummary[]>} newest first */
export async function listTraces() { return ((await call(url.traces())).traces || []).map(traceSummary); }

/** @returns {Promise<TraceSummary>} */
export async function getTrace(id) { return traceSummary(await call(url.trace(id))); }

/**
 * Every graph of a trace at a glance: {graphs: [{index, role, n_events, high_water (the graph's own),
 * max_size, buffer_size, oom: Oom|null}]}.
 */
export async function overview(id) {
  const o = await call(`${url.trace(id)}/overview`);
  return { graphs: (o.graphs || []).map((g) => ({ ...g, oom: oom(g.oom) })) };
}

export function deleteTrace(id) { return call(url.trace(id), { method: "DELETE" }); }

/**
 * Upload a log or export; onProgress(fraction) while sending. Resolves to the stored TraceSummary list.
 * (XMLHttpRequest, because fetch reports no upload progress.)
 */
export function uploadTrace(file, name, onProgress) {
  return new Promise((resolve, reject) => {
    const form = new FormData();
    form.append("file", file, file.name);
    if (name) form.append("name", name);
    const xhr = new XMLHttpRequest();
    xhr.open("POST", url.traces());
    xhr.setRequestHeader("Accept", "application/json");
    xhr.upload.addEventListener("progress", (e) => { if (e.lengthComputable && onProgress) onProgress(e.loaded / e.total); });
    xhr.addEventListener("load", () => {
      let body = null;
      try { body = JSON.parse(xhr.responseText); } catch (_) { body = null; }
      if (xhr.status >= 200 && xhr.status < 300) resolve(((body && body.traces) || []).map(traceSummary));
      else reject(new ApiError(xhr.status, detailText(body, xhr.status)));
    });
    xhr.addEventListener("error", () => reject(new ApiError(0, "the server could not be reached")));
    xhr.send(form);
  });
}

// --- one graph ------------------------------------------------------------------------------------
/**
 * A page of events. Each event has `i` (its index in the graph) and `kind`, and, when the event carries
 * them: tensor, op, size, offset, block, chunk, parent, n_free, largest_free, total_free, needed, largest.
 * @returns {Promise<{total: number, start: number, events: object[]}>}
 */
export async function events(id, g, query = {}) {
  const body = await call(url.events(id, g, query));
  return { total: body.total, start: body.start, events: body.events || [] };
}

/** The graph's first out-of-space event index, or null. */
export async function oomEvent(id, g) {
  const page = await events(id, g, { kind: "oom", limit: 1 });
  return page.events.length ? page.events[0].i : null;
}

/**
 * Tensor lifetimes in a window. shapes: {x0, x1, y0, y1, n (tensors merged into this one), tensor, op,
 * size, offset, chunk}; x1 is the event that freed the bytes (n_events: never freed). freeList: one point
 * per event bucket {x, used, n_free, largest_free, total_free}. yExtent: the highest byte this graph's own
 * tensors reach (its high water); maxSize: the allocator's max_size (legacy: a running maximum across graphs).
 */
export async function memoryMap(id, g, win = {}, shapes = maxShapes()) {
  const m = await call(url.memoryMap(id, g, win, shapes));
  return { nEvents: m.n_events, window: m.window, yExtent: m.y_extent, chunks: m.chunks || [],
    shapes: m.shapes || [], reduced: !!m.reduced, totalInView: m.total_in_view, freeList: m.free_list || [],
    maxSize: m.max_size, bufferSize: m.buffer_size, oom: oom(m.oom) };
}

/**
 * The allocator state after the first `applied` events (applied = i: what event i saw before it ran).
 * live: {tensor, op, offset, size, chunk}; freeBlocks: FreeBlock[]; freeSummary: {n_blocks, largest, total}.
 */
export async function state(id, g, applied) {
  const s = await call(`${url.graph(id, g)}/state?event=${enc(applied)}`);
  return { applied: s.event, live: s.live || [], freeBlocks: (s.free_blocks || []).map(freeBlock),
    liveBytes: s.live_bytes, freeSummary: s.free_summary || null, next: s.next_event || null };
}

// --- diff, replay, presets ------------------------------------------------------------------------------
/**
 * Two graphs (refs "ID:G") compared. firstDivergence: {event_a, event_b, tensor, fields, words, a, b} where
 * a/b are the choices {event, kind, tensor, size, block, offset, block_size, block_offset, parent, freeBlocks
 * (the free list the allocator searched, before the choice)}. freeListsDiffer: {event_a, event_b, tensor,
 * words, a, b: {freeBlocks, n_blocks, largest, total}}. a/b: {label, events, allocs, reuses, frees,
 * high_water, max_size, peak_live, capacity, oom}. deltas: {offsets, sizes, reuse, reuse_count, ...}.
 * sizeAttribution: {a_bytes, b_bytes, delta, families: [{family, a, b, delta, status}], fragmentation_delta}.
 */
export async function diff(a, b) {
  const d = await call(url.diff(a, b));
  if (d.kind === "torch") return { torch: d };  // two PyTorch snapshots: the aligned call-site diff as is
  const choice = (c) => (c ? { ...c, freeBlocks: (c.free_blocks || []).map(freeBlock) } : {});
  const side = (s) => ({ ...(s || {}), oom: oom(s && s.oom) });
  const fd = d.first_divergence;
  const ffl = d.first_free_list_divergence;
  return {
    firstDivergence: fd ? { ...fd, a: choice(fd.a), b: choice(fd.b) } : null,
    freeListsDiffer: ffl ? { ...ffl, a: choice(ffl.a), b: choice(ffl.b) } : null,
    a: side(d.a), b: side(d.b), deltas: d.deltas || {}, aligned: d.aligned || null,
    sizeAttribution: d.size_attribution || null,
    // "size": a and b are different programs or settings, and the size attribution is the answer
    lead: d.lead || "divergence",
  };
}

/** {presets: [{name, family, description, n_ctx, n_batch, hparams}], profiles: [name]} */
export function presets() { return call("/api/presets"); }

/**
 * Run a replay: {preset, profile, n_ctx, n_batch, eval_tokens?, n_past?, metal_concurrency}. Resolves to
 * {traceId, measure: {max_size, compute_buffer_total}, eval: {max_size, oom}, firstDivergence, reused}
 * where reused is true when an identical replay was already stored (its trace is returned).
 */
export async function replay(request) {
  const body = await post("/api/replay", request);
  const r = body.replay || {};
  return { traceId: (r.measure && r.measure.trace_id) || (body.traces[0] && body.traces[0].id),
    measure: r.measure || {}, eval: r.eval || {}, firstDivergence: r.first_divergence || null, reused: !!body.reused };
}

/**
 * Whether the model reproduced a graph (a recording's placements and sizes, a log's choices), and where not:
 * {consistent (null: not checked), n_mismatches, mismatches: [text], offsets: [{tensor, model_offset,
 * real_offset, buffer, chunk, graph?}] (null offset: that side placed none; graph: the eval that used this
 * reserve's plan), plan_checked, placements, map_from ("model" or "recorded placements"), buffer_types: [name]}.
 */
export async function consistency(id, g) {
  const c = await call(`${url.graph(id, g)}/consistency`);
  return { consistent: c.consistent ?? null, n_mismatches: c.n_mismatches ?? 0, mismatches: c.mismatches || [],
    offsets: c.offsets || [], plan_checked: c.plan_checked ?? null, placements: c.placements ?? null,
    map_from: c.map_from || "model",
    buffer_types: c.buffer_types || [] };
}

// --- peak and sweep (docs/explain.md) -------------------------------------------------------------------
/**
 * What is live at a graph's high-water mark. peak: {event (null: nothing allocated), bytes, tensor,
 * live_bytes}; families: [{family, tensors, bytes, share, first_node, last_node, shape?: {type, ne, bytes,
 * formula} (recordings)}] largest first; fragmentation: {free_below_peak, largest_hole, holes: [{offset, bytes,
 * freed: [{tensor, label?, bytes, freed_at}]}]}; failure: null or {event, tensor, needed, largest, free,
 * largest_hole}; tensors: [{tensor, family, op, bytes, offset, chunk, y0 (offset on the map), start, end}].
 */
export async function peak(id, g) {
  const p = await call(`${url.graph(id, g)}/peak`);
  const f = p.failure;
  return { peak: p.peak || { event: null }, families: p.families || [], tensors: p.tensors || [],
    fragmentation: p.fragmentation || { free_below_peak: 0, largest_hole: 0 },
    failure: f ? { ...f, largest: f.largest_available ?? f.largest } : null };
}

/**
 * One replay per (profile, n_ctx, n_batch): request {preset, profile, n_ctx, n_batch, metal_concurrency}
 * (profile, n_ctx, n_batch comma-separated). points: [{profile, n_ctx, n_batch, max_size (null: refused),
 * oom (boolean), top_families: [{family, bytes}], error}]; oomOnset: [{profile, n_ctx, n_batch, oom: Oom|null}]
 * (the first failing point per profile).
 */
export async function sweep(request) {
  const q = new URLSearchParams();
  for (const k of ["preset", "profile", "n_ctx", "n_batch", "metal_concurrency"]) {
    if (request[k] !== undefined && request[k] !== null && request[k] !== "") q.set(k, request[k]);
  }
  const s = await call(`/api/sweep?${q}`);
  return { points: (s.points || []).map((p) => ({ ...p, top_families: p.top_families || [] })),
    oomOnset: (s.oom_onset || []).map((o) => ({ ...o, oom: oom(o.oom) })) };
}

// --- tagged runs: history and compare (docs/team.md) ------------------------------------------------------
const tagQuery = (q, tags) => { for (const t of tags || []) q.append("tag", t); return q; };

/**
 * Buffer size per commit for the traces carrying every tag of `tags` (["model=llama"]): {key, total (commits),
 * offset, limit, commits: [{value, order}], series: [{label, config, buffer, points: [{commit, size, trace,
 * graph}]}], jumps: [{label, buffer, base, head, base_size, head_size, delta}]} (largest change first).
 */
export function history(tags, { key = "commit", offset = 0, limit = 50 } = {}) {
  const q = tagQuery(new URLSearchParams({ key, offset: String(offset), limit: String(limit) }), tags);
  return call(`/api/history?${q}`);
}

/**
 * Two commits compared (`alloctrace compare --json`): base/head are tag lists; `tags` narrows both sides.
 * {failed, threshold, pairs: [{tags, base, head, grew, buffers: [{buffer, base, head, delta, cause,
 * attribution: {families: [{family, a, b, delta, status}], fragmentation_delta, ...} | null}]}], only_base, only_head}
 */
export function compare(base, head, tags = [], threshold = "0") {
  const q = new URLSearchParams({ threshold });
  for (const t of base) q.append("base", t);
  for (const t of head) q.append("head", t);
  return call(`/api/compare?${tagQuery(q, tags)}`);
}

/** Every key=value tag in the store: {tags: {key: {value: count}}}. */
export function storeTags() { return call("/api/tags"); }

/** Recorded sweeps (`alloctrace sweep --vary`): [{sweep, points, name, created}], newest first. */
export async function recordedSweeps() { return (await call("/api/sweeps")).sweeps || []; }

/**
 * A recorded sweep: {sweep, vary: [[flag, [values]]], points: [{values: {flag: value}, buffers: {buffer type:
 * bytes}, consistent, trace, graph, families: [{family, bytes, tensor, type, ne}], printed, error}], laws:
 * [{family, law: {formula, ...}|null, by_setting}], dominance, neighbours: [{axis, setting, a, b, a_trace,
 * b_trace, a_graph, b_graph, delta, families}]}.
 */
export function recordedSweep(id) { return call(`/api/sweeps/${enc(id)}`); }

/** Stored pre-flight results (sweeps, fits, plan --vary searches): [{id, kind, name, points, created}]. */
export async function preflights() { return (await call("/api/preflight")).results || []; }

/**
 * A pre-flight result as curves: {id, kind: "sweep"|"fit"|"plan", axis, budget, stored_budget, range, curves:
 * [{name, kind, setting, points: [{x, bytes, uncertainty_bytes, measured, oom, trace}], law: {formula,
 * intercept, slope, exact}|null, predicted: [{x, bytes, uncertainty_bytes}]}], answers: [{setting, value,
 * bytes, law_value}], traces}. `budget` (a size such as 8GiB) answers for another budget.
 */
export function preflight(id, budget = null) {
  return call(`/api/preflight/${enc(id)}${budget ? `?budget=${enc(budget)}` : ""}`);
}

// --- PyTorch snapshots (docs/torch.md) ----------------------------------------------------------------------
// Fields are passed on as the server names them (snake_case); each function lists the ones pages read.
const torchTrace = (id) => `/api/torch/traces/${enc(id)}`;
const torchDevice = (id, d) => `${torchTrace(id)}/devices/${enc(d)}`;
const withSkip = (q, skip) => { if (skip !== null && skip !== undefined) q.set("skip", skip); return q; };

/** Timeline request sizes (prefetch.js asks for the same first view). */
export const TORCH_TIMELINE = { max_points: 800, max_bands: 120, frames: 8 };  // frames: each band's stack, for hover

export const torchUrl = {
  trace: torchTrace,
  /** The first timeline (no window, no skip): what the page draws first. */
  timeline: (id, d, { x0, x1, skip } = {}) => {
    const q = new URLSearchParams({ max_points: TORCH_TIMELINE.max_points, max_bands: TORCH_TIMELINE.max_bands, frames: TORCH_TIMELINE.frames });
    if (x0 !== undefined && x0 !== null) { q.set("x0", x0); q.set("x1", x1); }
    return `${torchDevice(id, d)}/timeline?${withSkip(q, skip)}`;
  },
};

/**
 * Upload a snapshot (.pickle, .gz, .zst). Resolves to the stored traces [{id, name, source, devices}].
 */
export async function uploadSnapshot(file) {
  const form = new FormData();
  form.append("file", file, file.name);
  return (await call("/api/torch/traces", { method: "POST", body: form })).traces || [];
}

/**
 * A snapshot's summary: {id, name, devices: [{device, n_events, peak_requested, peak_requested_event,
 * peak_reserved, n_segments, n_stacks, trace_matches_snapshot, trace_complete, oom_events: [entry],
 * consistent: the caching-allocator model's replay matched (absent: not checked), first_mismatch}]}.
 */
export function torchSummary(id) { return call(torchTrace(id)); }

/**
 * Active memory over entries x0..x1: {x0, x1, n_events, grid, allocated_max, reserved_max, bands: [{x, base,
 * size, alloc, free, site, meta}], omitted_allocations, annotations: [{kind, name, x0, x1}]}.
 */
export function torchTimeline(id, d, win = {}) { return call(torchUrl.timeline(id, d, win)); }

/** One entry with its stack: {i, size, site, meta, addr, stream, frames: [{name, filename, line}]}. */
/** The largest allocations live after entry k: {after_entry, largest: [{bytes, entry, addr, site}]}. */
export async function torchLive(id, d, k, skip = null, top = 10) {
  return call(`${torchDevice(id, d)}/live?${withSkip(new URLSearchParams({ at: k, top }), skip)}`);
}

export async function torchEntry(id, d, k, skip = null) {
  const q = withSkip(new URLSearchParams({ start: k, limit: 1, frames: "true" }), skip);
  return ((await call(`${torchDevice(id, d)}/entries?${q}`)).entries || [])[0] || null;
}

/**
 * The OOM card or null: {event, requested, allocated, reserved, cached, largest_free: {large, small},
 * device_free, cache_releases: [{segments, bytes, first, end}], meta, site, holders: [{bytes, share, count, site}]}.
 */
export async function torchOom(id, d, skip = null) {
  return (await call(`${torchDevice(id, d)}/oom?${withSkip(new URLSearchParams(), skip)}`)).oom || null;
}

/** The memory flamegraph at an entry ("peak", "oom", "end" or a number): {event, bytes, live_allocations, svg}. */
export function torchFlame(id, d, at = "peak", skip = null) {
  const q = new URLSearchParams({ at: String(at) });
  return call(`${torchDevice(id, d)}/flame?${withSkip(q, skip)}`);
}

/** The ranks (devices) of a trace side by side: {ranks: [{rank, peak_requested, ..., series}], oom_ranks, compared}. */
export function torchRanks(id, skip = null) {
  return call(`/api/torch/traces/${enc(id)}/ranks?${withSkip(new URLSearchParams(), skip)}`);
}

/** Live allocations at the peak: {event, peak_requested, live_allocations, by_call_site: [{bytes, share, count, site}]}. */
export function torchPeak(id, d, skip = null) {
  return call(`${torchDevice(id, d)}/peak?${withSkip(new URLSearchParams(), skip)}`);
}

/**
 * Segments and blocks after `event` entries: {event, truncated, totals: {segments, reserved, allocated,
 * requested, cached, pending_free, largest_free: {large, small}}, next: {action, size}|null, segments: [{pool,
 * size, site, blocks: [{state, offset, size, site, alloc}]}]} (site: null where unknown).
 */
export function torchState(id, d, event, skip = null) {
  const q = withSkip(new URLSearchParams({ event, max_blocks: 20000 }), skip);
  return call(`${torchDevice(id, d)}/state?${q}`);
}

/**
 * Two snapshots (refs ID or ID:DEVICE): {a, b: {name, peak_requested, peak_reserved}, delta_requested,
 * decomposition: {resized: {bytes, count, changed}, only_a: {bytes}, only_b: {bytes}}, reserved:
 * {delta_peak_reserved, delta_requested_peak}, by_call_site: [{a_bytes, b_bytes, delta, a_count, b_count, site}],
 * alignment: {paired, same_sequence, first_divergence, in_order, only_a, only_b, same_size, grew, shrank,
 * size_ratio: {median}, sequence: {index, a_bytes, b_bytes}|null}}.
 */
export function torchDiff(a, b) { return call(`/api/torch/diff?a=${enc(a)}&b=${enc(b)}`); }

/**
 * One device replayed through the caching-allocator model, as recorded and under other settings (docs/api.md).
 * `settings`: PYTORCH_CUDA_ALLOC_CONF-style "KEY=VALUE" strings (expandable_segments=true, max_split_size_mb=128,
 * roundup_power2_divisions=4, garbage_collection_threshold=0.8, release_cached_on_oom=false, device_memory=80GiB);
 * `cap`: the what-if run's memory cap ("6GiB", "fraction:0.5", "50%", "none"; "" keeps the recorded one);
 * `points`: buckets of the curves (each a bucket's maximum, so peaks survive).
 * Answer: {trace_id, device, settings, recorded_settings,
 *   real: {peak_reserved, peak_allocated, fragmentation_at_peak, oom: {event, size}|null, consistent,
 *          mismatch: {event, expected, model, reason}|null},
 *   whatif: {peak_reserved, peak_allocated, fragmentation_at_peak, oom, stopped_at: entry|null, avoided_ooms: [entry]},
 *   series: {n_events, event, real_reserved, real_allocated, whatif_reserved, whatif_allocated, whatif_stopped_at}}.
 */
export function torchWhatIf(id, d, { settings = [], cap = "", points = 600 } = {}) {
  const q = new URLSearchParams();
  for (const s of settings) q.append("set", s);
  if (cap) q.set("cap", cap);
  q.set("points", points);
  return call(`${torchDevice(id, d)}/whatif?${q}`);
}

/** The server's OpenAPI description (what /docs renders): {paths: {path: {method: {summary, description, parameters}}}}. */
export const apiSchema = () => call("/openapi.json");
