"""Which recorded commit a pull request is compared with when its merge base was never recorded.

A merge commit, a skipped or failed CI run, a squash: the merge base of the head and the base branch often
has no traces. The base is then the nearest recorded commit on the base branch's line before it (`git
rev-list --first-parent` from the merge base, so commits of other branches merged into it never stand for
the base branch), bounded; failing that, the newest trace tagged with the base branch's name. The answer
says which commit was taken and how far back it lies, so a comparison against an old base is visible.
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

from alloctrace.traces.errors import UserError
from alloctrace.traces.store.tags import as_dict

COMMIT_KEY = "commit"
MAX_WALK = 200  # first-parent commits looked at from the merge base, by default
WALK_LIMIT = 10_000  # the most a caller may ask for
MIN_PREFIX = 7  # shorter commit values are too ambiguous to match a hash by prefix
_HEX = re.compile(r"[0-9a-f]+")


@dataclass
class Baseline:
    commit: str  # the base's `commit` tag value, as recorded
    how: str  # "ancestor": a recorded ancestor of the merge base; "branch": the base branch's newest trace
    merge_base: str | None = None
    distance: int | None = None  # first-parent commits from the merge base back to `commit` (0: itself)
    walked: int = 0  # ancestors looked at
    branch: str | None = None

    @property
    def tag(self) -> str:
        return f"{COMMIT_KEY}={self.commit}"

    def describe(self) -> str:
        if self.how == "ancestor":
            mb = (self.merge_base or "")[:12]
            return (f"base {self.tag}: the merge base {mb}" if self.distance == 0 else
                    f"base {self.tag}: {self.distance} commit(s) before the merge base {mb} (the nearest recorded)")
        looked = f"none of the merge base's {self.walked} first-parent ancestors was recorded; " if self.walked else ""
        return f"base {self.tag}: {looked}the newest trace tagged branch={self.branch}"

    def to_json(self) -> dict:
        return {"commit": self.commit, "how": self.how, "merge_base": self.merge_base, "distance": self.distance,
                "walked": self.walked, "branch": self.branch, "text": self.describe()}


def _git(repo: str, *argv: str) -> str:
    try:
        r = subprocess.run(["git", "-C", repo, *argv], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise UserError("--base-ref needs git on PATH") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"git {argv[0]} took over 60 s in {repo}") from None
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["failed"])[-1]
        raise UserError(f"git {' '.join(argv)} in {repo}: {last}")
    return r.stdout


def git_ancestors(repo: str, ref: str, head: str = "HEAD", walk: int = MAX_WALK) -> tuple[str, list[str]]:
    """(the merge base of `head` and `ref`, the merge base and its first-parent ancestors, newest first)."""
    if not 1 <= walk <= WALK_LIMIT:
        raise UserError(f"--walk: between 1 and {WALK_LIMIT}, not {walk}")
    for r in (ref, head):
        if r.startswith("-"):
            raise UserError(f"not a git revision: {r!r}")
    mb = _git(repo, "merge-base", head, ref).strip()
    return mb, _git(repo, "rev-list", "--first-parent", f"--max-count={walk}", mb).split()


def branch_name(ref: str) -> str:
    """The branch a ref names, as CI tags it: origin/main, refs/remotes/origin/main, refs/heads/main -> main."""
    for prefix in ("refs/heads/", "refs/remotes/"):
        if ref.startswith(prefix):
            ref = ref[len(prefix):]
            if prefix == "refs/remotes/":
                ref = ref.partition("/")[2] or ref
            return ref
    return ref[len("origin/"):] if ref.startswith("origin/") else ref


def _recorded(store) -> list[str]:
    values = {as_dict(s["tags"]).get(COMMIT_KEY) for s in store.list()}
    return sorted(v for v in values if v and len(v) >= MIN_PREFIX and _HEX.fullmatch(v.lower()))


def resolve(store, ancestors: list[str], branch: str | None, merge_base: str | None = None) -> Baseline:
    """The first of `ancestors` (hashes, newest first) whose commit is recorded (a tag value that is a prefix
    of the hash, or the reverse), else the newest trace tagged branch=`branch`; a UserError when neither."""
    ancestors = [a.lower() for a in ancestors[:WALK_LIMIT]]
    recorded = _recorded(store)
    for distance, sha in enumerate(ancestors):
        for v in recorded:
            lv = v.lower()
            if len(sha) >= MIN_PREFIX and (sha.startswith(lv) or lv.startswith(sha)):
                return Baseline(v, "ancestor", merge_base or ancestors[0], distance, len(ancestors))
    if branch:
        for s in store.list(tags=[f"branch={branch}"]):  # newest first
            commit = as_dict(s["tags"]).get(COMMIT_KEY)
            if commit:
                return Baseline(commit, "branch", merge_base, None, len(ancestors), branch)
    where = f"among the {len(ancestors)} first-parent ancestors of the merge base" if ancestors else "(no ancestors)"
    also = f", and no trace is tagged branch={branch} with a commit" if branch else ""
    raise UserError(f"compare: no recorded commit {where}{also}")


def from_git(store, repo: str, ref: str, head: str = "HEAD", branch: str | None = None,
             walk: int = MAX_WALK) -> Baseline:
    """`compare --base-ref REF`: resolve against the repository's history."""
    mb, ancestors = git_ancestors(repo, ref, head, walk)
    return resolve(store, ancestors, branch if branch is not None else branch_name(ref), mb)
