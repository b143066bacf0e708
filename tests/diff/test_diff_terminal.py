"""`alloctrace diff` as a person reads it: on a pseudo-terminal, every table row on its own line, sentences that
say "a" and "b" after the header, ggml's own words for a failure, and a size question answered by size first."""
from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPLAIN = ROOT / "tests" / "data" / "explain"


def on_a_terminal(*args, timeout: float = 120) -> tuple[int, str]:
    """Run the CLI with its stdout and stderr on a pseudo-terminal (as a person runs it); its exit status and
    what the terminal received, line endings as the terminal shows them."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "alloctrace", *map(str, args)], stdin=subprocess.DEVNULL,
                            stdout=follower, stderr=follower, close_fds=True, env={**os.environ, "COLUMNS": "120"})
    os.close(follower)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], timeout)
            if not ready:
                proc.kill()
                raise AssertionError("the command did not finish")
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: the program closed its end
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(leader)
    return proc.wait(timeout=30), b"".join(chunks).decode().replace("\r\n", "\n")


def section(out: str, title: str) -> list[str]:
    """The lines of one report section (title line to the next blank line)."""
    lines = out.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start + 1:end]


def test_tables_come_out_one_row_per_line_on_a_terminal(fixtures, tmp_path):
    log = fixtures / "v2023-08-16-legacy" / "harness_plain.AT.log"
    status, out = on_a_terminal("diff", f"{log}:0", f"{log}:1", "--store", tmp_path)
    assert status == 1, out
    assert "\\n" not in out  # no escaped line break anywhere
    summary = section(out, "SUMMARY")
    assert re.fullmatch(r"\s+a\s+b\s+b - a", summary[0])
    assert [row.split()[0] for row in summary[1:]] == ["max_size", "peak", "allocations", "inplace", "frees", "events"]
    assert re.fullmatch(r"\s+max_size\s+12,304\s+12,304\s+\+0", summary[1])  # fixtures README: measure 12,304
    offsets = section(out, "OFFSETS THAT DIFFER MOST")
    assert offsets[0].split() == ["tensor", "a", "b", "b", "-", "a"] and len(offsets) >= 3
    assert all(len(row.split()) == 4 for row in offsets[1:])


def test_sentences_say_a_and_b_and_quote_ggmls_own_line(fixtures, tmp_path):
    log = fixtures / "v2023-08-16-legacy" / "harness_plain.AT.log"
    status, out = on_a_terminal("diff", f"{log}:0", f"{log}:1", "--store", tmp_path)
    header, body = out.split("\n", 1)
    labels = re.fullmatch(r"a: (\S+ \w+)\s+b: (\S+ \w+)", header.strip()).groups()
    for label in labels:  # the header names the runs; no sentence repeats them
        assert label not in body
    assert "diverges at event 82 in a, 82 in b, tensor KQV: a took block 0" in out
    printed = next(line for line in log.read_text().splitlines() if "not enough space" in line)
    ggml_words = printed.split(": ", 1)[1]  # what the real allocator printed, without its function name
    assert ggml_words == "not enough space in the buffer (needed 4096, largest block available 2064)"
    assert f"  ggml's message: {ggml_words}" in section(out, "OUT OF SPACE in b")


def test_two_programs_are_compared_by_size_first(tmp_path):
    small, large = EXPLAIN / "llama-tiny_c512_ub8.head.AT.log.gz", EXPLAIN / "llama-tiny_c512_ub64.head.AT.log.gz"
    status, out = on_a_terminal("diff", f"{small}:0", f"{large}:0", "--store", tmp_path)
    assert status == 1
    titles = [line for line in out.split("\n") if re.match(r"[A-Z]{3,} [A-Z]", line)]
    assert titles[0].startswith("SIZE ATTRIBUTION") and titles[1].startswith("FIRST DIVERGENCE (it follows")
    att = section(out, "SIZE ATTRIBUTION")
    # README there: compute buffers of 0.1877 and 1.5012 MiB; the attribution sums to the difference
    assert "b - a = +1,377,376 B" in att[0]
    assert att[2].split()[0] == "kq" and "(+917,504 B)" in att[2]
    status, out = on_a_terminal("diff", small, large, "--store", tmp_path)  # whole traces
    assert out.split("\n")[1] == "graph 0 vs 0: b - a = +1,377,376 B at the high-water mark, most of it kq (+917,504 B)"
