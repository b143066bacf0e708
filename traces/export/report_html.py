"""`alloctrace report`: one self-contained HTML file to share: every byte of data and script inside it (Plotly.js
from the installed plotly package), nothing loaded from anywhere, so it opens offline and in a mail client's
sandbox alike.

PyTorch traces: per device the active-memory timeline (the server's level of detail: per-cell maxima and the
largest allocations as bands), the peak by call site, the OOM card and the flamegraph at the peak (and at the
OOM); the ranks side by side when there are several. ggml traces: per graph the memory map (lifetimes merged
per grid cell beyond `MAX_SHAPES`), the peak by tensor family and the out-of-space failure. Each part is
bounded whatever the trace's size, so the file is too (about Plotly.js's 4.8 MB plus under 1 MB a device).
"""
from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path

from alloctrace.traces.errors import UserError
from alloctrace.traces.util.sizes import fmt_bytes

MAX_DETAILED = 4  # devices or graphs drawn in full; the rest appear in the summary tables
MAX_SHAPES = 3000
TIMELINE = {"max_points": 1500, "max_bands": 100, "band_points": 200}
SCRIPT = Path(__file__).with_name("report_html.js")
e = html.escape


def plotly_js() -> str:
    try:
        return (resources.files("plotly") / "package_data" / "plotly.min.js").read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError, OSError) as err:
        raise UserError(f"the report inlines Plotly.js from the plotly package, which cannot be read: {err}") from None


def table(head: list[str], rows: list[list], numeric=()) -> str:
    th = "".join(f'<th class="{"num" if i in numeric else ""}">{e(h)}</th>' for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f'<td class="{"num" if i in numeric else ""}">{e(str(c))}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f'<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def facts(pairs: list[tuple[str, object]]) -> str:
    return '<dl class="facts">' + "".join(f"<div><dt>{e(k)}</dt><dd>{e(str(v))}</dd></div>" for k, v in pairs) + "</dl>"


# --- PyTorch -------------------------------------------------------------------------------------------
def torch_sections(store, tid: str, devices: list[int] | None, skip) -> tuple[list[str], list[dict]]:
    from alloctrace.traces.explain import torch_flame_svg as flame_svg
    from alloctrace.traces.explain.torch_flame import flame
    from alloctrace.traces.diff.torch_ranks import compare
    from alloctrace.traces.state.torch_device import StateIndex, load_device
    from alloctrace.traces.explain.torch_peak import oom_card, peak
    from alloctrace.traces.memmap.torch_timeline import timeline

    graphs = [g["index"] for g in store.summary(tid)["graphs"]]
    parts, data = [], []
    ranks = compare(store, tid, skip) if len(graphs) > 1 else None
    if ranks:
        rows = [[r["rank"], r["device"], f"{r['n_events']:,}", fmt_bytes(r["peak_requested"]),
                 fmt_bytes(r["peak_reserved"]), f"{fmt_bytes(r['fragmentation'])} ({r['fragmentation_share']:.1%})",
                 "-" if not r["oom"] else f"entry {r['oom']['event']:,}: {fmt_bytes(r['oom']['requested'])}"]
                for r in ranks["ranks"]]
        parts.append('<section><h2>Ranks</h2>' + table(["rank", "device", "entries", "peak requested", "peak reserved",
                                                         "reserved − requested there", "OOM"], rows, (2, 3, 4, 5)))
        c = ranks["compared"]
        if c:
            parts.append(f"<p>Rank {c['b_rank']} ({e(c['why'])}) against rank {c['a_rank']}: peak requested "
                         f"{c['delta_requested']:+,} B, peak reserved {c['delta_reserved']:+,} B.</p>"
                         + table([f"rank {c['a_rank']}", f"rank {c['b_rank']}", "Δ", "call site"],
                                 [[f"{r['a_bytes']:,}", f"{r['b_bytes']:,}", f"{r['delta']:+,}", r["site"]]
                                  for r in c["by_call_site"]], (0, 1, 2)))
        parts.append("</section>")
    if devices is None:
        devices = graphs if len(graphs) <= MAX_DETAILED else _chosen(ranks, graphs)
    for d in devices:
        if d not in graphs:
            raise UserError(f"trace {tid} has no device {d}")
    for d in devices[:MAX_DETAILED]:
        dev = load_device(store, tid, d)
        p = peak(dev, skip, top=40)
        card = oom_card(dev, StateIndex(dev), skip)
        rank = dev.extra.get("rank")
        title = f"rank {rank} (device {d})" if rank is not None else f"device {d}"
        t = timeline(dev, **TIMELINE, skip=skip)
        data.append({"id": f"timeline-{d}", "kind": "torch-timeline", "timeline": t})
        sec = [f'<section class="device"><h2>{e(title)}</h2>',
               facts([("entries", f"{dev.n:,}"), ("peak requested", f"{p['peak_requested']:,} B"),
                      ("peak reserved", f"{p['peak_reserved']:,} B"), ("peak at entry", f"{p['event']:,}"),
                      ("segments at snapshot", dev.extra.get("n_segments")),
                      ("trace", "complete" if dev.extra.get("trace_complete", True) else "partial (wrapped or late)")]),
               *([f'<p class="oom">{e(p["partial"])}</p>'] if p.get("partial") else []),
               "<h3>Active memory timeline</h3>",
               f'<div class="chart" id="timeline-{d}"></div>',
               f'<p class="note">Allocated bytes (requested sizes) over trace entries, the {len(t["bands"])} largest '
               f'allocations as bands ({t["omitted_allocations"]:,} more only in the grey total); dotted: '
               'reserved bytes. Totals are per-cell maxima, so no peak is lost.</p>']
        if card:
            sec.append(oom_html(card))
        sec.append("<h3>Peak by call site</h3>" + table(
            ["bytes", "share", "allocations", "call site"],
            [[f"{g['bytes']:,}", f"{g['share']:.1%}", f"{g['count']:,}", g["site"]] for g in p["by_call_site"]],
            (0, 1, 2)))
        for at, what in (("peak", "at the peak"),) + ((("oom", "at the OOM"),) if card else ()):
            f = flame(dev, at, skip, 0.002)
            sec.append(f"<h3>Flamegraph {what}</h3>" + f'<div class="flame">{flame_svg.svg(f)}</div>')
        parts.append("\n".join(sec) + "</section>")
    if len(devices) > MAX_DETAILED:
        parts.append(f'<p class="note">{len(devices) - MAX_DETAILED} more devices are only in the ranks table '
                     f"(a report draws at most {MAX_DETAILED}; pick them with --device).</p>")
    return parts, data


def _chosen(ranks: dict | None, graphs: list[int]) -> list[int]:
    """Of many ranks: the ones that ran out of memory, then the two the comparison names, then the first."""
    if not ranks:
        return graphs[:MAX_DETAILED]
    by_rank = {r["rank"]: r["device"] for r in ranks["ranks"]}
    pick = [r["device"] for r in ranks["ranks"] if r["oom"]]
    c = ranks["compared"] or {}
    pick += [by_rank[c[k]] for k in ("b_rank", "a_rank") if k in c]
    pick += graphs
    return list(dict.fromkeys(pick))[:MAX_DETAILED]


def oom_html(card: dict) -> str:
    """The OOM card as the dashboard shows it: the request, the cause, the cap, the allocator's totals, the largest
    free and held blocks, and who held the memory."""
    unknown = card.get("unknown")
    known = [("requested", fmt_bytes(card["requested"])),
             ("segment needed", fmt_bytes(card.get("segment_needed")))]
    if not unknown:
        known += [("allocated", fmt_bytes(card["allocated"])), ("reserved", fmt_bytes(card["reserved"])),
                  ("cached (reserved − allocated)", fmt_bytes(card["cached"]))]
        for pool, v in (card.get("largest_free") or {}).items():
            known.append((f"largest free block ({pool} pool)", fmt_bytes(v)))
    known.append(("device free", fmt_bytes(card.get("device_free"))))
    cap = card.get("cap")
    if cap:
        known.append(("memory cap", f"{cap['lower']:,} – {cap['upper'] - 1:,} B ({cap.get('source', 'inferred')})"
                      + (f", roundest {fmt_bytes(cap['roundest'])}" if cap.get("roundest") is not None else "")))
    if card.get("retries") is not None:
        known.append(("retries (whole run)", f"{card['retries']:,} ({card.get('retries_source', 'trace')})"))
    shown = {"event", "requested", "allocated", "reserved", "cached", "device_free", "largest_free", "holders",
             "stack", "site", "cache_releases", "requested_live", "meta", "stream", "n_ooms", "segment_needed",
             "retries", "retries_source", "unknown"}
    known += [(k.replace("_", " "), v if not isinstance(v, int) or v < 4096 else fmt_bytes(v))
              for k, v in card.items() if k not in shown and isinstance(v, (int, float, str)) and v not in ("", None)]
    rel = (card.get("cache_releases") or [])[-1:]
    known += [("cache emptied before", f"{r['segments']} segments, {fmt_bytes(r['bytes'])}") for r in rel]
    cause = (card.get("cause") or {}).get("text")
    held = table(["bytes", "entry", "call site"],
                 [[f"{b['bytes']:,}", f"{b['entry']:,}", b["site"]] for b in (card.get("largest_blocks") or [])[:10]],
                 (0, 1))
    holders = table(["bytes", "share", "allocations", "call site"],
                    [[f"{g['bytes']:,}", f"{g['share']:.1%}", f"{g['count']:,}", g["site"]] for g in card["holders"]],
                    (0, 1, 2))
    return (f'<div class="oom"><h3>Out of memory at entry {card["event"]:,} ({card.get("n_ooms", 1)} in all)</h3>'
            + (f'<p class="cause"><b>Cause:</b> {e(cause)}</p>' if cause else "")
            + (f'<p class="note">{e(unknown)}</p>' if unknown else "")
            + facts(known) + f"<p>Failing request from <code>{e(card['site'])}</code></p>"
            + "<h4>Largest blocks held</h4>" + held + "<h4>Who held the memory</h4>" + holders + "</div>")


# --- ggml ----------------------------------------------------------------------------------------------
def ggml_sections(store, tid: str, graphs: list[int] | None) -> tuple[list[str], list[dict]]:
    from alloctrace.traces import memmap
    from alloctrace.traces.explain.peak import peak_json
    from alloctrace.traces.store.graph_info import graph_info

    summary = store.summary(tid)
    rows = summary["graphs"]
    if graphs is None:
        graphs = [g["index"] for g in sorted(rows, key=lambda g: (not g["oom"], -(g["buffer_size"] or g["max_size"] or 0)))]
    parts, data = [], []
    for g in graphs[:MAX_DETAILED]:
        row = next((r for r in rows if r["index"] == g), None)
        if row is None:
            raise UserError(f"trace {tid} has no graph {g}")
        saved = getattr(store, "saved_lifetimes", None)
        lt = saved(tid, g) if saved else None
        cols = store.columns(tid, g)
        lt = lt or memmap.extract(cols)
        info = graph_info(row, cols)
        win = memmap.window(lt, info, None, None, None, None)
        shapes, total, merged = memmap.shape_columns(lt, win, MAX_SHAPES)
        data.append({"id": f"map-{g}", "kind": "ggml-map", "window": win, "shapes": {
            k: shapes[k] for k in ("x0", "x1", "y0", "y1", "n", "tensor", "size")},
            "max_size": info.get("max_size"), "buffer_size": info.get("buffer_size"), "oom": info.get("oom")})
        p = peak_json(store, f"{tid}:{g}")
        pk, fr = p["peak"], p["fragmentation"]
        sec = [f'<section class="graph"><h2>graph {g} ({e(str(row["role"]))})</h2>',
               facts([("events", f"{row['n_events']:,}"), ("max size", fmt_bytes(row["max_size"])),
                      ("buffer", fmt_bytes(row["buffer_size"])), ("peak set at event", pk["event"]),
                      ("free below the peak", fmt_bytes(fr["free_below_peak"])),
                      ("largest hole", fmt_bytes(fr["largest_hole"]))]),
               "<h3>Memory map</h3>", f'<canvas class="map" id="map-{g}" width="1100" height="420"></canvas>',
               f'<p class="note">Each tensor a box from its allocation to its free (x: events), at its offset '
               f'(y: bytes); {len(shapes["x0"]):,} boxes for {total:,} tensors'
               f'{" (merged per grid cell)" if merged else ""}. The legend names the largest tensors.</p>']
        fail = p.get("failure")
        if fail:
            sec.append(f'<div class="oom"><h3>Out of space at event {fail["event"]}</h3>' + facts([
                ("tensor", fail["tensor"] or "(unnamed)"), ("needed", fmt_bytes(fail["needed"])),
                ("free", fmt_bytes(fail["free"])), ("largest hole", fmt_bytes(fail["largest_hole"])),
                ("capacity", fmt_bytes(fail.get("capacity")))]) + table(
                ["family", "bytes"], [[f["family"], f"{f['bytes']:,}"] for f in fail["families"][:15]], (1,)) + "</div>")
        sec.append("<h3>Peak by tensor family</h3>" + table(
            ["family", "tensors", "bytes", "share", "first node", "last node"],
            [[f["family"], f["tensors"], f"{f['bytes']:,}", f"{f['share']:.1%}", f["first_node"] or "", f["last_node"] or ""]
             for f in p["families"][:40]], (1, 2, 3)))
        parts.append("\n".join(sec) + "</section>")
    if len(graphs) > MAX_DETAILED:
        parts.append(f'<p class="note">{len(graphs) - MAX_DETAILED} more graphs are not drawn (pick with ID:GRAPH).</p>')
    return parts, data


# --- the page ------------------------------------------------------------------------------------------
STYLE = """body{font-family:system-ui,sans-serif;margin:20px auto;max-width:1200px;color:#1d2330;background:#fbfbf8}
h1{font-size:22px}h2{border-bottom:1px solid #ccd;padding-bottom:4px;margin-top:28px}h3{margin:18px 0 6px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}td,th{padding:3px 8px;border-bottom:1px solid #e3e3ea;
text-align:left;vertical-align:top}.num{text-align:right;font-variant-numeric:tabular-nums}
.facts{display:flex;flex-wrap:wrap;gap:6px 22px;margin:8px 0}.facts dt{font-size:11px;color:#667}.facts dd{margin:0;
font-weight:600}.chart{height:440px}.note{font-size:12px;color:#556}.oom{border-left:4px solid #c0392b;
background:#fdf0ee;padding:4px 12px;margin:12px 0}.flame svg,canvas.map{max-width:100%;height:auto}
canvas.map{border:1px solid #dde;background:#fff}code{font-size:12px}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;margin:4px 0}.legend i{display:inline-block;width:12px;
height:12px;margin-right:4px;vertical-align:-2px}"""


def build(store, ref: str, *, devices: list[int] | None = None, skip=None) -> str:
    """The report of a stored trace (ID, or ID:DEVICE / ID:GRAPH for one) as one HTML string."""
    from alloctrace.traces.state.torch_frames import DEFAULT_SKIP
    from alloctrace.traces.store.kinds import TORCH, kind_of_source

    tid, one = store.resolve(ref)
    meta = store.meta(tid)
    pick = devices if devices is not None else (None if one is None else [one])
    if kind_of_source(meta.source) == TORCH:
        parts, data = torch_sections(store, tid, pick, DEFAULT_SKIP if skip is None else skip)
        what = "PyTorch CUDA memory snapshot"
    else:
        parts, data = ggml_sections(store, tid, pick)
        what = f"ggml graph allocator trace ({meta.generation or meta.source})"
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    needs_plotly = any(d["kind"] == "torch-timeline" for d in data)
    return "\n".join([
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>alloctrace report: {e(meta.name)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{e(meta.name)}</h1>", f'<p class="note">{e(what)} · trace {e(tid)} · stored {e(str(meta.created))} · '
        "written by alloctrace report; opens offline</p>",
        *parts,
        f'<script type="application/json" id="report-data">{payload}</script>',
        *([f"<script>{plotly_js()}</script>"] if needs_plotly else []),
        f"<script>{SCRIPT.read_text(encoding='utf-8')}</script>", "</body></html>", ""])
