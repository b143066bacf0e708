"""One reading of a size for every face: whatif --cap, check --max-memory and fit --budget agree."""
from __future__ import annotations

import argparse

import pytest

from alloctrace.commands.check import _size_arg
from alloctrace.traces.errors import UserError
from alloctrace.traces.preflight.budget import parse_budget
from alloctrace.traces.util.sizes import fmt_bytes, parse_size
from alloctrace.traces.whatif.torch_request import apply_overrides
from alloctrace.allocator.cuda_caching import AllocatorSettings


@pytest.mark.parametrize("text, n", [
    ("6G", 6 << 30), ("6GiB", 6 << 30), ("6 gib", 6 << 30), ("6GB", 6 * 10 ** 9), ("512M", 512 << 20),
    ("512MB", 512 * 10 ** 6), ("1.5GiB", 3 << 29), ("4096", 4096), ("4096B", 4096), ("2T", 2 << 40),
    ("1_000", 1000), ("8k", 8192), ("8KB", 8000)])
def test_every_face_reads_a_size_the_same(text, n):
    assert parse_size(text) == n
    assert _size_arg(text) == n  # check --max-memory
    assert parse_budget(text) == n  # fit --budget
    assert apply_overrides(AllocatorSettings(), {}, cap=text).memory_limit == n  # whatif --cap


@pytest.mark.parametrize("text", ["", "G", "six gigs", "0", "-1G", "1e3", "nan", "inf", "2000P", "3 parsecs",
                                  str(1 << 61)])
def test_what_is_not_a_size_is_refused_by_every_face(text):
    with pytest.raises(ValueError):
        parse_size(text)
    with pytest.raises(argparse.ArgumentTypeError):
        _size_arg(text)
    with pytest.raises(UserError):
        parse_budget(text)


def test_a_parsed_size_prints_back_as_written():
    for text in ("6GiB", "512MiB", "3KiB"):
        assert fmt_bytes(parse_size(text)).replace(".00 ", "") == text


# One table of sizes for every formatter: the CLI's fmt_bytes, the dashboard's fmtBytes (web/common.js) and the
# report's copy of it (traces/export/report_html.js) must write each the same string.
SIZE_TABLE = [0, 1, 1023, 1024, 1152, 1536, 10 ** 6, 1 << 20, int(5.5 * (1 << 20)), (1 << 20) - 1, 1 << 30,
              7.9e9, 1 << 40, 1 << 50, 1 << 60, -1, -1536, -(3 << 30), 12304, 206848, 1655709]
EXPECTED = {0: "0 B", 1: "1 B", 1023: "1023 B", 1024: "1.00 KiB", 1152: "1.13 KiB", 1536: "1.50 KiB",
            10 ** 6: "976.56 KiB", 1 << 20: "1.00 MiB", int(5.5 * (1 << 20)): "5.50 MiB", 1 << 30: "1.00 GiB",
            7.9e9: "7.36 GiB", 1 << 40: "1.00 TiB", 1 << 50: "1.00 PiB", 1 << 60: "1024.00 PiB", -1: "-1 B",
            -1536: "-1.50 KiB", 12304: "12.02 KiB"}

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def _js_function(path: str) -> str:
    """The UNITS constant and fmtBytes function of a JS file, each line stripped (the two files indent differently)."""
    import re
    text = (ROOT / path).read_text(encoding="utf-8")
    units = re.search(r"^\s*const UNITS = .*;$", text, re.M).group(0)
    body = re.search(r"^\s*(?:export )?function fmtBytes\(n\) \{\n.*?^\s*\}$", text, re.M | re.S).group(0)
    lines = [ln.strip().removeprefix("export ") for ln in (units + "\n" + body).splitlines()]
    return "\n".join(lines)


def test_the_table_reads_as_written():
    for n, text in EXPECTED.items():
        assert fmt_bytes(n) == text, n


def test_the_report_carries_the_dashboards_formatter_unchanged():
    assert _js_function("traces/export/report_html.js") == _js_function("web/common.js")


def test_python_and_the_dashboard_write_every_size_alike(page):
    """fmtBytes run in the real headless Chromium writes what fmt_bytes writes, for every value of the table."""
    page.set_content("<html><body></body></html>")
    got = page.evaluate(f"(() => {{ {_js_function('web/common.js')}\n"
                        f"return {SIZE_TABLE!r}.map(fmtBytes); }})()")
    assert got == [fmt_bytes(n) for n in SIZE_TABLE]
    assert page.evaluate(f"(() => {{ {_js_function('web/common.js')}\nreturn [fmtBytes(null), fmtBytes(undefined)]; }})()") == ["–", "–"]
