"""`alloctrace diff A B`: line up two allocator runs and say where and why they part.

A and B are stored refs (ID for a whole trace, ID:GRAPH for one graph) or log
files (FILE or FILE:GRAPH), imported into the store on the fly. Exit status as
diff(1): 0 when the runs place every aligned tensor alike, 1 when they part.
"""
from __future__ import annotations

import json
from pathlib import Path

from alloctrace.traces.errors import UserError
from alloctrace.traces.util.textsafe import safe_lines

from ._common import add_store_arg, exact_count, examples, open_store_from, table_lines


EXAMPLES = examples(
    'alloctrace diff 59b3150c:0 59b3150c:1 --store ./store   # measure graph against the first eval graph',
    'alloctrace diff before.log after.log   # two logs, imported on the fly, graphs paired in order',
    'alloctrace diff 59b3150c 7a41d2e0 --json --store ./store   # two whole traces, as JSON')


def register(subparsers):
    p = subparsers.add_parser(
        "diff", help="diff two allocator runs: first divergence, free lists, out-of-space explanation",
        description="Align two graphs (or two whole traces, graphs paired in order) by tensor identity and report "
                    "the first allocation placed differently, the first point where the free lists differ, why "
                    "an allocation ran out of space, and both runs' sizes. Exit 0: no divergence, 1: divergence.")
    p.add_argument("a", metavar="A", help="ID, ID:GRAPH, or a log file (FILE or FILE:GRAPH, imported on the fly)")
    p.add_argument("b", metavar="B", help="the other run, same forms as A")
    add_store_arg(p)
    p.add_argument("--json", action="store_true", help="print the full diff as JSON")
    p.epilog = EXAMPLES
    p.set_defaults(func=run)


def _file_ref(ref: str):
    """(path, graph or None) when `ref` names an existing file, else None."""
    if Path(ref).is_file():
        return Path(ref), None
    head, sep, tail = ref.rpartition(":")
    if sep and tail.isdecimal() and Path(head).is_file():
        return Path(head), int(tail)
    return None


def names_a_file(*refs: str) -> bool:
    """Whether any ref names a file to import on the fly: the command may then make the store it imports into.
    A ref that looks like a path but names no file is the user's error, said before any store is opened."""
    for ref in refs:
        if _file_ref(ref) is None and ("/" in ref or ref.endswith((".log", ".txt", ".gz", ".zst"))):
            raise UserError(f"no such file: {ref}")
    return any(_file_ref(r) is not None for r in refs)


def resolve_ref(store, ref: str, imported: dict) -> str:
    """A stored ref for `ref`, importing a log file once per run."""
    found = _file_ref(ref)
    if found is None:
        if "/" in ref or ref.endswith((".log", ".txt", ".gz", ".zst")):
            raise UserError(f"no such file: {ref}")
        return ref
    from alloctrace.traces import import_paths

    path, graph = found
    key = str(path.resolve())
    if key not in imported:
        imported[key] = import_paths(store, [path])[0]
    return imported[key] if graph is None else f"{imported[key]}:{graph}"


def run(args) -> int:
    from alloctrace.traces.diff.graphs import DiffResult, diff_refs

    store = open_store_from(args, create=names_a_file(args.a, args.b))
    imported: dict = {}
    ref_a, ref_b = resolve_ref(store, args.a, imported), resolve_ref(store, args.b, imported)
    from ._torch_report import diff_snapshots, is_torch
    if is_torch(store, ref_a) or is_torch(store, ref_b):  # PyTorch memory snapshots
        return diff_snapshots(store, ref_a, ref_b, args.json)
    result = diff_refs(store, ref_a, ref_b)
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
    elif isinstance(result, DiffResult):
        print(safe_lines(report_lines(result)))
    else:
        print(safe_lines(trace_report_lines(result)))
    pairs = [result] if isinstance(result, DiffResult) else [d for _, _, d in result.pairs]
    return 1 if any(d.first_divergence for d in pairs) else 0


# --- the terminal report ------------------------------------------------------------------
def _blocks(blocks) -> str:
    if not blocks:
        return "none"
    shown = ", ".join(f"[{o:,}+{'end' if s is None else format(s, ',')}]" + (f"@{c}" if c else "")
                      for o, s, c in blocks[:8])
    return shown + (f" and {len(blocks) - 8} more" if len(blocks) > 8 else "")


def report_lines(d) -> list[str]:
    """The report, one line per string: `safe_lines` escapes a control character inside a line, so a
    table must never come as one string of several lines."""
    from alloctrace.traces.explain.peak import attribution_lines

    a, b, al = d.a, d.b, d.aligned
    out = [f"a: {a['label']}   b: {b['label']}",
           f"aligned {al['count']:,} placements: {al['fraction_a']:.0%} of a ({al['a']:,}), "
           f"{al['fraction_b']:.0%} of b ({al['b']:,})"]
    if d.lead == "size" and d.size_attribution:
        out += ["", "SIZE ATTRIBUTION (high-water mark by family at each peak)",
                f"  a and b are different programs or settings (tensors differ in size or do not pair up): "
                f"the sizes explain b - a = {d.size_attribution['delta']:+,} B"]
        out += attribution_lines(d.size_attribution)
    fd = d.first_divergence
    if fd is None:
        out.append("no divergence: every aligned tensor got the same block, offset and chunk")
    else:
        out += ["", "FIRST DIVERGENCE" + (" (it follows from the sizes)" if d.lead == "size" else ""),
                f"  {fd['words']}",
                f"  free list of a: {_blocks(fd['a'].get('free_blocks'))}",
                f"  free list of b: {_blocks(fd['b'].get('free_blocks'))}"]
    fc = d.first_choice_divergence
    if fd is not None and fc != fd:
        out += ["", "FIRST DIFFERENT CHOICE (offsets aside)",
                f"  {fc['words']}" if fc else "  none: every aligned tensor took the same block index and chunk"]
    fl = d.first_free_list_divergence
    if fl is not None:
        out += ["", "FREE LISTS FIRST DIFFER", f"  {fl['words']}"]
    for key, side in (("a", a), ("b", b)):
        oom = side.get("oom")
        if oom:
            out += ["", f"OUT OF SPACE in {key}"]
            if oom.get("ggml_line"):
                out.append(f"  ggml's message: {oom['ggml_line']}")
            out += [f"  {oom['words']}", f"  free blocks: {_blocks(oom['free_blocks'])}"]
    rows = [["", "a", "b", "b - a"]]
    for key, name in (("max_size", "max_size"), ("peak_live", "peak live bytes"), ("allocs", "allocations"),
                      ("reuses", "inplace reuses"), ("frees", "frees"), ("events", "events")):
        rows.append([name, exact_count(a[key]), exact_count(b[key]), f"{d.deltas[key]:+,}"])
    out += ["", "SUMMARY", *_indent(table_lines(rows))]
    if d.size_attribution and d.lead != "size":
        out += ["", "SIZE ATTRIBUTION (high-water mark by family at each peak)"] + attribution_lines(d.size_attribution)
    out += _delta_table("OFFSETS THAT DIFFER MOST", d.deltas["offsets"])
    out += _delta_table("SIZES THAT DIFFER MOST", d.deltas["sizes"])
    if d.deltas["reuse"]:
        rows = [["tensor", "a reuses", "b reuses"]] + [[r["tensor"], r["a"] or "-", r["b"] or "-"]
                                                       for r in d.deltas["reuse"]]
        out += ["", f"INPLACE REUSE DECISIONS THAT DIFFER ({d.deltas['reuse_count']})", *_indent(table_lines(rows))]
    return out


def _delta_table(title: str, rows_in: list) -> list[str]:
    if not rows_in:
        return []
    rows = [["tensor", "a", "b", "b - a"]] + [[r["tensor"], exact_count(r["a"]), exact_count(r["b"]), f"{r['delta']:+,}"]
                                             for r in rows_in]
    return ["", title, *_indent(table_lines(rows))]


def _indent(lines: list[str]) -> list[str]:
    return ["  " + line for line in lines]


def trace_report_lines(t) -> list[str]:
    out = [f"trace {t.ref_a} against trace {t.ref_b}: {len(t.pairs)} graph pairs"]
    for ga, gb, d in t.pairs:
        head = f"graph {ga} vs {gb}:"
        if d.lead == "size" and d.size_attribution:
            out.append(f"{head} {_size_words(d.size_attribution)}")
        elif d.first_divergence is None:
            out.append(f"{head} no divergence ({d.aligned['fraction']:.0%} aligned)")
        else:
            out.append(f"{head} {d.first_divergence['words']}")
        for side in (d.a, d.b):
            if side.get("oom"):
                out.append(f"  out of space: {side['oom']['words']}")
    for name, rest in (("a", t.unpaired_a), ("b", t.unpaired_b)):
        if rest:
            out.append(f"graphs of {name} with no partner: {', '.join(map(str, rest))}")
    sized = [(ga, gb, d) for ga, gb, d in t.pairs if d.lead == "size" and d.size_attribution]
    if sized:  # another program or configuration: the pair whose size differs most
        ga, gb, d = max(sized, key=lambda p: abs(p[2].size_attribution["delta"]))
        return out + ["", f"largest size difference: graph {ga} vs {gb}"] + report_lines(d)
    first = next(((ga, gb, d) for ga, gb, d in t.pairs if d.first_divergence), None)
    if first is not None:
        out += ["", f"first divergent pair: graph {first[0]} vs {first[1]}"] + report_lines(first[2])
    return out


def _size_words(att: dict) -> str:
    """'b - a = +1,377,376 B at the high-water mark, most of it kq (+917,504 B)'."""
    top = att["families"][0] if att["families"] else None
    most = f", most of it {top['family']} ({top['delta']:+,} B)" if top and top["delta"] else ""
    return f"b - a = {att['delta']:+,} B at the high-water mark{most}"
