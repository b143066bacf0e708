"""The `check` use case: the allocation plans to check for memory hazards (a harness graph, a model preset, or
a stored replay rebuilt from its description), whether a numeric run of them fits in memory, and the checks
themselves (metal_exec). The command line only parses, prints and draws progress."""
from __future__ import annotations

import json
from dataclasses import dataclass

from alloctrace.traces.errors import UserError
from alloctrace.traces.util.sizes import fmt_bytes

MEMORY_SHARE = 0.75  # of MemAvailable, when no --max-memory is given: leave the rest to other programs


@dataclass
class PlanRequest:
    """What to check, as a user named it: exactly one of trace_id, harness (a JSON path) or preset."""
    trace_id: str | None = None
    harness: str | None = None
    preset: str | None = None
    profile: str = ""
    parse_seq: bool = False
    metal_concurrency: bool = False
    serial: bool = False
    buffer_size: int | None = None
    hparams: dict | None = None
    store: str | None = None


# --- graph sources ---------------------------------------------------------------------------
def harness_plans(req: PlanRequest) -> list:
    from alloctrace.metal_exec.plan import harness_plans as plans_of

    try:
        with open(req.harness) as f:
            desc = json.load(f)
    except OSError as e:
        raise UserError(f"cannot read {req.harness}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{req.harness} is not JSON: {e.msg} (line {e.lineno})") from None
    if not isinstance(desc, dict) or not ("nodes" in desc or "graphs" in desc):
        raise UserError(f"{req.harness} is not a harness graph description (no nodes or graphs)")
    try:
        return plans_of(desc, req.profile, req.parse_seq, concurrent=False if req.serial else None,
                        buffer_size=req.buffer_size)
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise UserError(f"{req.harness}: {e}") from None


def preset_plans(req: PlanRequest) -> list:
    """The eval graph of a model preset, planned as the program did (measure, then the real buffer)."""
    from alloctrace.traces.replay.run import preset_plans as plans_of

    try:
        return plans_of(req.preset, req.profile, metal_concurrency=req.metal_concurrency, serial=req.serial,
                        hparams=req.hparams or {}, buffer_size=req.buffer_size)
    except ValueError as e:
        raise UserError(str(e)) from None


def trace_plans(req: PlanRequest) -> list:
    """A stored replay trace: its preset run is rebuilt and must reproduce the stored eval max_size.

    Traces imported from logs keep events, not tensor shapes and sources, so they cannot be checked."""
    from alloctrace.traces.replay.run import preset_plans as plans_of
    from alloctrace.traces.store.store import open_store

    store = open_store(req.store, create=False)
    try:
        tid, _ = store.resolve(req.trace_id)
        meta = store.meta(tid)
        preset = (meta.extra or {}).get("preset")
        if meta.source != "replay" or not preset:
            raise UserError(f"trace {tid} came from {meta.source}: it holds allocator events but not the graph's "
                            f"shapes, so it cannot be checked; check its preset or harness graph instead")
        graphs = store.summary(tid)["graphs"]
        stored_eval = next((g for g in graphs if g["role"] == "eval"), None)
    finally:
        store.close()
    x = meta.extra
    try:
        return plans_of(preset["name"].removesuffix("(custom)"), meta.profile or meta.generation,
                        metal_concurrency=x.get("parse_seq_len") is not None, serial=req.serial,
                        hparams=preset.get("hparams"), n_ctx=x["measure_tokens"] + x["measure_n_past"],
                        eval_shape=(x["eval_tokens"], x["eval_n_past"]), layout=x.get("layout"),
                        expect_max_size=stored_eval["max_size"] if stored_eval else None)
    except (KeyError, TypeError) as e:
        raise UserError(f"trace {tid}: its replay description is incomplete ({e})") from None
    except ValueError as e:
        raise UserError(f"trace {tid}: {e}") from None


def plans_for(req: PlanRequest) -> list:
    """The plans `req` names, after checking that it names exactly one source and a known profile."""
    from alloctrace.allocator.profiles import PROFILES

    given = [x for x in (req.trace_id, req.harness, req.preset) if x]
    if len(given) != 1:
        raise UserError("give exactly one of TRACE_ID, --harness JSON or --preset NAME")
    if req.metal_concurrency and not req.preset:
        raise UserError("--metal-concurrency needs --preset (a harness graph brings its own parse_seq)")
    if req.profile not in PROFILES:
        raise UserError(f"unknown profile {req.profile!r}; known: {', '.join(PROFILES)}")
    if req.harness:
        return harness_plans(req)
    if req.preset:
        return preset_plans(req)
    return trace_plans(req)


# --- memory ----------------------------------------------------------------------------------
def mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_limit(max_memory: int | None) -> tuple[int | None, str]:
    """(bytes a numeric run may allocate, how that limit was chosen)."""
    if max_memory:
        return max_memory, "--max-memory"
    avail = mem_available()
    if avail is None:
        return None, ""
    return (int(avail * MEMORY_SHARE),
            f"{int(MEMORY_SHARE * 100)}% of MemAvailable {fmt_bytes(avail)}; --max-memory sets another")


def reduced(hp: dict, div: int) -> dict:
    """The preset's shape at 1/div of its heads, widths and vocabulary, two layers at most; heads keep
    their width, so every head count still divides the embedding."""
    out = dict(hp)
    if "n_layer" in out:
        out["n_layer"] = min(int(out["n_layer"]), 2)
    if "n_head" in out and "n_embd" in out:
        head_dim = int(out["n_embd"]) // int(out["n_head"])
        out["n_head"] = max(1, int(out["n_head"]) // div)
        out["n_embd"] = head_dim * out["n_head"]
        if "n_head_kv" in out:
            kv = max(1, int(out["n_head_kv"]) // div)
            out["n_head_kv"] = kv if out["n_head"] % kv == 0 else 1
    for k in ("n_ff", "n_vocab"):
        if k in out:
            out[k] = max(8, int(out[k]) // div)
    return out


def smaller_variant(req: PlanRequest, limit: int) -> str:
    """A reduced-dimension variant of the preset that fits in limit, as --hparam flags to paste."""
    from alloctrace.allocator.presets import PRESETS
    from alloctrace.metal_exec.execute import estimate_bytes
    from alloctrace.traces.replay.run import preset_plans as plans_of

    preset = PRESETS.get(req.preset or "")
    if preset is None:
        return "try a smaller graph (e.g. --preset gpt2-tiny)"
    base = {**vars(preset.hparams), **(req.hparams or {})}
    for div in (2, 4, 8, 16, 32, 64, 128):
        hp = reduced(base, div)
        changed = {k: v for k, v in sorted(hp.items()) if str(v) != str(getattr(preset.hparams, k, None))}
        try:
            plans = plans_of(req.preset, req.profile, metal_concurrency=req.metal_concurrency,
                             serial=req.serial, hparams={k: str(v) for k, v in changed.items()})
        except (ValueError, TypeError):
            continue
        need = max(map(estimate_bytes, plans))
        if need <= limit:
            flags = " ".join(f"--hparam {k}={v}" for k, v in changed.items())
            return f"a reduced {req.preset} fits: {flags} (about {fmt_bytes(need)})"
    return "try a smaller preset (e.g. --preset gpt2-tiny)"


def refuse_if_too_big(req: PlanRequest, plans: list, max_memory: int | None):
    """Refuse before allocating anything when the numeric run would not fit in memory."""
    from alloctrace.metal_exec.execute import estimate_bytes

    limit, why = memory_limit(max_memory)
    need = max(map(estimate_bytes, plans), default=0)
    if limit is not None and need > limit:
        raise UserError(f"--numeric would allocate about {fmt_bytes(need)} ({need:,} bytes), more than the "
                        f"{fmt_bytes(limit)} allowed ({why}); {smaller_variant(req, limit)}")


# --- the checks --------------------------------------------------------------------------------
def hazards(plan) -> list:
    from alloctrace.metal_exec.hazards import check
    return check(plan)


def hazard_summary(found: list) -> str:
    from alloctrace.metal_exec.hazards import summary
    return summary(found)


def numeric_run(plan, order: str, seed: int, on_node=None):
    """Execute the plan on a byte arena against a private-memory reference; an op the executor lacks is the
    user's error."""
    from alloctrace.metal_exec.execute import run as execute
    from alloctrace.metal_exec.kernels import UnsupportedOp

    try:
        return execute(plan, order=order, seed=seed, on_node=on_node)
    except UnsupportedOp as e:
        raise UserError(f"numeric run: {e}") from None


def describe_numeric(result) -> str:
    from alloctrace.metal_exec.execute import describe
    return describe(result)
