"""Graphs from the JSON descriptions that ship beside real ggml logs (tests/data/ggml-real); the
caller reads the file, this module only turns the parsed JSON into a Graph.

Two flavours: the 2023 files describe one graph (`nodes`, `leafs`, `parse_seq`,
`explicit_allocs_before_graph`, sizes); the head file holds a list `graphs`.
"""
from __future__ import annotations

from .layout import Layout, LAYOUTS, place_view_data
from .tensor import VIEW_OPS_2023, Graph, Tensor


def _make(d: dict) -> Tensor:
    flags = d.get("flags") or {}
    return Tensor(
        name=d["name"], op=d["op"], type=d["type"], ne=tuple(d["ne"]), nb=tuple(d.get("nb") or ()),
        nbytes=d.get("nbytes", 0), op_desc=d.get("op_desc", ""), op_offset=d.get("view_offset", 0),
        view_offs=d.get("view_offs", 0), input=bool(flags.get("input")), output=bool(flags.get("output")),
    )


def _view_src_2023(t: Tensor):
    """Derive ggml's later view_src/view_offs from 2023 view ops, for tools that want them."""
    if t.op not in VIEW_OPS_2023:
        return
    parent = t.srcs[1] if t.op == "CPY" else t.srcs[0]
    offs = t.op_offset if t.op == "VIEW" else 0
    if parent.view_src is not None:
        t.view_src, t.view_offs = parent.view_src, parent.view_offs + offs
    else:
        t.view_src, t.view_offs = parent, offs


def graph_from_json(d: dict, layout: Layout | None = None, legacy: bool = True) -> Graph:
    """Build a Graph; leafs marked `external` get addresses in the layout's weights area."""
    layout = layout or LAYOUTS["linux"]
    nodes = [_make(n) for n in d["nodes"]]
    leafs = [_make(l) for l in d["leafs"]]
    by_name = {}
    for src_list, objs in ((d["nodes"], nodes), (d["leafs"], leafs)):
        for desc, t in zip(src_list, objs):
            by_name.setdefault(t.name, t)
    for desc, t in zip(d["nodes"], nodes):
        srcs = []
        for s in desc.get("srcs", []):
            slot = s.get("slot", len(srcs))
            while len(srcs) < slot:
                srcs.append(None)
            srcs.append(nodes[s["node"]] if s.get("node", -1) >= 0 else leafs[s["leaf"]])
        t.srcs = srcs
    if legacy:
        for t in nodes:
            _view_src_2023(t)
    else:
        for desc, t in zip(d["nodes"] + d["leafs"], nodes + leafs):
            if desc.get("view_src"):
                t.view_src = by_name[desc["view_src"]]
    layout.place([l for desc, l in zip(d["leafs"], leafs) if desc.get("external")], layout.weights_base)
    for t in nodes:
        place_view_data(t)
    return Graph(nodes, leafs)
