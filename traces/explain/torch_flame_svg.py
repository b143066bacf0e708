"""A flamegraph tree as a standalone SVG (no script, no external file): the root at the bottom, each frame a
box as wide as its bytes, its callees above it; a tooltip (<title>) on every box gives its bytes and share."""
from __future__ import annotations

import hashlib
import re
from xml.sax.saxutils import escape as _escape

from alloctrace.traces.util.sizes import fmt_bytes

WIDTH, ROW, PAD, TOP = 1200, 17, 10, 46
CHAR = 6.6  # px per character of the 11px label font, for fitting labels


# characters XML 1.0 does not allow (C0 controls but tab and line breaks, surrogates, U+FFFE/F) and C1 controls:
# a frame name from a snapshot may hold any of them, and one makes the whole SVG unreadable
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")


def escape(text: str) -> str:
    """`text` for SVG text and attributes: markup escaped, characters XML cannot carry shown as \\xNN."""
    return _escape(_NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text)))


def attr(text: str) -> str:
    """`text` for a double-quoted attribute value."""
    return escape(text).replace('"', "&quot;")


def color(name: str) -> str:
    """A warm colour from the name: the same frame has the same colour in every graph."""
    h = hashlib.blake2s(name.encode("utf-8", "surrogatepass"), digest_size=3).digest()
    return f"rgb({205 + h[0] % 50},{80 + h[1] % 120},{h[2] % 60})"


def depth(tree: dict) -> int:
    return 1 + max((depth(c) for c in tree["children"]), default=0)


def svg(f: dict, title: str | None = None) -> str:
    """`f` is what flame.flame returns."""
    tree, total = f["tree"], max(f["bytes"], 1)
    rows = depth(tree)
    height = TOP + rows * ROW + PAD
    scale = (WIDTH - 2 * PAD) / total
    title = title or f"{f.get('name') or f['trace_id']}: device {f['device']}"
    head = (f"{fmt_bytes(f['bytes'])} live at entry {f['event']:,} of {f['n_events']:,}, "
            f"{f['live_allocations']:,} allocations")
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" font-family="Verdana, sans-serif" font-size="11">',
           f'<rect width="{WIDTH}" height="{height}" fill="#fdfdf6"/>',
           f'<text x="{WIDTH / 2}" y="18" text-anchor="middle" font-size="15">{escape(title)}</text>',
           f'<text x="{WIDTH / 2}" y="36" text-anchor="middle" fill="#555">{escape(head)}</text>']

    def box(node, x: float, level: int):
        w = node["value"] * scale
        if w < 0.3:
            return
        y = height - PAD - (level + 1) * ROW
        share = node["value"] / total
        tip = f"{node['name']}: {fmt_bytes(node['value'])} ({node['value']:,} B, {share:.1%}), {node['count']:,} allocations"
        out.append(f'<g data-name="{attr(node["name"])}" data-depth="{level}"><title>{escape(tip)}</title><rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{ROW - 1}" '
                   f'fill="{color(node["name"])}" rx="2"/>')
        fit = int((w - 6) / CHAR)
        if fit >= 3:
            label = node["name"] if len(node["name"]) <= fit else node["name"][:fit - 2] + ".."
            out.append(f'<text x="{x + 3:.2f}" y="{y + ROW - 5}">{escape(label)}</text>')
        out.append("</g>")
        cx = x
        for c in node["children"]:
            box(c, cx, level + 1)
            cx += c["value"] * scale

    box(tree, PAD, 0)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def html(f: dict, title: str | None = None) -> str:
    """The SVG in a page of its own (offline: nothing is loaded from elsewhere)."""
    t = escape(title or f"alloctrace flamegraph: {f.get('name') or f['trace_id']}")
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{t}</title>'
            '<style>body{margin:16px;font-family:system-ui,sans-serif} svg{max-width:100%;height:auto}</style>'
            f'</head><body>\n{svg(f, title)}</body></html>\n')
