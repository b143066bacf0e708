"""`compare --base-ref`: a real git history where the merge base was never recorded (a merge commit on main),
so the base is the nearest recorded first-parent ancestor, else the base branch's newest trace; and `compare`
failing (exit 3) when traces pair with nothing. Real llama.cpp recordings (tests/data/compare)."""
from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from alloctrace.cli import main
from alloctrace.traces.regress.baseline import branch_name
from conftest import live_server

DATA = Path(__file__).resolve().parents[1] / "data" / "compare"
FA_ON, FA_OFF = DATA / "tiny-llama-fa-on.atrec.gz", DATA / "tiny-llama-fa-off.atrec.gz"


def git(repo: Path, *argv: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "HOME": str(repo.parent), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", "-C", str(repo), *argv], env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path) -> dict:
    """main: m1 - m2 - merge(m2, side) ; feature branches off the merge, one commit ahead."""
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    shas = {}
    for name in ("m1", "m2"):
        (r / "f").write_text(name)
        git(r, "add", "f")
        git(r, "commit", "-qm", name)
        shas[name] = git(r, "rev-parse", "HEAD")
    git(r, "checkout", "-qb", "side", shas["m1"])
    (r / "g").write_text("side")
    git(r, "add", "g")
    git(r, "commit", "-qm", "side")
    shas["side"] = git(r, "rev-parse", "HEAD")
    git(r, "checkout", "-q", "main")
    git(r, "merge", "-q", "--no-ff", "-m", "merge", "side")
    shas["merge"] = git(r, "rev-parse", "HEAD")
    git(r, "checkout", "-qb", "feature")
    (r / "f").write_text("feature")
    git(r, "commit", "-qam", "feature")
    shas["feature"] = git(r, "rev-parse", "HEAD")
    return {"path": r, **shas}


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def put(store, capsys, path, *tags):
    argv = ["import", str(path), "--store", store]
    for t in tags:
        argv += ["--tag", t]
    assert main(argv) == 0
    capsys.readouterr()


def test_the_nearest_recorded_ancestor_of_an_unrecorded_merge_base(repo, tmp_path, capsys):
    store = str(tmp_path / "s")
    # m2 recorded (short hash, as CI tags it); the merge commit (the merge base) never was; `side` was, on a
    # side branch: never the base of main, though it is an ancestor of the merge base
    put(store, capsys, FA_ON, f"commit={repo['m2'][:7]}", "branch=main", "config=a")
    put(store, capsys, FA_ON, f"commit={repo['side'][:9]}", "branch=side", "config=a")
    put(store, capsys, FA_OFF, f"commit={repo['feature'][:7]}", "branch=feature", "config=a")
    argv = ["compare", "--store", store, "--base-ref", "main", "--repo", str(repo["path"]),
            "--head", f"commit={repo['feature'][:7]}"]
    code, out, _ = run(capsys, *argv, "--json")
    got = json.loads(out)
    assert code == 1 and got["base"] == [f"commit={repo['m2'][:7]}"]
    b = got["baseline"]
    assert (b["how"], b["commit"], b["distance"], b["merge_base"]) == ("ancestor", repo["m2"][:7], 1, repo["merge"])
    code, out, _ = run(capsys, *argv)
    assert f"base commit={repo['m2'][:7]}: 1 commit(s) before the merge base {repo['merge'][:12]}" in out
    code, out, _ = run(capsys, *argv, "--markdown")
    assert "1 commit(s) before the merge base" in out.splitlines()[2]
    # once the merge base itself is recorded, it is the base, 0 back
    put(store, capsys, FA_OFF, f"commit={repo['merge']}", "branch=main", "config=a")
    code, out, _ = run(capsys, *argv, "--json")
    b = json.loads(out)["baseline"]
    assert code == 0 and (b["commit"], b["distance"]) == (repo["merge"], 0)


def test_the_walk_is_bounded_then_the_branch_stands_in(repo, tmp_path, capsys):
    store = str(tmp_path / "s")
    put(store, capsys, FA_ON, f"commit={repo['m1'][:8]}", "branch=main", "config=a")
    put(store, capsys, FA_ON, "commit=0123abc", "branch=main", "config=a")  # newer, not in this history
    put(store, capsys, FA_OFF, f"commit={repo['feature'][:7]}", "config=a")
    base = ["compare", "--store", store, "--repo", str(repo["path"]), "--head", f"commit={repo['feature'][:7]}",
            "--json"]
    got = json.loads(run(capsys, *base, "--base-ref", "main")[1])["baseline"]
    assert (got["commit"], got["distance"]) == (repo["m1"][:8], 2)
    # two first-parent commits looked at (merge, m2): m1 is out of reach, the branch's newest trace stands in
    code, out, _ = run(capsys, *base, "--base-ref", "main", "--walk", "2")
    got = json.loads(out)["baseline"]
    assert (got["how"], got["commit"], got["walked"], got["branch"]) == ("branch", "0123abc", 2, "main")
    assert "none of the merge base's 2 first-parent ancestors was recorded" in got["text"]
    code, _, err = run(capsys, *base[:-1], "--base-ref", "main", "--walk", "2", "--base-branch", "release")
    assert code == 2 and err.startswith("alloctrace: error: compare: no recorded commit among the 2") and \
        "branch=release" in err and err.count("\n") == 1


@pytest.mark.parametrize("ref,message", [("no-such-ref", "git merge-base"), ("--output=x", "not a git revision")])
def test_a_bad_ref_is_one_line(repo, tmp_path, capsys, ref, message):
    from alloctrace.traces.store.store import open_store

    open_store(tmp_path / "s").close()  # a store, empty: the ref is what is wrong
    code, _, err = run(capsys, "compare", "--store", str(tmp_path / "s"), "--repo", str(repo["path"]),
                       f"--base-ref={ref}", "--head", "commit=abc")
    assert code == 2 and message in err and err.count("\n") == 1


def test_branch_names_of_refs():
    assert [branch_name(r) for r in ("origin/main", "refs/remotes/up/dev", "refs/heads/x/y", "main")] == \
        ["main", "dev", "x/y", "main"]


def test_unpaired_traces_exit_3_unless_allowed(tmp_path, capsys):
    store = str(tmp_path / "s")
    put(store, capsys, FA_ON, "commit=aaa", "config=a")
    put(store, capsys, FA_ON, "commit=bbb", "config=a")
    put(store, capsys, FA_ON, "commit=bbb", "config=renamed")
    argv = ["compare", "--store", store, "--base", "commit=aaa", "--head", "commit=bbb"]
    code, out, _ = run(capsys, *argv, "--markdown")
    assert code == 3 and "(no growth, unpaired traces" in out.splitlines()[0]
    assert "**UNPAIRED: 0 base and 1 head trace(s) pair with nothing" in out
    assert "- only in head: tiny-llama-fa-on.atrec.gz" in out and "config=renamed" in out
    assert run(capsys, *argv, "--allow-unpaired")[0] == 0
    # nothing paired at all (a renamed tag on every trace): exit 3 even when unpaired traces are allowed
    put(store, capsys, FA_ON, "commit=ccc", "config=other")
    code, out, _ = run(capsys, "compare", "--store", store, "--base", "commit=aaa", "--head", "commit=ccc",
                       "--allow-unpaired")
    assert code == 3 and "no buffer grew past the threshold in 0 pair(s)" in out and "UNPAIRED: no trace" in out


def test_the_api_resolves_the_base_from_ancestors(repo, tmp_path, capsys):
    store = tmp_path / "s"
    put(str(store), capsys, FA_ON, f"commit={repo['m2'][:7]}", "branch=main", "config=a")
    put(str(store), capsys, FA_OFF, f"commit={repo['feature'][:7]}", "config=a")
    put(str(store), capsys, FA_OFF, f"commit={repo['feature'][:7]}", "config=b")
    put(str(store), capsys, FA_ON, "commit=ddd1234", "config=b")
    ancestors = git(repo["path"], "rev-list", "--first-parent", repo["merge"]).split()
    with live_server(store) as url:
        q = [("head", f"commit={repo['feature'][:7]}"), ("format", "markdown")] + [("ancestor", a) for a in ancestors]
        with urllib.request.urlopen(f"{url}/api/compare?{urllib.parse.urlencode(q)}", timeout=60) as r:
            body, headers = r.read().decode(), r.headers
        assert headers["X-Alloctrace-Base"] == repo["m2"][:7] and headers["X-Alloctrace-Grew"] == "true"
        assert headers["X-Alloctrace-Status"] == "1" and "1 commit(s) before the merge base" in body
        q = [("head", f"commit={repo['m2'][:7]}"), ("base", "commit=ddd1234"), ("allow_unpaired", "true")]
        with urllib.request.urlopen(f"{url}/api/compare?{urllib.parse.urlencode(q)}", timeout=60) as r:
            got = json.loads(r.read())
            assert r.headers["X-Alloctrace-Status"] == "3" and got["unpaired"] is True and got["pairs"] == []
