"""A local stand-in for a GitHub Actions runner, enough to run ci/github-actions.yml as written: its
`${{ }}` expressions (names, 'literals', ||, ==), `if:`, env at workflow, job and step level, `run:` steps
in `bash --noprofile --norc -eo pipefail` (the runner's default shell) in the checked-out workspace, and the
actions it uses (checkout: a clone at `with.ref` with full history; setup-python: a virtual environment that
sees the system's packages; upload-artifact: a copy). Anything else is refused, so a new action in the
workflow fails the test instead of being skipped.

A fake GitHub REST API (issue comments only) stands for github.com; the job's token may write only where
the workflow's `permissions:` allow it (none declared: read-only, as on repositories with the default
read-only token).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}", re.S)


def _lookup(name: str, ctx: dict):
    value = ctx
    for part in name.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def evaluate(expr: str, ctx: dict, failed: bool = False):
    """The expression subset: `a || b` (the first truthy), `a == b`, `!a`, 'literal', true/false, always(),
    success(), failure(), context names (unknown ones are null)."""
    operands = [o.strip() for o in expr.split("||")]
    value = None
    for op in operands:
        if "==" in op or "!=" in op:
            negate = "!=" in op
            left, right = (x.strip() for x in re.split(r"==|!=", op, maxsplit=1))
            value = (evaluate(left, ctx, failed) == evaluate(right, ctx, failed)) != negate
        elif op.startswith("!"):
            value = not evaluate(op[1:], ctx, failed)
        elif op.startswith("'") and op.endswith("'"):
            value = op[1:-1].replace("''", "'")
        elif op in ("true", "false"):
            value = op == "true"
        elif op == "always()":
            value = True
        elif op == "success()":
            value = not failed
        elif op == "failure()":
            value = failed
        elif re.fullmatch(r"[A-Za-z_][\w.-]*", op):
            value = _lookup(op, ctx)
        else:
            raise ValueError(f"expression the runner stand-in does not know: {op!r}")
        if value:
            return value
    return value


def substitute(text, ctx: dict) -> str:
    """A value with its `${{ }}` expressions replaced (null renders empty, as on GitHub)."""
    def one(m):
        v = evaluate(m.group(1), ctx)
        return "" if v is None else ("true" if v is True else "false" if v is False else str(v))
    return EXPR.sub(one, str(text))


@dataclass
class Event:
    """What triggered the job: a push to a branch, or a pull request's synchronize."""

    name: str
    sha: str
    ref_name: str
    pr: int | None = None
    base_ref: str = ""
    repository: str = "team/program"

    def context(self, token: str) -> dict:
        event = {"repository": {"default_branch": "main", "full_name": self.repository}}
        if self.pr is not None:
            event["pull_request"] = {"number": self.pr, "head": {"sha": self.sha, "ref": self.ref_name},
                                     "base": {"ref": self.base_ref}}
        return {"event_name": self.name, "sha": self.sha, "repository": self.repository, "token": token,
                "ref_name": f"{self.pr}/merge" if self.pr is not None else self.ref_name,
                "head_ref": self.ref_name if self.pr is not None else "",
                "base_ref": self.base_ref if self.pr is not None else "", "event": event}


@dataclass
class StepResult:
    name: str
    rc: int | None  # None: skipped
    output: str = ""


@dataclass
class JobResult:
    steps: list[StepResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.rc in (0, None) for s in self.steps)

    def log(self) -> str:
        return "\n".join(f"--- {s.name}: {s.rc}\n{s.output}" for s in self.steps)


def run_job(workflow: dict, job: str, event: Event, remote: Path, runner: Path, *, vars: dict | None = None,
            secrets: dict | None = None, api_url: str = "", token: str = "ghs_job_token",
            python_env: Path | None = None, timeout: int = 600) -> JobResult:
    """Run one job of the parsed workflow for `event`, against the repository at `remote`, in `runner` (a
    fresh folder: the workspace, the tool cache and the artifacts live there)."""
    ctx = {"github": event.context(token), "vars": vars or {}, "secrets": secrets or {}}
    spec = workflow["jobs"][job]
    workspace = runner / "work"
    tools = python_env or runner / "python"
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", str(runner)), "CI": "true",
           "GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(workspace), "GITHUB_REPOSITORY": event.repository,
           "GITHUB_API_URL": api_url, "GITHUB_EVENT_NAME": event.name, "GITHUB_SHA": event.sha,
           "GITHUB_REF_NAME": ctx["github"]["ref_name"], "GITHUB_HEAD_REF": ctx["github"]["head_ref"],
           "GITHUB_BASE_REF": ctx["github"]["base_ref"], "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "LANG": "C.UTF-8"}
    for scope in (workflow.get("env") or {}, spec.get("env") or {}):
        env.update({k: substitute(v, ctx) for k, v in scope.items()})
    result = JobResult()
    for i, step in enumerate(spec["steps"]):
        name = step.get("name") or step.get("uses") or step["run"].splitlines()[0]
        cond = step.get("if")
        if cond is not None and not evaluate(EXPR.sub(lambda m: m.group(1), str(cond)), ctx, not result.ok):
            result.steps.append(StepResult(name, None, "skipped: if"))
            continue
        if not result.ok and cond is None:  # a failed step skips the rest, as success() is the default
            result.steps.append(StepResult(name, None, "skipped: an earlier step failed"))
            continue
        step_env = {**env, **{k: substitute(v, ctx) for k, v in (step.get("env") or {}).items()}}
        with_ = {k: substitute(v, ctx) for k, v in (step.get("with") or {}).items()}
        if "uses" in step:
            rc, out = _action(step["uses"], with_, remote, workspace, tools, runner, env)
        else:
            script = runner / f"step{i}.sh"
            script.write_text(substitute(step["run"], ctx))
            p = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=workspace,
                               env=step_env, capture_output=True, text=True, timeout=timeout)
            rc, out = p.returncode, p.stdout + p.stderr
        result.steps.append(StepResult(name, rc, out))
    return result


def _action(uses: str, with_: dict, remote: Path, workspace: Path, tools: Path, runner: Path,
            env: dict) -> tuple[int, str]:
    action = uses.partition("@")[0]
    if action == "actions/checkout":
        shutil.rmtree(workspace, ignore_errors=True)
        depth = [] if str(with_.get("fetch-depth", "1")) == "0" else ["--depth", str(with_.get("fetch-depth", 1))]
        clone = subprocess.run(["git", "clone", "-q", *depth, f"file://{remote}", str(workspace)],
                               capture_output=True, text=True)
        if clone.returncode:
            return clone.returncode, clone.stderr
        ref = with_.get("ref") or env["GITHUB_SHA"]
        co = subprocess.run(["git", "-C", str(workspace), "checkout", "-q", "--detach", ref], capture_output=True,
                            text=True)
        return co.returncode, co.stderr
    if action == "actions/setup-python":
        if not (tools / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(tools)], check=True)
        env["PATH"] = f"{tools / 'bin'}:{env['PATH']}"  # later steps find this python first
        return 0, f"python {with_.get('python-version')} from {tools}"
    if action == "actions/upload-artifact":
        src = workspace / with_["path"]
        if src.exists():
            shutil.copytree(src, runner / "artifacts" / with_["name"], dirs_exist_ok=True, symlinks=True,
                            ignore=shutil.ignore_patterns("base-src", "store"))
        return 0, ""
    return 1, f"the runner stand-in does not run {uses}"


class FakeGitHub:
    """Issue comments of one repository over HTTP, as the REST API answers them; writes need the job
    token's `pull-requests: write` (or `issues: write`)."""

    def __init__(self, token: str, permissions: dict | None):
        self.token, self.comments, self.next_id, self.requests = token, {}, 1000, []
        perms = permissions or {}
        if isinstance(perms, str):  # read-all / write-all
            perms = {"pull-requests": perms.split("-")[0], "issues": perms.split("-")[0]}
        self.can_write = "write" in (perms.get("pull-requests"), perms.get("issues"))
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _answer(self, code: int, body) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self):
                outer.requests.append((self.command, self.path))
                if self.headers.get("Authorization") != f"Bearer {outer.token}":
                    return self._answer(401, {"message": "Bad credentials"})
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}") if n else {}
                path, _, query = self.path.partition("?")
                m = re.fullmatch(r"/repos/[^/]+/[^/]+/issues/(\d+)/comments", path)
                e = re.fullmatch(r"/repos/[^/]+/[^/]+/issues/comments/(\d+)", path)
                if self.command != "GET" and not outer.can_write:
                    return self._answer(403, {"message": "Resource not accessible by integration"})
                if m and self.command == "GET":
                    q = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
                    per, page = int(q.get("per_page", 30)), int(q.get("page", 1))
                    rows = [c for c in outer.comments.values() if c["issue"] == int(m.group(1))]
                    return self._answer(200, rows[(page - 1) * per: page * per])
                if m and self.command == "POST":
                    outer.next_id += 1
                    outer.comments[outer.next_id] = {"id": outer.next_id, "issue": int(m.group(1)),
                                                     "body": body["body"], "edits": 0}
                    return self._answer(201, outer.comments[outer.next_id])
                if e and self.command == "PATCH" and int(e.group(1)) in outer.comments:
                    c = outer.comments[int(e.group(1))]
                    c["body"], c["edits"] = body["body"], c["edits"] + 1
                    return self._answer(200, c)
                return self._answer(404, {"message": "Not Found"})

            do_GET = do_POST = do_PATCH = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "FakeGitHub":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
