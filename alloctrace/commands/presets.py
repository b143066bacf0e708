"""`alloctrace presets`: the model presets replay can run, with their hyper-parameters."""
from __future__ import annotations

import json

from ._common import examples


EXAMPLES = examples(
    'alloctrace presets',
    'alloctrace presets --json')


def register(subparsers):
    p = subparsers.add_parser("presets", help="list the model presets (graphs of real programs) for replay",
                              description="List the model presets `replay`, `sweep` and `check --preset` build "
                                          "graphs from: each preset's architecture, default n_ctx and n_batch, and "
                                          "hyper-parameters (any of which --hparam KEY=VALUE overrides).")
    p.add_argument("--json", action="store_true", help="print the presets as JSON")
    p.epilog = EXAMPLES
    p.set_defaults(func=run)


def run(args) -> int:
    from alloctrace.traces.replay.catalog import preset_lines, presets_json

    if args.json:
        print(json.dumps(presets_json(), indent=2))
        return 0
    print("\n".join(preset_lines()))
    return 0
