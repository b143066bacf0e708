"""ci/github-actions.yml run as written by a local runner stand-in (tests/actions_runner.py): from an empty
temporary repository with two commits, the job installs alloctrace from the project's repository at the
pinned tag (a git clone of this tree, tagged), runs the recipe the package ships, and ends in the pull
request's comment on a fake GitHub API, edited in place on the next push. The program's recordings are
the real llama.cpp ones of tests/data/compare, chosen by a file of the commit (its "build" output)."""
from __future__ import annotations

import copy
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from actions_runner import Event, FakeGitHub, run_job

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW_FILE = ROOT / "ci" / "github-actions.yml"
DATA = Path(__file__).resolve().parents[1] / "data" / "compare"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
TOKEN = "ghs_job_token"
# the program's recording: the commit's file `fa` says whether flash attention is on
RECORD = f'gunzip -c "{DATA}/tiny-llama-fa-$(cat fa).atrec.gz" > "$out"'
GIT_ENV = {"GIT_AUTHOR_NAME": "dev", "GIT_AUTHOR_EMAIL": "dev@example.org", "GIT_COMMITTER_NAME": "dev",
           "GIT_COMMITTER_EMAIL": "dev@example.org", "PATH": "/usr/bin:/bin"}


def load_workflow() -> dict:
    wf = yaml.safe_load(WORKFLOW_FILE.read_text())
    wf["on"] = wf.pop(True, wf.get("on"))  # YAML 1.1 reads the key `on` as true
    return wf


def git(repo: Path, *argv: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *argv], env={**GIT_ENV, "HOME": str(repo.parent)}, check=True,
                          capture_output=True, text=True).stdout.strip()


def commit(repo: Path, fa: str, message: str) -> str:
    (repo / "fa").write_text(fa)
    git(repo, "add", "fa")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def install_source(tmp_path_factory) -> str:
    """The workflow's default install source with github.com replaced by a local clone of this tree, tagged."""
    default = re.search(r"vars\.ALLOCTRACE_INSTALL \|\| '([^']+)'", WORKFLOW_FILE.read_text()).group(1)
    repository = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
    assert default == f"git+{repository}@v{VERSION}", default  # the package's own declared home, at its tag
    src = tmp_path_factory.mktemp("alloctrace-repo")
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for rel in (f for f in files if f and (ROOT / f).is_file()):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    git(src, "init", "-q")
    git(src, "add", "-A")
    git(src, "commit", "-qm", "release")
    git(src, "tag", f"v{VERSION}")
    return f"git+file://{src}@v{VERSION}"


@pytest.fixture(scope="module")
def python_env(tmp_path_factory) -> Path:
    """setup-python's interpreter, one for the module (each job still runs the install step)."""
    return tmp_path_factory.mktemp("toolcache") / "python"


@pytest.fixture
def program(tmp_path) -> Path:
    repo = tmp_path / "program"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    return repo


def job(tmp_path, name, event, program, github, python_env, install_source, workflow=None, **vars):
    runner = tmp_path / name
    runner.mkdir()
    secrets = {k: vars.pop(k) for k in list(vars) if k in ("ALLOCTRACE_STORE", "ALLOCTRACE_TOKEN")}
    vars = {"ALLOCTRACE_INSTALL": install_source, "ALLOCTRACE_BUILD": "test -s fa", "ALLOCTRACE_RECORD": RECORD,
            "ALLOCTRACE_CONFIGS": "tiny-c256: -c 256", "ALLOCTRACE_MODEL_URL": f"file://{DATA}/README.md", **vars}
    return run_job(workflow or load_workflow(), "memory", event, program, runner, vars=vars, secrets=secrets,
                   api_url=github.url, token=TOKEN, python_env=python_env)


def test_the_workflow_declares_what_it_needs():
    wf = load_workflow()
    assert wf["permissions"] == {"contents": "read", "pull-requests": "write"}
    assert set(wf["on"]) == {"push", "pull_request"}
    steps = wf["jobs"]["memory"]["steps"]
    runs = " ".join(s.get("run", "") for s in steps)
    assert "pip install alloctrace" not in runs and "ci/" not in runs  # no index release, no file of the repo
    header = (ROOT / "ci" / "memory-check.sh").read_text().split("set -euo pipefail")[0]
    docs = (ROOT / "docs" / "team.md").read_text()
    for name in wf["env"]:
        assert name in docs, f"{name} is not documented in docs/team.md"
        if name != "ALLOCTRACE_INSTALL":
            assert name in header, f"{name} is not documented in memory-check.sh"


def test_a_plain_runner_comments_and_edits_the_comment_on_the_next_push(tmp_path, program, python_env,
                                                                        install_source):
    base = commit(program, "on", "flash attention on")
    git(program, "checkout", "-qb", "feature")
    head = commit(program, "off", "flash attention off")
    with FakeGitHub(TOKEN, load_workflow()["permissions"]) as github:
        pr = dict(pr=7, base_ref="main", ref_name="feature")
        done = job(tmp_path, "run1", Event("pull_request", head, **pr), program, github, python_env, install_source)
        assert [s.rc for s in done.steps] == [0, 0, 0, 1, 0], done.log()  # the buffer grew: the job fails
        where = subprocess.run([str(python_env / "bin" / "python"), "-c", "import alloctrace; print(alloctrace.__file__)"],
                               capture_output=True, text=True, cwd=tmp_path).stdout
        assert where.startswith(str(python_env)), where  # the fresh install, not this checkout
        (first,) = github.comments.values()
        body = first["body"]
        assert first["issue"] == 7 and body.startswith("<!-- alloctrace-memory-check -->\n### Memory: ")
        assert f"commit={base[:12]} → commit={head[:12]} (grew" in body
        assert f"base commit={base[:12]}: the merge base {base[:12]}" in body  # recorded in this same job
        row = next(line for line in body.splitlines() if line.startswith("| config=tiny-c256"))
        assert "**+143.50 KiB (+17.5%)**" in row and "kq +512.00 KiB" in row
        assert "dashboard" not in body  # no server, no link
        assert (tmp_path / "run1" / "artifacts" / "memory-check" / "memory.md").read_text() == body

        fixed = commit(program, "on", "flash attention back on")
        done = job(tmp_path, "run2", Event("pull_request", fixed, **pr), program, github, python_env, install_source)
        assert done.ok, done.log()
        (again,) = github.comments.values()  # the same comment, edited
        assert again["id"] == first["id"] and again["edits"] == 1
        assert f"→ commit={fixed[:12]} (no growth" in again["body"]


def test_a_shared_store_whose_merge_base_was_never_recorded(tmp_path, program, python_env, install_source):
    store = str(tmp_path / "shared-store")
    shared = dict(ALLOCTRACE_STORE=store, ALLOCTRACE_DASHBOARD="https://alloc.example.org/")
    c1 = commit(program, "on", "recorded on main")
    with FakeGitHub(TOKEN, load_workflow()["permissions"]) as github:
        done = job(tmp_path, "push", Event("push", c1, "main"), program, github, python_env, install_source, **shared)
        assert done.ok and not github.requests, done.log()  # a push records and stores, comments nowhere
        c2 = commit(program, "on\n", "its CI run was skipped")  # the same flags
        git(program, "checkout", "-qb", "feature")
        c3 = commit(program, "off", "flash attention off")
        event = Event("pull_request", c3, "feature", pr=9, base_ref="main")
        done = job(tmp_path, "pr", event, program, github, python_env, install_source, **shared)
        assert done.steps[3].rc == 1, done.log()
        (posted,) = github.comments.values()
        body = posted["body"]
        assert f"base commit={c1[:12]}: 1 commit(s) before the merge base {c2[:12]}" in body
        assert (f"[Open this comparison on the dashboard](https://alloc.example.org/history?key=commit&"
                f"base={c1[:12]}&head={c3[:12]}#compare)") in body

        # the same job under a workflow without `permissions:` (a read-only token): the comment step fails
        bare = copy.deepcopy(load_workflow())
        del bare["permissions"]
    with FakeGitHub(TOKEN, bare.get("permissions")) as github:
        done = job(tmp_path, "bare", event, program, github, python_env, install_source, workflow=bare, **shared)
        assert done.steps[3].rc == 2 and "cannot comment on PR 9" in done.steps[3].output, done.log()
