"""Benchmark figures in one machine-readable form, for bench/run_all.py.

Every bench_*.py takes `--json PATH` and, besides its usual text, writes there
`{"figures": [...]}`: one object per figure with the fields of `Figure`. A figure
that is a ratio names, in `baseline`, what it is a ratio to: a measurement taken
side by side in the same run (so the ratio holds across machines), with its value.
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Figure:
    figure: str  # what was measured
    value: float
    unit: str  # "x" for a ratio, else "ms", "s", "MB", ...
    goal: str = ""  # e.g. "<= 3x"; empty: reported for context only
    ok: bool | None = None  # the goal is met (None: no goal)
    baseline: str = ""  # the side-by-side measurement a ratio is to, with its value

    def text(self) -> str:
        v = f"{self.value:.1f}" if abs(self.value) >= 10 or self.unit == "x" else f"{self.value:.3g}"
        return f"{v} {self.unit}" if self.unit != "x" else f"{v}x"


def at_most(figure: str, value: float, unit: str, limit: float, baseline: str = "") -> Figure:
    """A figure whose goal is `value <= limit`."""
    goal = f"<= {limit:g}x" if unit == "x" else f"<= {limit:g} {unit}"
    return Figure(figure, round(value, 4), unit, goal, value <= limit, baseline)


def add_option(ap) -> None:
    ap.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON (bench/figures.py)")


def take_option(argv: list[str]) -> str | None:
    """For benchmarks that read sys.argv themselves: remove `--json PATH` from argv, return PATH."""
    if "--json" not in argv:
        return None
    i = argv.index("--json")
    if i + 1 >= len(argv):
        sys.exit("--json needs a path")
    path = argv[i + 1]
    del argv[i:i + 2]
    return path


def write(path: str | None, figures: list[Figure]) -> None:
    if path:
        Path(path).write_text(json.dumps({"figures": [asdict(f) for f in figures]}, indent=1))


def read(path: Path) -> list[Figure]:
    data = json.loads(Path(path).read_text())
    return [Figure(**{k: f.get(k) for k in Figure.__dataclass_fields__ if k in f}) for f in data["figures"]]
