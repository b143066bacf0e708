"""Optional: pre-flight on a sliding-window (iSWA) model with the real llama.cpp (`ALLOCTRACE_LLAMA_BIN` names
bin/llama-completion; llama-fit-params beside it), on tests/iswa_gguf.py's tiny gemma3. llama.cpp makes two KV
caches for it: every swept point's total must count both and equal the program's own breakdown, and `fit`'s
answer must be checked against what the program prints at the answer and one step above, in a weightless dry
run and in a real llama-completion run."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from alloctrace.traces.preflight.breakdown import check, check_lines
from alloctrace.traces.preflight.printed import MIB, printed_sizes, total_mib
from test_preflight_llama import llama_programs, run_json

BIN = os.environ.get("ALLOCTRACE_LLAMA_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="ALLOCTRACE_LLAMA_BIN is not set (a llama-completion binary)")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    pytest.importorskip("gguf")
    from iswa_gguf import write

    bindir = Path(BIN).resolve().parent
    fit_params = bindir / "llama-fit-params"
    if not fit_params.exists():
        pytest.skip(f"needs {fit_params}")
    model = tmp_path_factory.mktemp("model") / "gemma3-iswa.gguf"
    write(str(model))
    with llama_programs(bindir, model) as programs:
        yield programs


def printed_by(*cmd) -> dict:
    r = subprocess.run(list(cmd), capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return printed_sizes(r.stdout + r.stderr)


def test_every_point_counts_both_caches_and_equals_the_programs_breakdown(llama, tmp_path, capsys):
    out = run_json(capsys, "sweep", "--store", str(tmp_path), "--json", "-j", "2",
                   "--vary=-c=256,1024,4096,16384", "--", llama["fit"], "-m", llama["model"], "-v")
    swa = {}
    for p in out["points"]:
        assert p["error"] is None and p["consistent"] is True
        kv = p["printed"]["kv_cache"]
        assert set(kv) == {"CPU", "CPU (SWA)"}
        cells = int(p["values"]["-c"])  # the full cache: 1 layer, 2 x 2 heads x 16 x f16 = 128 B per cell
        assert kv["CPU"] == float(f"{cells * 128 / MIB:.2f}")
        swa[int(p["values"]["-c"])] = kv["CPU (SWA)"]
        assert p["check"]["agrees"], "\n".join(check_lines(p["check"]))
        assert p["total"] == sum(p["buffers"].values()) + round(total_mib(p["printed"]) * MIB)
    # the sliding-window cache: min(n_ctx, window 128 + n_ubatch 512) cells padded to 256, 5 layers of 640 B
    assert swa == {256: 0.16, 1024: 0.47, 4096: 0.47, 16384: 0.47}
    laws = {x["family"]: x["law"] for x in out["laws"]}
    assert laws["ffn_gate"]["dims"] == [128, "min(-c, 512)", 1, 1]  # n_ubatch = min(-ub, -c)
    # both masks (full: n_ctx cells, SWA: min(n_ctx, 768)) in one family: one law from -c 1024 on, not through 256
    mask = laws["attn_inp_kq_mask"]
    assert mask["kind"] == "piecewise" and mask["changes_between"] == [[256, 1024]]
    assert mask["pieces"][-1]["formula"] == "786432 + 1024·-c B"  # f16 [n_ctx + 768, 512]
    assert mask["pieces"][-1]["fitted_on"] == {"-c": [1024, 16384]}


def test_fit_answer_is_what_the_program_prints_at_it_and_one_step_above(llama, tmp_path, capsys):
    budget_mib = 20
    out = run_json(capsys, "fit", "--store", str(tmp_path), "--json", "--budget", f"{budget_mib}MiB",
                   "--vary=-c=256..32768", "--step", "256", "--", llama["fit"], "-m", llama["model"], "-v")
    value, nxt = out["value"], out["next"]
    assert nxt["value"] == value + 256
    assert out["total"] <= budget_mib * MIB < nxt["total"]
    for c in (out["check"], nxt["check"]):  # the dry runs' own breakdowns, at the answer and one step above
        assert c["agrees"], "\n".join(check_lines(c))
    assert out["check"]["devices"][0]["printed"]["self"] <= budget_mib  # the program's own figure fits too
    from alloctrace.commands.fit import report_lines

    text = "\n".join(report_lines(out))
    assert f"checked against what the program printed at -c {value}:" in text and "kv cache on CPU (SWA)" in text
    assert text.count(": agrees") == 2 and "DIFFERS" not in text  # at the answer and one step above
    kv = out["point"]["printed"]["kv_cache"]
    assert set(kv) == {"CPU", "CPU (SWA)"} and kv["CPU"] == float(f"{value * 128 / MIB:.2f}")  # both counted
    # a real run of llama-completion (weights and caches allocated) at the answer and one step above
    for c, total in ((value, out["total"]), (nxt["value"], nxt["total"])):
        cmd = [llama["completion"], "-m", llama["model"], "-p", "Hi", "-n", "1", "-c", str(c), "-t", "2", "-no-cnv",
               "--temp", "0", "-fit", "off", "-v"]
        real = printed_by(*cmd)
        assert set(real["kv_cache"]) == {"CPU", "CPU (SWA)"}
        ours = total / MIB
        theirs = total_mib(real) + real["compute"]["CPU"]  # every part as the real run printed it
        assert abs(ours - theirs) <= 0.005 * 6, (c, ours, theirs, real)  # six two-decimal figures' rounding
        for _ in range(3):  # printed at exit: the logger's thread may lose a run's last lines (a busy machine)
            if "breakdown_self" in real:
                assert check({"CPU": round(real["compute"]["CPU"] * MIB)}, real)["agrees"]
                break
            real = printed_by(*cmd)


def test_laws_follow_min_of_ub_and_c_and_the_window_per_ub(llama, tmp_path, capsys):
    out = run_json(capsys, "sweep", "--store", str(tmp_path), "--json", "-j", "2", "--vary=-c=256,1024,4096",
                   "--vary=-ub=128,512", "--", llama["fit"], "-m", llama["model"], "-v")
    assert all(p["check"]["agrees"] for p in out["points"])
    laws = {x["family"]: x for x in out["laws"]}
    assert laws["ffn_gate"]["law"]["dims"] == [128, "min(-c, -ub)", 1, 1]  # llama.cpp's n_ubatch
    # the masks: f16 [n_ctx, n_ubatch] + [min(n_ctx, pad(window + n_ubatch)), n_ubatch]: at -ub 128 the window's
    # cache is 256 cells from -c 256 on, one law; no one law holds across both micro-batches
    mask = laws["attn_inp_kq_mask"]
    assert mask["law"] is None
    per_ub = {b["setting"]["-ub"]: b["law"] for b in mask["by_setting"]}
    assert per_ub["128"]["formula"] == "65536 + 256·-c B" and per_ub["128"]["fitted_on"] == {"-c": [256, 4096]}
