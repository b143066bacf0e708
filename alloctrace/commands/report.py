"""`alloctrace report ID -o report.html`: one self-contained HTML file to share (no network needed to open it)."""
from __future__ import annotations

import sys
from pathlib import Path

from alloctrace.traces.errors import UserError

from ._common import add_store_arg, examples, open_store_from

EXAMPLES = examples(
    "alloctrace report 3c9e01aa -o report.html --store ./store   # a PyTorch snapshot: timeline, peak, OOM, flamegraph",
    "alloctrace report 7d2e4f10 --device 0,3 -o ranks.html --store ./store   # two ranks of a job in detail",
    "alloctrace report 59b3150c:2 -o graph2.html --store ./store   # a ggml trace's graph 2: memory map, peak, OOM")


def register(subparsers):
    p = subparsers.add_parser(
        "report", help="write one self-contained HTML report of a trace (opens offline)",
        description="Write a stored trace as one HTML file with every byte of data and script inside it (Plotly.js "
                    "from the installed plotly package; nothing is loaded from the network), to mail or attach. "
                    "A PyTorch trace: per device the active-memory timeline, the peak by call site, the OOM card "
                    "and the flamegraph at the peak (and at the OOM), the ranks side by side when there are "
                    "several. A ggml trace: per graph the memory map, the peak by tensor family and the "
                    "out-of-space failure. Each part has a bounded level of detail, so a million-entry trace "
                    "gives a file of about 6 MB.")
    p.add_argument("ref", metavar="ID[:DEVICE]", help="trace id (a unique prefix is enough); :N for one device or graph")
    p.add_argument("-o", "--output", metavar="FILE", required=True, help="the .html file to write")
    p.add_argument("--device", metavar="N[,N...]", default=None,
                   help="devices (ranks) or graphs drawn in detail, at most 4 (default: all up to 4, else the rank "
                        "that ran out of memory and the ranks the comparison names)")
    p.add_argument("--skip", metavar="PARTS", default=None,
                   help="PyTorch: comma-separated file-name parts of frames that are not call sites")
    add_store_arg(p)
    p.epilog = EXAMPLES
    p.set_defaults(func=run)


def run(args) -> int:
    from alloctrace.traces.export.report_html import build
    from alloctrace.traces.state.torch_frames import parse_skip

    from .export import write_output

    devices = None
    if args.device is not None:
        try:
            devices = [int(x) for x in args.device.split(",") if x.strip()]
        except ValueError:
            raise UserError(f"--device: expected numbers separated by commas, not {args.device[:40]!r}") from None
    out = Path(args.output)
    if out.suffix.lower() not in (".html", ".htm"):
        raise UserError(f"{out}: a report is an .html file")
    store = open_store_from(args)
    text = build(store, args.ref, devices=devices, skip=parse_skip(args.skip))
    write_output(out, lambda f: f.write(text))
    print(f"alloctrace: {out}: {len(text.encode()):,} bytes", file=sys.stderr)
    return 0
