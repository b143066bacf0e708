"""`alloctrace sweep --vary` and `alloctrace fit` on a real ggml program (ggml-python, tests/sweep_program.py)
whose compute buffer follows a known formula: every point's exact bytes, the tags that find a recorded sweep,
the growth law against the tensors' shapes, and `fit` against an exhaustive scan."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from alloctrace.cli import main
from alloctrace.traces.errors import UserError
from alloctrace.traces.preflight import printed, vary
from alloctrace.traces.preflight.sweeps import load, sweep_ids
from alloctrace.traces.store.store import open_store
from sweep_program import expected_bytes

PROGRAM = [sys.executable, str(Path(__file__).parents[1].joinpath("sweep_program.py"))]
DATA = Path(__file__).parents[1].joinpath("data") / "preflight"


def sweep(capsys, store: Path, *args) -> dict:
    rc = main(["sweep", "--store", str(store), *args, "--json", "-j", "2", "--", *PROGRAM, "-nh", "4"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One 2 x 2 sweep of the program, shared by the tests that read it."""
    store = tmp_path_factory.mktemp("store")
    import contextlib
    import io

    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        rc = main(["sweep", "--store", str(store), "--vary=-c=128,256", "--vary=-ub=32,64", "--json", "--",
                   *PROGRAM, "-nh", "4"])
    assert rc == 0, err.getvalue()
    return store, json.loads(buf.getvalue()), err.getvalue()


def test_every_point_is_the_exact_buffer_of_the_formula(recorded):
    store, out, progress = recorded
    assert [p["values"] for p in out["points"]] == [
        {"-c": "128", "-ub": "32"}, {"-c": "128", "-ub": "64"}, {"-c": "256", "-ub": "32"}, {"-c": "256", "-ub": "64"}]
    for p in out["points"]:
        n_ctx, n_ubatch = int(p["values"]["-c"]), int(p["values"]["-ub"])
        assert p["buffers"] == {"CPU": expected_bytes(n_ctx, n_ubatch, 4)}
        assert p["consistent"] is True and p["error"] is None and p["exit_status"] == 0
        assert p["printed"]["compute"] == {"CPU": round(expected_bytes(n_ctx, n_ubatch, 4) / 2**20, 2)}
        assert [f["family"] for f in p["families"]][:1] in (["k"], ["kq"])
    assert progress.count("[") >= 4 and "[4/4]" in progress  # one progress line per point


def test_points_are_tagged_traces_that_load_again(recorded):
    store, out, _ = recorded
    s = open_store(store)
    sid = out["sweep"]
    for p in out["points"]:
        tags = s.summary(p["trace"])["tags"]
        assert f"sweep={sid}" in tags and f"c={p['values']['-c']}" in tags and f"ub={p['values']['-ub']}" in tags
    from alloctrace.traces.store.tags import parse_tag

    assert all(parse_tag(t) == t for t in tags if "=" in t)  # valid key=value tags: `list` and `compare` take them
    assert [(x["sweep"], x["points"], x["name"]) for x in sweep_ids(s)] == [(sid, 4, Path(sys.executable).name)]
    again = load(s, sid)
    # the workers summed each point up from the graph in hand; the store gives the same from what it kept
    keys = ("values", "buffers", "trace", "consistent", "graph", "families", "printed")
    assert [{k: p[k] for k in keys} for p in again["points"]] == [{k: p[k] for k in keys} for p in out["points"]]
    assert (again["laws"], again["dominance"], again["neighbours"]) == (out["laws"], out["dominance"], out["neighbours"])
    with pytest.raises(UserError):
        load(s, "nope")


def test_growth_law_follows_the_shapes(recorded):
    _, out, _ = recorded
    laws = {x["family"]: x["law"] for x in out["laws"]}
    assert laws["kq"]["kind"] == "shape"
    assert laws["kq"]["dims"] == ["-c", "-ub", 4, 1] and laws["kq"]["bytes_per_element"] == 4  # n_ctx·n_ubatch·n_head·4
    assert laws["kq"]["type"] == "f32" and laws["kq"]["formula"] == "4·-c·-ub·4 B"
    assert laws["k"]["dims"] == [64, "-c", 4, 1] and laws["SCALE"]["dims"] == [64, "-ub", 4, 1]  # the scaled q
    for p in out["points"]:  # the law gives each point's kq bytes
        kq = next(f for f in p["families"] if f["family"] == "kq")
        assert kq["bytes"] == 4 * int(p["values"]["-c"]) * int(p["values"]["-ub"]) * 4
        assert kq["ne"] == [int(p["values"]["-c"]), int(p["values"]["-ub"]), 4, 1] and kq["type"] == "f32"


def test_peak_of_a_point_shows_shapes_and_names_unnamed_tensors(recorded, capsys):
    store, out, _ = recorded
    p = out["points"][-1]  # -c 256, -ub 64
    assert main(["peak", p["trace"], "--store", str(store), "--json", "--tensors"]) == 0
    peak = json.loads(capsys.readouterr().out)
    fams = {f["family"]: f for f in peak["families"]}
    assert fams["kq"]["shape"]["ne"] == [256, 64, 4, 1] and fams["kq"]["shape"]["type"] == "f32"
    assert fams["kq"]["shape"]["bytes"] == fams["kq"]["bytes"] == 4 * 256 * 64 * 4
    assert fams["kq"]["shape"]["formula"] == "f32 [256, 64, 4]: 4·256·64·4 = 262,144 B"
    scale = next(t for t in peak["tensors"] if t["family"] == "SCALE")
    assert scale["tensor"].startswith("node_") and scale["label"] == "SCALE(q)"  # ggml's name, and ours
    assert fams["SCALE"]["first_node"] == "SCALE(q)"
    assert main(["peak", p["trace"], "--store", str(store), "--tensors"]) == 0
    text = capsys.readouterr().out
    assert "f32 [256, 64, 4]: 4·256·64·4 = 262,144 B" in text and "SCALE(q)" in text


def test_neighbours_are_attributed_exactly(recorded, capsys):
    _, out, _ = recorded
    by = {(n["setting"]["-ub"], n["a"], n["b"]): n for n in out["neighbours"]}
    n = by[("64", "128", "256")]
    assert n["delta"] == expected_bytes(256, 64, 4) - expected_bytes(128, 64, 4)
    assert {f["family"]: f["delta"] for f in n["families"]} == {"k": 4 * 64 * 128 * 4, "kq": 4 * 128 * 64 * 4}
    assert main(["diff", f"{n['a_trace']}:{n['a_graph']}", f"{n['b_trace']}:{n['b_graph']}", "--store",
                 str(recorded[0]), "--json"]) in (0, 1)
    att = json.loads(capsys.readouterr().out)["size_attribution"]  # what `diff` says is the same attribution
    assert att["delta"] == n["delta"] and [f for f in att["families"] if f["delta"]][:3] == n["families"]
    assert n["fragmentation_delta"] == 0


def test_text_report(tmp_path, capsys):
    rc = main(["sweep", "--store", str(tmp_path), "--vary=-c=64,128", "--", *PROGRAM, "-ub", "32", "-nh", "2"])
    out = capsys.readouterr().out
    assert rc == 0
    assert f"{expected_bytes(128, 32, 2):,}" in out and f"{expected_bytes(64, 32, 2):,}" in out
    assert "kq: 4·-c·32·2 B per tensor (kq: f32 [-c, 32, 2, 1])" in out
    assert "-c 64 -> 128: +" in out


def test_vary_as_two_words(tmp_path, capsys):
    out = json.loads(capsys.readouterr().out) if main(["sweep", "--store", str(tmp_path), "--vary", "-c=64,128",
                                                       "--json", "--", *PROGRAM]) == 0 else None
    assert out and [p["values"] for p in out["points"]] == [{"-c": "64"}, {"-c": "128"}]


def test_flash_attention_setting_changes_the_law(tmp_path, capsys):
    out = sweep(capsys, tmp_path, "--vary=-c=64,128", "--vary=-fa=on,off")
    on = [p for p in out["points"] if p["values"]["-fa"] == "on"]
    assert all(not any(f["family"] == "kq" for f in p["families"]) for p in on)
    kq = next(x for x in out["laws"] if x["family"] == "kq")
    assert kq["points"] == 2 and kq["present_at"] == [{"-c": "64", "-fa": "off"}, {"-c": "128", "-fa": "off"}]


def test_fit_finds_the_largest_value_an_exhaustive_scan_finds(tmp_path, capsys):
    budget = expected_bytes(200, 32, 4) + 1000  # between -c 200 and 201
    rc = main(["fit", "--store", str(tmp_path), "--budget", str(budget), "--compute-only", "--vary=-c=64..512",
               "--step", "8", "--json", "--", *PROGRAM, "-ub", "32", "-nh", "4"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    scan = [c for c in range(64, 513, 8) if expected_bytes(c, 32, 4) <= budget]
    assert out["value"] == max(scan) == 200
    assert out["point"]["buffers"] == {"CPU": expected_bytes(200, 32, 4)}
    assert out["next"]["value"] == 208 and out["next"]["total"] > budget
    assert len(out["probes"]) <= 8  # bisection, not a scan
    assert open_store(tmp_path).summary(out["point"]["trace"])["graphs"]  # the answer is a stored trace


def test_fit_when_nothing_fits(tmp_path, capsys):
    rc = main(["fit", "--store", str(tmp_path), "--budget", "1KiB", "--vary=-c=64..128", "--", *PROGRAM])
    assert rc == 1 and "nothing fits 1.00 KiB" in capsys.readouterr().out


@pytest.mark.parametrize("args,message", [
    (["sweep", "--vary=c=1,2", "--", "true"], "is not a flag"),
    (["sweep", "--vary=-c=", "--", "true"], "wants FLAG=VALUES"),
    (["sweep", "--vary=-c=1,1", "--", "true"], "given twice"),
    (["sweep", "--vary=-c=1", "--vary=-c=2", "--", "true"], "given twice"),
    (["sweep", "--vary=-c=1"], "name the program"),
    (["sweep", "--vary=-c=1", "--preset", "llama-7b", "--", "true"], "give one of them"),
    (["sweep", "--vary=-a=" + ",".join(map(str, range(20))), "--vary=-b=" + ",".join(map(str, range(20))), "--",
      "true"], "limited to 256 points"),
    (["sweep", "--", "true"], "needs --vary"),
    (["sweep", "--vary=-c=1", "--", "/no/such/program"], "program not found"),
    (["fit", "--budget", "8 parsecs", "--vary=-c=1..2", "--", "true"], "--budget wants a size"),
    (["fit", "--budget", "8GiB", "--vary=-c=4..2", "--", "true"], "0 < LOW < HIGH"),
    (["fit", "--budget", "8GiB", "--vary=-c=1,2", "--", "true"], "LOW..HIGH"),
])
def test_bad_input_is_one_line(tmp_path, capsys, args, message):
    assert main([args[0], "--store", str(tmp_path), *args[1:]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("alloctrace: error: ") and message in err and err.count("\n") == 1
    assert not open_store(tmp_path).list()


def test_a_failing_point_is_reported_not_stored(tmp_path, capsys):
    rc = main(["sweep", "--store", str(tmp_path), "--vary=-fa=off,maybe", "--json", "--", *PROGRAM, "-c", "64"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    ok, bad = out["points"]
    assert ok["buffers"] and ok["error"] is None
    assert bad["trace"] is None and bad["exit_status"] == 2 and "no ggml allocator calls" in bad["error"]
    assert len(open_store(tmp_path).list()) == 1


def test_with_values_replaces_or_appends():
    argv = ["prog", "-m", "x.gguf", "-c", "4096", "--ctx=1", "-fa", "on"]
    assert vary.with_values(argv, {"-c": "512", "-fa": "off", "-ub": "64"}) == \
        ["prog", "-m", "x.gguf", "-c", "512", "--ctx=1", "-fa", "off", "-ub", "64"]
    assert vary.with_values(["p", "--ctx=1"], {"--ctx": "2"}) == ["p", "--ctx=2"]
    assert vary.parse_vary("-c=512, 4096") == vary.Vary("-c", ("512", "4096"))
    assert vary.parse_range("-c=512..131072") == ("-c", 512, 131072)
    assert vary.tags({"-c": "512", "--ctx-size": "1", "-0x": "y"}) == ["c=512", "ctx-size=1", "flag_0x=y"]


def test_printed_sizes_of_real_llama_output():
    dry = printed.printed_sizes((DATA / "fit-params-c512-fa-off.txt").read_text())
    breakdown = {"breakdown_self": {"Host": 19}, "breakdown_model": {"Host": 6}, "breakdown_context": {"Host": 1},
                 "breakdown_compute": {"Host": 12}, "projected": {"host": 19}}
    # the dry run's weights: its printed file size (two decimals), the breakdown's 6 is 6.13 rounded down
    assert dry == {"weights": {"Host": 6.13}, "kv_cache": {"CPU": 1.0}, "compute": {"CPU": 12.01}, **breakdown}
    real = printed.printed_sizes((DATA / "completion-c512-fa-off.txt").read_text())
    assert real == {"weights": {"CPU_Mapped": 6.13}, "kv_cache": {"CPU": 1.0}, "compute": {"CPU": 12.01}}
    assert f"{12_593_152 / 2**20:.2f}" == f"{real['compute']['CPU']:.2f}"  # the recorded size, as printed


def test_printed_sizes_count_both_caches_of_a_sliding_window_model():
    """A gemma3 (iSWA) prints a `llama_kv_cache: size` line per cache: both count, each under its own label."""
    dry = printed.printed_sizes((DATA / "fit-params-iswa-c28416.txt").read_text())
    assert dry["kv_cache"] == {"CPU": 3.47, "CPU (SWA)": 0.47}
    assert dry["weights"] == {"Host": 0.49} and dry["compute"] == {"CPU": 29.65}
    assert (dry["breakdown_self"], dry["breakdown_context"], dry["projected"]) == ({"Host": 34}, {"Host": 3},
                                                                                  {"host": 34})
    assert round(printed.total_mib(dry), 2) == 4.43  # 0.49 + 3.47 + 0.47: the issue's fit counted 0.47 only
    # llama-completion with --fit: the fitting pass's 0.00 MiB buffers, then the real context's
    real = printed.printed_sizes((DATA / "completion-iswa-c1024-ub256.txt").read_text())
    assert real["kv_cache"] == {"CPU": 0.12, "CPU (SWA)": 0.31}
    assert real["weights"] == {"CPU_Mapped": 0.49} and real["compute"] == {"CPU": 1.32}


def test_a_hybrid_models_recurrent_state_counts_like_a_cache():
    """The lines a hybrid (attention + recurrent) model prints, as in a public Vulkan log of one: its recurrent
    state on two buffer types, and in a dry run (0.00 MiB buffers) from its `size` line."""
    real = """\
llama_kv_cache:    Vulkan1 KV buffer size =   160.00 MiB
llama_kv_cache: size =  160.00 MiB (  4096 cells,   8 layers,  1/1 seqs), K (f16):   80.00 MiB, V (f16):   80.00 MiB
llama_memory_recurrent:        CPU RS buffer size =    20.94 MiB
llama_memory_recurrent:    Vulkan1 RS buffer size =    29.31 MiB
llama_memory_recurrent: size =   50.25 MiB (     1 cells,  32 layers,  1 seqs  0 rs_seq), R (f32):    2.25 MiB, S (f32):   48.00 MiB
"""
    got = printed.printed_sizes(real)
    assert got["kv_cache"] == {"Vulkan1": 160.0} and got["recurrent_state"] == {"CPU": 20.94, "Vulkan1": 29.31}
    dry = printed.printed_sizes(real.replace("160.00 MiB\n", "0.00 MiB\n", 1).replace("20.94", "0.00")
                                .replace("29.31", "0.00"))
    assert dry["kv_cache"] == {"Vulkan1": 160.0} and dry["recurrent_state"] == {"total": 50.25}
    assert printed.total_mib(dry) == 210.25


def test_a_total_is_checked_against_the_programs_breakdown():
    from alloctrace.traces.preflight.breakdown import check, check_lines

    dry = printed.printed_sizes((DATA / "fit-params-iswa-c28416.txt").read_text())
    compute = {"CPU": 31_090_688}  # 29.65 MiB as printed
    c = check(compute, dry)
    assert c["agrees"], check_lines(c)
    (host,) = c["devices"]
    assert host["printed"] == {"self": 34, "model": 0, "context": 3, "compute": 29, "projected": 34}
    lo, hi = host["ours"]["self"]
    assert 34 <= lo <= hi < 35
    # the last cache alone (what fit counted before): the context part and the total differ, by how much is said
    one = {**dry, "kv_cache": {"total": 0.47}, "weights": {}}
    c = check(compute, one)
    assert not c["agrees"]
    differs = {d["part"]: d for d in c["devices"][0]["differs"]}
    assert set(differs) == {"context", "self", "projected"}
    assert differs["context"]["short_by"] == pytest.approx([3 - 0.475, 4 - 0.465])
    text = "\n".join(check_lines(c))
    assert "DIFFERS" in text and "context: ours 0.46 to 0.47 MiB, printed 3 MiB: short by 2.52 to 3.54 MiB" in text
    # the fitting pass's `projected to use N MiB of host memory` is checked as the Host total too
    assert host["printed"]["projected"] == 34
    c = check(compute, {**dry, "projected": {"host": 47}})
    assert [(x["part"], x["printed"]) for x in c["devices"][0]["differs"]] == [("projected", 47)]
    real = printed.printed_sizes((DATA / "completion-iswa-c1024-ub256.txt").read_text())
    assert check({"CPU": 1_387_520}, real)["agrees"]  # 1.32 MiB compute, at the real context's breakdown
    assert check({"CPU": 1}, printed.printed_sizes((DATA / "completion-c512-fa-off.txt").read_text())) is None


def test_sweep_rows_show_each_cache_the_total_and_the_check():
    from alloctrace.commands.sweep import program_lines
    from alloctrace.traces.preflight.breakdown import check

    dry = printed.printed_sizes((DATA / "fit-params-iswa-c28416.txt").read_text())
    compute = {"CPU": 31_090_688}
    point = {"values": {"-c": "28416"}, "buffers": compute, "consistent": True, "trace": "t1", "families": [],
             "error": None, "total": 35_735_000, "printed": dry, "check": check(compute, dry)}
    out = {"sweep": "s", "vary": [["-c", ["28416"]]], "points": [point], "laws": [], "dominance": [],
           "neighbours": []}
    head, row = program_lines(out)[1:3]
    assert "kv_cache CPU (printed)" in head and "kv_cache CPU (SWA) (printed)" in head and "breakdown" in head
    assert "3.47 MiB" in row and "0.47 MiB" in row and "35,735,000" in row and "agrees" in row
    one = {**dry, "kv_cache": {"total": 0.47}}
    lines = program_lines({**out, "points": [{**point, "printed": one, "check": check(compute, one)}]})
    assert "DIFFERS" in lines[2] and "  -c=28416: the total differs from the program's own breakdown" in lines
    assert any(line.strip().startswith("context: ours 0.46 to 0.47 MiB, printed 3 MiB") for line in lines)


# a CUDA build's breakdown rows, as llama.cpp prints them (a public report: Qwen3-Coder-Next on an RTX 5090, -c
# 4096); the buffer lines above them are composed to match (no CUDA build here to print them)
GPU_TEXT = """\
load_tensors:   CPU_Mapped model buffer size = 30940.20 MiB
load_tensors:        CUDA0 model buffer size = 28609.50 MiB
llama_kv_cache_iswa: creating non-SWA KV cache, size = 4096 cells
llama_kv_cache:      CUDA0 KV buffer size =   300.00 MiB
llama_kv_cache: size =  300.00 MiB (  4096 cells,  12 layers,  1/1 seqs), K (f16):  150.00 MiB, V (f16):  150.00 MiB
llama_kv_cache_iswa: creating     SWA KV cache, size = 1280 cells
llama_kv_cache:      CUDA0 KV buffer size =    97.50 MiB
llama_kv_cache: size =   97.50 MiB (  1280 cells,  36 layers,  1/1 seqs), K (f16):   48.75 MiB, V (f16):   48.75 MiB
llama_memory_breakdown_print: | memory breakdown [MiB] | total   free     self   model   context   compute    unaccounted |
llama_memory_breakdown_print: |   - CUDA0 (RTX 5090)   | 32606 = 1057 + (29365 = 28609 +     397 +     358) +        2183 |
llama_memory_breakdown_print: |   - Host               |                 30956 = 30940 +       0 +      16                |
"""


def test_each_device_is_checked_on_its_own_row():
    from alloctrace.traces.preflight.breakdown import check, check_lines

    pr = printed.printed_sizes(GPU_TEXT)
    assert pr["kv_cache"] == {"CUDA0": 300.0, "CUDA0 (SWA)": 97.5}
    assert pr["breakdown_self"] == {"CUDA0": 29365, "Host": 30956} and pr["breakdown_model"]["CUDA0"] == 28609
    compute = {"CUDA0": 358 * 2**20 + 123_456, "CUDA_Host": 16 * 2**20 + 7}  # exact, as a recording gives them
    c = check(compute, pr)
    assert c["agrees"], check_lines(c)
    assert [d["device"] for d in c["devices"]] == ["CUDA0", "Host"]
    # the SWA cache on the wrong device: both rows say so, each with its own part
    moved = {**pr, "kv_cache": {"CUDA0": 300.0, "CPU (SWA)": 97.5}}
    c = check(compute, moved)
    differs = {(d["device"], x["part"]) for d in c["devices"] for x in d["differs"]}
    assert differs == {("CUDA0", "context"), ("CUDA0", "self"), ("Host", "context"), ("Host", "self")}
    # a dry run's caches printed once for all devices: the devices' sums are checked, 2 rows' rounding wide
    spanning = {**pr, "kv_cache": {"total": 300.0, "total (SWA)": 97.5}}
    c = check(compute, spanning)
    (all_,) = c["devices"]
    assert c["agrees"] and all_["device"] == "all devices" and all_["printed"]["self"] == 29365 + 30956
    assert "2 rows summed, each rounded down" in check_lines(c)[0]


def _points(values: list[int], family_of) -> list[dict]:
    """Sweep points along -c whose one family is family_of(c): (bytes, ne)."""
    out = []
    for c in values:
        size, ne = family_of(c)
        fam = {"family": "kq_mask", "bytes": size, "tensor": "kq_mask", "tensor_bytes": size, "tensors": 1}
        if ne:
            fam.update(type="f16", ne=ne, label="kq_mask")
        out.append({"values": {"-c": str(c)}, "families": [fam], "error": None})
    return out


def test_laws_know_padding_and_clamps_and_never_cross_a_clamp():
    from alloctrace.traces.preflight.laws import law_lines, laws

    pad = lambda c: -(-c // 256) * 256  # noqa: E731  llama.cpp's cells
    # the mask [pad(n_ctx), min(-ub 512, n_ctx)] f16, -c not a multiple of 256
    (law,) = laws(_points([300, 700, 1000, 5000], lambda c: (2 * pad(c) * min(c, 512), [pad(c), min(c, 512), 1, 1])))
    assert law["law"]["dims"] == ["pad(-c, 256)", "min(-c, 512)", 1, 1]
    assert law["law"]["fitted_on"] == {"-c": [300, 5000]}
    # a sliding-window mask beside the full one, no shapes: the bytes change law where the window clamps
    swa = lambda c: 2 * min(c, 512) * (pad(c) + min(pad(c), 768))  # noqa: E731
    (law,) = laws(_points([256, 512, 1024, 4096, 16384], lambda c: (swa(c), None)))
    pw = law["law"]
    assert pw["kind"] == "piecewise" and pw["changes_between"] == [[256, 512], [512, 1024]]
    assert [p["fitted_on"]["-c"] for p in pw["pieces"]] == [[256, 256], [512, 512], [1024, 16384]]
    assert pw["pieces"][-1]["formula"] == "786432 + 1024·-c B"  # 2·512·(c + 768), beyond both clamps only
    (line,) = law_lines([law])
    assert "-c=1024..16384: 786432 + 1024·-c B" in line and "each piece holds only on its own points" in line
    # two points: a law fitted on both (any line fits two), not pieces
    assert laws(_points([256, 512], lambda c: (swa(c), None)))[0]["law"]["kind"] != "piecewise"


@pytest.mark.parametrize("keep", [None, 10 ** 9, 0])
def test_a_point_sums_up_the_same_from_kept_events_decoded_columns_or_the_store(tmp_path, monkeypatch, keep):
    """A worker sums its point up from the replay's own events (or, past the cap on kept events, from the
    columns it encoded): the same buffers, consistency, families and peak as the stored trace gives."""
    import io
    import lzma

    from alloctrace.traces.preflight.points import Point
    from alloctrace.traces.preflight.summary import summarise, summarise_imported
    from alloctrace.traces.sources import store_traces
    from alloctrace.traces.sources.record import plans
    from alloctrace.traces.sources.record.source import SOURCE

    if keep is not None:
        monkeypatch.setattr(plans, "MAX_KEPT_EVENTS", keep)
    for path in sorted((Path(__file__).parents[1] / "data" / "record").rglob("*.atrec*")):
        raw = path.read_bytes()
        raw = lzma.decompress(raw) if path.suffix == ".xz" else raw
        events: list = []
        traces = SOURCE.read(io.BytesIO(raw), filename=path.name, name="p", events=None if keep is None else events)
        if keep == 0:
            assert events and not events[0]  # nothing kept: the columns are decoded
        mine = Point({}, [])
        summarise_imported(mine, traces[0], events[0] if events else None)
        tid = store_traces(open_store(tmp_path / "s"), traces)[0]["id"]
        stored = Point({}, [])
        summarise(open_store(tmp_path / "s"), stored, tid)
        assert (mine.buffers, mine.consistent, mine.graph, mine.all_families) == \
            (stored.buffers, stored.consistent, stored.graph, stored.all_families), path.name
        assert mine.peak.to_json() == stored.peak.to_json(), path.name


def test_a_sweep_never_imports_numpy(tmp_path):
    """With -j 1 every part of a sweep runs in the command's own process (the program, ggml-python here, is
    a process of its own): reading, replaying, summing up, storing and the laws, all without numpy."""
    import subprocess

    probe = ("import sys\nfrom alloctrace.cli import main\n"
             f"rc = main(['sweep', '--store', {str(tmp_path / 's')!r}, '-j', '1', '--vary=-c=128,256', '--json', "
             f"'--', *{PROGRAM!r}, '-nh', '4'])\n"
             "print('NUMPY', rc, 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    last = out.stdout.strip().splitlines()[-1]
    assert last == "NUMPY 0 False", out.stdout[-400:] + out.stderr[-2000:]
