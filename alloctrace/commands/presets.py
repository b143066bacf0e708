"""`alloctrace presets`: the model presets replay can run, with their hyper-parameters."""
from __future__ import annotations

import dataclasses
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
    from alloctrace.allocator.presets import PRESETS

    if args.json:
        print(json.dumps([p.to_json() for p in PRESETS.values()], indent=2))
        return 0
    for p in PRESETS.values():
        hp = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(p.hparams).items())
        print(f"{p.name:<14} {p.family:<5} n_ctx={p.n_ctx} n_batch={p.n_batch}  {hp}")
        print(f"{'':<14} {p.description}")
    return 0
