"""The CI recipe (ci/memory-check.sh), its steps run as a CI job would: a base commit and a head commit each
built, recorded, tagged and uploaded, to a local server over the HTTP API with a write token or straight into
the store (SQLite directory or PostgreSQL URL); compare against the base, the markdown posted, and the job's
status 1 when the buffer grew (flash attention off in the head), 0 when nothing did. The recordings are the
real llama.cpp ones of tests/data/compare (with ALLOCTRACE_LLAMA_BIN set, a real record step runs too)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import live_server

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "memory-check.sh"
DATA = Path(__file__).resolve().parents[1] / "data" / "compare"
# the record step, with recordings made before: "$flags" is the config's flag value (on / off)
FROM_FIXTURES = f'gunzip -c "{DATA}/tiny-llama-fa-${{flags// /}}.atrec.gz" > "$out"'


def job(tmp_path: Path, step: str, commit: str, fa: str, **env) -> subprocess.CompletedProcess:
    model = tmp_path / "model.gguf"  # present, so the record step fetches nothing (FROM_FIXTURES does not read it)
    model.touch()
    e = {"ALLOCTRACE_MODEL": str(model), **os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
         "ALLOCTRACE_COMMIT": commit,
         "ALLOCTRACE_BASE": "base111", "ALLOCTRACE_BRANCH": "feature", "ALLOCTRACE_BUILD": f"echo built {commit}",
         "ALLOCTRACE_CONFIGS": f"tiny-c256: {fa}", "ALLOCTRACE_RECORD": FROM_FIXTURES,
         "ALLOCTRACE_OUT": str(tmp_path / commit), "ALLOCTRACE_COMMENT": f'cp "$OUT/memory.md" "{tmp_path}/posted.md"',
         **env}
    return subprocess.run(["bash", str(SCRIPT), step], env=e, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)


def run_pr(tmp_path, head_fa: str, **env) -> subprocess.CompletedProcess:
    for commit, fa in (("base111", "on"), ("head222", head_fa)):
        for step in ("build", "record", "upload"):
            r = job(tmp_path, step, commit, fa, **env)
            assert r.returncode == 0, r.stdout + r.stderr
    r = job(tmp_path, "compare", "head222", head_fa, **env)
    assert r.returncode == 0, r.stdout + r.stderr
    return job(tmp_path, "comment", "head222", head_fa, **env)


def check_grew(tmp_path, done):
    assert done.returncode == 1, done.stdout + done.stderr
    posted = (tmp_path / "posted.md").read_text()
    assert posted.startswith("<!-- alloctrace-memory-check -->\n### Memory: commit=base111 → commit=head222 (grew")
    row = next(line for line in posted.splitlines() if line.startswith("| config=tiny-c256"))
    assert "**+143.50 KiB (+17.5%)**" in row and "kq +512.00 KiB" in row


def test_the_recipe_over_the_http_api_with_a_token(tmp_path):
    with live_server(tmp_path / "store", token="ci-write", read_tokens=["viewer"]) as url:
        done = run_pr(tmp_path, "off", ALLOCTRACE_SERVER=url, ALLOCTRACE_TOKEN="ci-write")
        check_grew(tmp_path, done)
        refused = job(tmp_path, "upload", "head333", "off", ALLOCTRACE_SERVER=url, ALLOCTRACE_TOKEN="viewer")
        assert refused.returncode != 0  # a read-only token cannot upload


def test_the_recipe_straight_into_the_store(tmp_path, store_ref):
    done = run_pr(tmp_path, "off", ALLOCTRACE_STORE=store_ref)
    check_grew(tmp_path, done)
    listed = subprocess.run([sys.executable, "-m", "alloctrace", "list", "-q", "branch=feature config=tiny-c256",
                             "--store", store_ref], capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and listed.stdout.count("tiny-c256 ") == 2


def test_no_growth_passes(tmp_path):
    with live_server(tmp_path / "store", token="ci-write") as url:
        done = run_pr(tmp_path, "on", ALLOCTRACE_SERVER=url, ALLOCTRACE_TOKEN="ci-write")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(no growth" in (tmp_path / "posted.md").read_text()


@pytest.mark.parametrize("where", ["server", "store"])
def test_all_fails_when_an_upload_fails(tmp_path, where):
    """`all` runs the steps in one shell: the first of two files refused (not a recording), the second
    stored, still stops it before compare with exit 2 and the file named (it used to go on)."""
    record = f'if [ "${{flags// /}}" = broken ]; then echo "not a recording" > "$out"; else {FROM_FIXTURES}; fi'
    env = dict(ALLOCTRACE_CONFIGS="a-first: broken\ntiny-c256: on", ALLOCTRACE_RECORD=record, PR="5")
    if where == "server":
        with live_server(tmp_path / "store", token="ci-write") as url:
            done = job(tmp_path, "all", "head222", "on", ALLOCTRACE_SERVER=url, ALLOCTRACE_TOKEN="ci-write", **env)
    else:
        done = job(tmp_path, "all", "head222", "on", ALLOCTRACE_STORE=str(tmp_path / "store"), **env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert re.search(r"memory-check: (uploading|storing) \S*a-first.atrec", done.stderr), done.stderr
    assert not (tmp_path / "head222" / "memory.md").exists() and not (tmp_path / "posted.md").exists()


def test_a_model_that_cannot_be_fetched_stops_the_record_step(tmp_path):
    """The model is missing and its address answers nothing: the step stops there with exit 2 and says so,
    instead of running the recorder on a file that is not there (bash's errexit is off inside `||`)."""
    marker = tmp_path / "recorded"
    done = job(tmp_path, "record", "head222", "on", ALLOCTRACE_MODEL=str(tmp_path / "models" / "absent.gguf"),
               ALLOCTRACE_MODEL_URL=f"file://{tmp_path}/nowhere.gguf", ALLOCTRACE_RECORD=f'touch "{marker}"')
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"memory-check: cannot fetch the model from file://{tmp_path}/nowhere.gguf" in done.stderr
    assert not marker.exists() and not (tmp_path / "models" / "absent.gguf").exists()


def test_unpaired_traces_fail_the_job(tmp_path):
    """The head records a config the base never had: compare exits 3 and the comment says which trace."""
    with live_server(tmp_path / "store", token="ci-write") as url:
        for commit, configs in (("base111", "tiny-c256: on"), ("head222", "tiny-c256: on\nrenamed: on")):
            for step in ("build", "record", "upload"):
                r = job(tmp_path, step, commit, "on", ALLOCTRACE_SERVER=url, ALLOCTRACE_TOKEN="ci-write",
                        ALLOCTRACE_CONFIGS=configs)
                assert r.returncode == 0, r.stdout + r.stderr
        r = job(tmp_path, "compare", "head222", "on", ALLOCTRACE_SERVER=url, ALLOCTRACE_TOKEN="ci-write")
        done = job(tmp_path, "comment", "head222", "on")
    assert done.returncode == 3, r.stdout + r.stderr + done.stdout + done.stderr
    posted = (tmp_path / "posted.md").read_text()
    assert "unpaired traces" in posted.splitlines()[1] and "- only in head: renamed head222" in posted


@pytest.mark.skipif(not os.environ.get("ALLOCTRACE_LLAMA_BIN"), reason="ALLOCTRACE_LLAMA_BIN is not set")
def test_the_recipe_records_a_real_program(tmp_path):
    bin_path = Path(os.environ["ALLOCTRACE_LLAMA_BIN"])
    env = {"ALLOCTRACE_STORE": str(tmp_path / "store"), "ALLOCTRACE_PROGRAM": str(bin_path),
           "ALLOCTRACE_MODEL": str(bin_path.resolve().parent.parent / "models" / "tiny-llama.gguf"),
           "LD_LIBRARY_PATH": str(bin_path.resolve().parent), "ALLOCTRACE_RECORD":
               'alloctrace record -o "$out" -- "$PROGRAM" -m "$MODEL" -p "The quick brown fox" -n 1 -c 256 -b 256 '
               '-ub 64 -fa $flags -t 2 -tb 2 -ngl 0 --temp 0 --seed 42 -no-cnv -fit off -v'}
    check_grew(tmp_path, run_pr(tmp_path, "off", **env))
