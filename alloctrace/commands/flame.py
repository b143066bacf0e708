"""`alloctrace flame ID`: a memory flamegraph of a PyTorch trace at one entry (the peak by default)."""
from __future__ import annotations

import sys
from pathlib import Path

from alloctrace.traces.errors import UserError

from ._common import add_store_arg, examples, open_store_from

EXAMPLES = examples(
    "alloctrace flame 3c9e01aa -o flame.svg --store ./store   # the bytes live at the peak, by stack",
    "alloctrace flame 3c9e01aa:1 --at oom -o oom.html --store ./store   # device 1, at its first OOM",
    "alloctrace flame 3c9e01aa --at 5120 --store ./store | flamegraph.pl > f.svg   # folded stacks")


def register(subparsers):
    p = subparsers.add_parser(
        "flame", help="memory flamegraph of a PyTorch trace at an entry (the peak by default)",
        description="Draw the requested bytes live at one entry of a PyTorch trace by stack: each Python frame "
                    "outside --skip (torch's own files by default) is a box as wide as the bytes allocated "
                    "under it, callees above callers; the leaves are the call sites of `peak`. Written as SVG "
                    "(-o FILE.svg) or a page holding it (-o FILE.html); without -o, folded stacks "
                    "(frame;frame;frame BYTES) on standard output.")
    p.add_argument("ref", metavar="ID[:DEVICE]", help="trace id (a unique prefix is enough), device 0 by default")
    p.add_argument("--at", metavar="ENTRY", default="peak",
                   help="an entry number, peak (the requested-bytes peak), oom (the first OOM) or end")
    p.add_argument("-o", "--output", metavar="FILE", help="FILE.svg or FILE.html")
    p.add_argument("--skip", metavar="PARTS", default=None,
                   help="comma-separated file-name parts of frames left out ('default,PART' adds to torch's own)")
    p.add_argument("--min-share", type=float, default=None, metavar="F",
                   help="boxes under this share of the total are merged per caller (default 0.001; folded "
                        "stacks: 0, every stack)")
    add_store_arg(p)
    p.epilog = EXAMPLES
    p.set_defaults(func=run)


def run(args) -> int:
    from alloctrace.traces.explain import torch_flame_svg as flame_svg
    from alloctrace.traces.explain.torch_flame import flame, folded
    from alloctrace.traces.state.torch_frames import parse_skip
    from alloctrace.traces.state.torch_device import load_device

    from .export import write_output

    from alloctrace.traces.store.kinds import TORCH, require_kind

    store = open_store_from(args)
    tid, d = require_kind(store, args.ref, TORCH, "a flamegraph needs stacks")
    share = args.min_share if args.min_share is not None else (0.001 if args.output else 0.0)
    if not 0 <= share < 1:
        raise UserError("--min-share must be in [0, 1)")
    if d is not None and d not in [g["index"] for g in store.summary(tid)["graphs"]]:
        raise UserError(f"trace {tid} has no device {d}")
    f = flame(load_device(store, tid, d or 0), args.at, parse_skip(args.skip), share)
    if f.get("partial"):
        print(f"alloctrace: {f['partial']}", file=sys.stderr)
    if not args.output:
        sys.stdout.write("".join(line + "\n" for line in folded(f["tree"])))
        return 0
    out = Path(args.output)
    kind = out.suffix.lower()
    if kind not in (".svg", ".html", ".htm"):
        raise UserError(f"{out}: write a .svg or an .html file")
    text = flame_svg.svg(f) if kind == ".svg" else flame_svg.html(f)
    write_output(out, lambda fh: fh.write(text))
    print(f"alloctrace: {out}: {f['bytes']:,} B live at entry {f['event']:,}", file=sys.stderr)
    return 0
