"""Replay a real program's allocation flow on a preset: measure, size the buffer, eval.

The flow of llama.cpp's `llama_new_context_with_model` + `llama_eval_internal`
and of gpt-2's `main` (Aug 2023): build the worst-case graph and allocate it
with a measure allocator (with Metal, after computing the concurrency list on
it); allocate a real buffer of max_size plus one alignment; build the eval
graph and allocate it in that buffer with the same parse_seq. Everything the
allocators decided is kept as events, so the two runs can be stored and diffed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from alloctrace.allocator.layout import get_layout
from alloctrace.allocator.legacy import LegacyAllocator
from alloctrace.allocator.presets import Preset, family_of, get_preset, with_hparams
from alloctrace.allocator.presets.space import AddressSpace
from alloctrace.allocator.profiles import get_profile, names as profile_names
from alloctrace.traces.util import verbose
from alloctrace.traces.errors import UserError
from alloctrace.allocator.tensor import Graph
from alloctrace.metal_exec import ConcurrencyReport, find_concurrency, report
from alloctrace.metal_exec.plan import Plan, plan_from_legacy
from alloctrace.traces.store.schema import GraphRecord, TraceMeta, oom_of

EXIT_OOM = 3  # the replay ran and an allocator failed


@dataclass
class Run:
    """One graph built and allocated as the program did."""

    role: str
    n_tokens: int
    n_past: int
    alloc: LegacyAllocator
    n_nodes: int
    n_leafs: int
    explicit: list  # names of the tensors allocated before the walk (as named after the build)
    buffer_base: int | None = None
    buffer_size: int | None = None
    graph: object = None  # the Graph that was walked (for plan checks and execution)

    @property
    def max_size(self) -> int:
        return self.alloc.t.max_size

    @property
    def events(self) -> list:
        return self.alloc.events


@dataclass
class ReplayResult:
    preset: Preset
    profile: str
    layout: str
    measure: Run
    eval: Run
    parse_seq: list | None
    concurrency: ConcurrencyReport | None
    compute_buffer_total: int
    trace_id: object = None
    first_divergence: dict | None = None
    notes: list = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.measure.alloc.failed is not None or self.eval.alloc.failed is not None

    def to_json(self) -> dict:
        return {
            "preset": self.preset.name,
            "profile": self.profile,
            "parse_seq_len": len(self.parse_seq) if self.parse_seq is not None else None,
            "measure": {"max_size": self.measure.max_size, "compute_buffer_total": self.compute_buffer_total,
                        "compute_buffer_total_mb": f"{self.compute_buffer_total / 1024 / 1024:.2f}",
                        "trace_id": self.trace_id},
            "eval": {"max_size": self.eval.max_size, "oom": oom_of(self.eval.alloc.failed),
                     "trace_id": self.trace_id},
            "first_divergence": self.first_divergence,
        }


def _positive(name, value, minimum=1):
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise UserError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _build(fam, model, role, n_tokens, n_past, alloc, profile, graph_index) -> tuple:
    alloc.graph_index = graph_index
    explicit = []

    def explicit_alloc(t):
        explicit.append(t)
        alloc.alloc_tensor(t)

    graph = fam.build_graph(model, n_tokens, n_past, explicit_alloc, profile)
    return graph, explicit


def replay(preset, profile: str, n_ctx: int | None = None, n_batch: int | None = None,
           eval_tokens: int | None = None, n_past: int | None = None, metal_concurrency: bool = False,
           layout: str | None = None, hparams: dict | None = None, buffer_size: int | None = None) -> ReplayResult:
    """Measure then eval, as the program did. `layout` defaults to macos-metal with Metal, else linux;
    `buffer_size` replaces the program's own sizing (max_size plus padding) of the real buffer."""
    try:
        p = preset if isinstance(preset, Preset) else get_preset(preset)
        p = with_hparams(p, hparams or {})
        prof = get_profile(profile)
        lay = get_layout(layout or ("macos-metal" if metal_concurrency else "linux"))
    except ValueError as e:
        raise UserError(str(e)) from None
    verbose.note("generation profile", f"{prof.name} (preset {p.name}, layout {lay.name})")
    if not prof.presets:
        raise UserError(f"profile {profile} cannot run the presets: they replay the programs of Aug 2023 "
                        f"({profile_names(presets_only=True)})")
    fam = family_of(p)
    n_ctx = _positive("n_ctx", p.n_ctx if n_ctx is None else n_ctx)
    n_batch = _positive("n_batch", p.n_batch if n_batch is None else n_batch)
    m_tokens, m_past = fam.measure_shape(n_ctx, n_batch)
    e_tokens = _positive("eval_tokens", m_tokens if eval_tokens is None else eval_tokens)
    e_past = _positive("n_past", m_past if n_past is None else n_past, minimum=0)
    if e_past + e_tokens > n_ctx:
        raise UserError(f"n_past + eval_tokens = {e_past + e_tokens} exceeds n_ctx {n_ctx}")
    if p.family == "gpt2" and n_ctx > p.hparams.n_ctx:
        raise UserError(f"n_ctx {n_ctx} exceeds the model's context {p.hparams.n_ctx}")

    try:
        model = fam.new_model(p.hparams, n_ctx, profile)
    except ValueError as e:
        raise UserError(str(e)) from None
    space = AddressSpace()
    fam.place_model(model, lay, space)

    measure = LegacyAllocator.measure(prof, fam.ALIGNMENT)
    graph, explicit = _build(fam, model, "measure", m_tokens, m_past, measure, profile, 0)
    seq = find_concurrency(graph) if metal_concurrency else None
    measure.alloc_graph(graph, parse_seq=seq, graph_index=0)
    m_run = Run("measure", m_tokens, m_past, measure, graph.n_nodes, graph.n_leafs, [t.name for t in explicit],
                graph=graph)

    size = buffer_size or measure.t.max_size + fam.BUFFER_PAD
    base = space.reserve("compute", lay.buffer_base, size)
    real = LegacyAllocator.real(prof, base, size, fam.ALIGNMENT)
    if measure.failed is None:
        graph, explicit = _build(fam, model, "eval", e_tokens, e_past, real, profile, 1)
        real.alloc_graph(graph, parse_seq=seq, graph_index=1)
        e_run = Run("eval", e_tokens, e_past, real, graph.n_nodes, graph.n_leafs, [t.name for t in explicit],
                    base, size, graph)
    else:
        e_run = Run("eval", e_tokens, e_past, real, 0, 0, [], base, size)

    total = size + (fam.metadata_bytes(prof) if hasattr(fam, "metadata_bytes") else 0)
    result = ReplayResult(p, profile, lay.name, m_run, e_run, seq, report(seq) if seq is not None else None, total)
    result.first_divergence = _first_divergence(result)
    return result


def _records(r: ReplayResult) -> list[GraphRecord]:
    common = {"preset": r.preset.name, "layout": r.layout, "parse_seq_len": len(r.parse_seq or []) or None}
    return [
        GraphRecord(0, "measure", r.measure.events, max_size=r.measure.max_size, oom=oom_of(r.measure.alloc.failed),
                    extra={**common, "n_tokens": r.measure.n_tokens, "n_past": r.measure.n_past,
                           "alignment": r.measure.alloc.t.alignment, "label": "measure"}),
        GraphRecord(1, "eval", r.eval.events, max_size=r.eval.max_size, buffer_size=r.eval.buffer_size,
                    oom=oom_of(r.eval.alloc.failed),
                    extra={**common, "n_tokens": r.eval.n_tokens, "n_past": r.eval.n_past,
                           "alignment": r.eval.alloc.t.alignment, "buffer_base": r.eval.buffer_base,
                           "label": "eval"}),
    ]


def _first_divergence(r: ReplayResult):
    try:
        from alloctrace.traces.diff.graphs import diff_graphs
    except ImportError:
        return None
    a, b = _records(r)
    return diff_graphs(a.events, b.events, a, b).to_json()["first_divergence"]


def store_result(r: ReplayResult, store, tags=()) -> object:
    """Both graphs as one trace (graph 0 measure, graph 1 eval); `store` is a path or an open store;
    `tags` (key=value) are added to the trace's own."""
    if isinstance(store, (str, Path)):
        try:
            from alloctrace.traces.store.store import open_store
        except ImportError:
            raise UserError("the trace store is not available in this installation") from None
        opened = open_store(store)
        try:
            return store_result(r, opened, tags)
        finally:
            opened.close()
    meta = TraceMeta(
        name=f"replay {r.preset.name} {r.profile}" + (" metal" if r.parse_seq is not None else ""),
        source="replay", generation=r.profile, profile=r.profile, tags=["replay", r.preset.name, *tags],
        extra={"preset": r.preset.to_json(), "layout": r.layout, "measure_tokens": r.measure.n_tokens,
               "measure_n_past": r.measure.n_past, "eval_tokens": r.eval.n_tokens, "eval_n_past": r.eval.n_past,
               "parse_seq_len": len(r.parse_seq) if r.parse_seq is not None else None,
               "compute_buffer_total": r.compute_buffer_total})
    r.trace_id = store.add_trace(meta, _records(r))
    return r.trace_id


def run_replay(preset, profile: str, n_ctx: int | None = None, n_batch: int | None = None,
               eval_tokens: int | None = None, n_past: int | None = None, metal_concurrency: bool = False,
               store=None, layout: str | None = None, hparams: dict | None = None) -> dict:
    """Replay and (optionally) store; returns the JSON summary the CLI prints."""
    r = replay(preset, profile, n_ctx=n_ctx, n_batch=n_batch, eval_tokens=eval_tokens, n_past=n_past,
               metal_concurrency=metal_concurrency, layout=layout, hparams=hparams)
    if store is not None:
        store_result(r, store)
    return r.to_json()


# --- plans for model presets, for the hazard checker and the executor (metal_exec) --------------
def _op_params(graph: Graph, n_past: int) -> dict:
    """Scalar parameters the Tensor model does not carry: the 2023 graphs' n_past for mask and rope."""
    return {t.name: {"n_past": n_past} for t in graph.nodes if t.op in ("DIAG_MASK_INF", "ROPE")}


def preset_plans(name: str, profile_name: str, metal_concurrency: bool = False, serial: bool = False,
                 hparams: dict | None = None, buffer_size: int | None = None, n_ctx: int | None = None,
                 eval_shape: tuple | None = None, layout: str | None = None,
                 expect_max_size: int | None = None) -> list[Plan]:
    """The eval graph of a preset, planned as the program did (`replay` above: measure the worst case,
    with Metal's parse_seq when asked, then the eval graph in a buffer of max_size plus padding).

    eval_shape is (n_tokens, n_past) of the eval graph (default: the measured shape);
    expect_max_size makes a rebuilt run prove it matches a stored one."""
    e_tokens, e_past = eval_shape or (None, None)
    try:
        r = replay(name, profile_name, n_ctx=n_ctx, eval_tokens=e_tokens, n_past=e_past,
                   metal_concurrency=metal_concurrency, layout=layout, hparams=hparams, buffer_size=buffer_size)
    except UserError as e:
        raise ValueError(str(e)) from None
    if r.measure.alloc.failed:
        raise ValueError(f"the {profile_name} measure walk failed on {name}: {r.measure.alloc.failed.kind}")
    if expect_max_size is not None and r.eval.max_size != expect_max_size:
        raise ValueError(f"rebuilding {name} gives max_size {r.eval.max_size}, the stored run had {expect_max_size}")
    concurrent = False if serial else None
    run = r.eval if r.eval.alloc.failed is None else r.measure
    plan = plan_from_legacy(run.graph, run.alloc, r.parse_seq, concurrent, graph_index=0 if run is r.measure else 1)
    if run is r.measure:
        failed = r.eval.alloc.failed
        plan.note = f"the real allocation failed ({failed.kind} at {failed.tensor}); checking the measure plan"
    plan.params = _op_params(plan.graph, run.n_past)
    return [plan]
