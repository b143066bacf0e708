"""`alloctrace compare` on real recordings of llama.cpp (tests/data/compare): flash attention off as the
head commit grows the CPU compute buffer and names `kq`; a rerun of the same config is no growth."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from alloctrace.cli import main
from alloctrace.traces.regress.compare import Threshold

DATA = Path(__file__).resolve().parents[1] / "data" / "compare"
FA_ON, FA_OFF, FA_ON_AGAIN = (DATA / f"tiny-llama-fa-{x}.atrec.gz" for x in ("on", "off", "on.again"))
UB8 = Path(__file__).resolve().parents[1] / "data" / "explain" / "llama-tiny_c512_ub8.head.AT.log.gz"


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def store(tmp_path, capsys):
    s = str(tmp_path / "s")
    for path, commit in ((FA_ON, "aaa111"), (FA_OFF, "bbb222"), (FA_ON_AGAIN, "ccc333")):
        assert main(["import", str(path), "--store", s, "--tag", f"commit={commit}", "--tag", "model=tiny-llama",
                     "--tag", "config=c256-ub64"]) == 0
    capsys.readouterr()
    return s


def test_a_grown_buffer_exits_1_and_names_kq(store, capsys):
    code, out, _ = run(capsys, "compare", "--store", store, "--base", "commit=aaa111", "--head", "commit=bbb222")
    assert code == 1
    assert "config=c256-ub64 model=tiny-llama" in out and "GREW" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("CPU "))
    assert "817.75 KiB" in row and "961.25 KiB" in row and "+143.50 KiB (+17.5%)" in row and "kq +512.00 KiB" in row
    code, out, _ = run(capsys, "compare", "--store", store, "--base", "commit=aaa111", "--head", "commit=bbb222",
                       "--json")
    got = json.loads(out)
    (pair,) = got["pairs"]
    (cpu,) = pair["buffers"]
    assert (cpu["buffer"], cpu["base"], cpu["head"], cpu["delta"], cpu["cause"]) == ("CPU", 837376, 984320, 146944,
                                                                                     "kq")
    att = cpu["attribution"]
    assert att["families"][0]["family"] == "kq" and att["delta"] == 146944
    assert sum(r["delta"] for r in att["families"]) + att["fragmentation_delta"] == att["delta"]
    assert got["failed"] is True and pair["tags"] == {"config": "c256-ub64", "model": "tiny-llama"}


def test_identical_runs_exit_0(store, capsys):
    code, out, _ = run(capsys, "compare", "--store", store, "--base", "commit=aaa111", "--head", "commit=ccc333")
    assert code == 0 and "no buffer grew" in out and "GREW" not in out


def test_thresholds(store, capsys):
    base = ["compare", "--store", store, "--base", "commit=aaa111", "--head", "commit=bbb222"]
    assert run(capsys, *base, "--threshold", "17%")[0] == 1
    assert run(capsys, *base, "--threshold", "18%")[0] == 0
    assert run(capsys, *base, "--threshold", "146943")[0] == 1
    assert run(capsys, *base, "--threshold", "146944")[0] == 0
    assert run(capsys, *base, "--threshold", "1MiB")[0] == 0
    assert run(capsys, "compare", "--store", store, "--base", "commit=bbb222", "--head", "commit=aaa111")[0] == 0


def test_markdown_is_a_table_for_a_pull_request(store, capsys):
    code, out, _ = run(capsys, "compare", "--store", store, "--base", "commit=aaa111", "--head", "commit=bbb222",
                       "--markdown")
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith("### Memory: commit=aaa111 → commit=bbb222 (grew")
    assert "| run | buffer | base | head | delta | cause |" in lines
    row = next(line for line in lines if line.startswith("| config=c256-ub64"))
    assert "**+143.50 KiB (+17.5%)**" in row and "kq +512.00 KiB" in row
    assert any(line.startswith("| kq | 0 B | 512.00 KiB | +512.00 KiB |") for line in lines)


def test_pairs_by_the_other_tags_and_reports_the_unpaired(store, tmp_path, capsys):
    assert main(["import", str(UB8), "--store", store, "--tag", "commit=bbb222", "--tag", "model=other"]) == 0
    capsys.readouterr()
    code, out, _ = run(capsys, "compare", "--store", store, "--base", "commit=aaa111", "--head", "commit=bbb222",
                       "--json")
    got = json.loads(out)
    assert code == 1 and len(got["pairs"]) == 1 and [s["name"] for s in got["only_head"]] == [UB8.name]


@pytest.mark.parametrize("argv,message", [
    (["--base", "commit=nothere", "--head", "commit=bbb222"], "no trace is tagged commit=nothere"),
    (["--base", "commit", "--head", "commit=bbb222"], "bad tag"),
    (["--base", "commit=aaa111", "--head", "commit=bbb222", "--threshold", "lots"], "--threshold"),
])
def test_bad_input_is_one_line_and_exit_2(store, capsys, argv, message):
    code, out, err = run(capsys, "compare", "--store", store, *argv)
    assert code == 2 and message in err and err.count("\n") == 1 and err.startswith("alloctrace: error:")


def test_threshold_parsing():
    assert Threshold.parse("1MiB").bytes == 1 << 20 and Threshold.parse("4096").bytes == 4096
    assert Threshold.parse("2.5%").percent == 2.5 and Threshold.parse(None).bytes == 0
    assert Threshold.parse("1%").exceeded(1000, 1011) and not Threshold.parse("1%").exceeded(1000, 1010)
