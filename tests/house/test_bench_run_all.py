"""bench/run_all.py finds every bench_*.py beside it, collects the figures of those that take --json,
lists the others with their last line, honours --skip/--only, and prints one Markdown table.
(Fake benchmarks in a copy of the folder: nothing is timed here.)"""
import shutil
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"

WITH_JSON = '''import argparse
from figures import Figure, add_option, at_most, write
ap = argparse.ArgumentParser()
ap.add_argument("--n", type=int, default=1)
add_option(ap)
a = ap.parse_args()
print("measuring")
write(a.json, [at_most("fake ratio", 2.5 * a.n, "x", 3, "reading lines: 0.1 s"), Figure("fake size", 12.0, "MB")])
'''


def run_all(tmp_path, *args):
    for name in ("run_all.py", "figures.py"):
        shutil.copy(BENCH / name, tmp_path / name)
    (tmp_path / "bench_fast.py").write_text(WITH_JSON)
    (tmp_path / "bench_plain.py").write_text('print("plain result: 7 ms")\n')
    (tmp_path / "bench_broken.py").write_text('raise SystemExit("cannot run here")\n')
    p = subprocess.run([sys.executable, str(tmp_path / "run_all.py"), *args], capture_output=True, text=True,
                       cwd=tmp_path, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout, p.stderr


def test_one_table_of_every_benchmark(tmp_path):
    out, err = run_all(tmp_path)
    lines = out.strip().splitlines()
    assert lines[0].startswith("| figure | value | goal | met | baseline")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines[2:]}
    assert "| 2.5x | <= 3x | yes | reading lines: 0.1 s | `python bench_fast.py` |" in rows["fake ratio"]
    assert "| 12.0 MB |" in rows["fake size"]
    plain = [line for line in lines if "bench_plain.py" in line]
    assert len(plain) == 1 and "no --json" in plain[0] and "plain result: 7 ms" in plain[0]
    broken = [line for line in lines if "bench_broken.py" in line]
    assert len(broken) == 1 and "failed (exit 1)" in broken[0]
    assert "measuring" in err  # the benchmarks' own output goes to stderr


def test_skip_and_only(tmp_path):
    out, _ = run_all(tmp_path, "--skip", "plain", "broken")
    assert "fake ratio" in out and "bench_plain" not in out and "bench_broken" not in out
    out, _ = run_all(tmp_path, "--only", "bench_plain")
    assert "bench_plain.py" in out and "fake ratio" not in out
