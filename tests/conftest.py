import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(os.environ.get("ALLOCTRACE_FIXTURES", ROOT.parent / "shared" / "fixtures" / "ggml-real"))


@pytest.fixture(scope="session")
def fixtures() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"real ggml fixtures not found at {FIXTURES} (set ALLOCTRACE_FIXTURES)")
    return FIXTURES


def allocator_lines(path: Path) -> list[str]:
    """A harness log without the harness program's own markers."""
    with open(path, newline="") as f:
        return [line.rstrip("\n") for line in f if not line.startswith("harness:")]
