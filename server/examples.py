"""The example traces the server ships (`examples/`): seeded into a store by traces/replay/examples.py."""
from __future__ import annotations

from alloctrace.server import paths


def example_logs() -> list:
    return sorted(p for p in paths.examples_dir().glob("*.log") if p.is_file())


def seed_examples(store) -> list[str]:
    """The examples `store` lacks, stored; the ids stored."""
    from alloctrace.traces.replay.examples import seed_examples as seed

    return seed(store, example_logs())
