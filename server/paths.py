"""Where the server finds its files: the dashboard (web/), shipped examples and Plotly.

The dashboard lives in the repository's top-level web/ folder. A wheel built
with `pip install .` carries it as package data under alloctrace/server/web/;
an editable install or a checkout finds it beside the package instead. Nothing
here takes a path from a request.
"""
from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent


def web_dir_candidates() -> list[Path]:
    """Installed package data first, then the checkout's web/ next to server/."""
    return [HERE / "web", HERE.parent / "web"]


def find_web_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """The dashboard folder: the one given, else the first candidate holding index.html, else
    the first that exists at all (pages then 404 one by one)."""
    if explicit is not None:
        return Path(explicit).resolve()
    existing = [p for p in web_dir_candidates() if p.is_dir()]
    for p in existing:
        if (p / "index.html").is_file():
            return p
    return existing[0] if existing else None


def examples_dir() -> Path:
    return HERE / "examples"


def plotly_js() -> Path | None:
    """plotly.min.js from the installed `plotly` package (the dashboard uses no CDN)."""
    try:
        import plotly
    except ImportError:
        return None
    p = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
    return p if p.is_file() else None
