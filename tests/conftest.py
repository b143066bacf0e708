import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# real logs of ggml's allocator, generation by generation (README.md there lists their sizes)
FIXTURES = Path(__file__).resolve().parent / "data" / "ggml-real"


@pytest.fixture(scope="session")
def fixtures() -> Path:
    return FIXTURES


def allocator_lines(path: Path) -> list[str]:
    """A harness log without the harness program's own markers."""
    with open(path, newline="") as f:
        return [line.rstrip("\n") for line in f if not line.startswith("harness:")]


def load_harness(path: Path) -> dict:
    """A harness graph description (the JSON beside a harness log)."""
    with open(path) as f:
        return json.load(f)
