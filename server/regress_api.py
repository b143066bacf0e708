"""The API behind the history page and `compare`: buffers per commit, and two commits compared."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from alloctrace.server.api import ctx
from alloctrace.traces.errors import UserError
from alloctrace.server.graphs import BudgetJSONResponse as JSONResponse

router = APIRouter(prefix="/api")
Tag = Annotated[list[str], Query(max_length=300, description="key=value; repeat: all must match")]


def _few(tags: list[str]) -> list[str]:
    if len(tags) > 16:
        raise UserError("at most 16 tags per side")
    return tags


@router.get("/compare", summary="Buffers of two commits' traces, paired by their other tags")
def get_compare(request: Request, head: Tag, base: Tag = [],
                threshold: Annotated[str, Query(max_length=40, description="bytes (1MiB) or percent (1%)")] = "0",
                tag: Tag = [],
                format: Annotated[str, Query(pattern="^(json|markdown)$")] = "json",
                ancestor: Annotated[list[str], Query(max_length=64, description="instead of base: the merge "
                                                     "base and its first-parent ancestors, newest first (hashes, "
                                                     "repeat, at most 200); the first recorded one is the base")] = [],
                base_branch: Annotated[str, Query(max_length=200, description="with ancestor: the branch tag to "
                                                  "fall back on")] = "",
                allow_unpaired: bool = False):
    """`alloctrace compare --json` (or `--markdown`); headers X-Alloctrace-Grew: true|false and
    X-Alloctrace-Status: the CLI's exit status (0, 1 grew, 3 unpaired); `tag` narrows both sides (e.g.
    model=llama). With `ancestor` (what `git rev-list --first-parent` of the merge base lists) the base is
    resolved as `compare --base-ref` does, and X-Alloctrace-Base names the commit taken."""
    from alloctrace.traces.regress.compare import compare
    extra = _few(tag)
    if bool(base) == bool(ancestor):
        raise UserError("give base (key=value) or ancestor (commit hashes), one of them")
    if len(ancestor) > 200:
        raise UserError("at most 200 ancestors")

    def run(store):
        baseline = None
        if ancestor:
            from alloctrace.traces.regress.baseline import resolve
            baseline = resolve(store, ancestor, base_branch or None)
        result = compare(store, ([baseline.tag] if baseline else _few(base)) + extra, _few(head) + extra, threshold)
        result.baseline = baseline.to_json() if baseline else None
        return result

    result = ctx(request).call(run)
    headers = {"X-Alloctrace-Grew": "true" if result.failed else "false",
               "X-Alloctrace-Status": str(result.status(allow_unpaired))}
    if result.baseline:
        headers["X-Alloctrace-Base"] = result.baseline["commit"]
    if format == "markdown":
        from alloctrace.traces.regress.compare_report import markdown
        return Response(markdown(result), media_type="text/markdown; charset=utf-8", headers=headers)
    return JSONResponse(result.to_json(), headers=headers)


@router.get("/history", summary="Buffer size per commit, one line per config and buffer (paged over commits)")
def get_history(request: Request, tag: Tag = [],
                key: Annotated[str, Query(max_length=64, description="the tag key of the x axis")] = "commit",
                offset: Annotated[int, Query(ge=0)] = 0, limit: Annotated[int, Query(ge=1, le=500)] = 50):
    from alloctrace.traces.regress.history import history
    return JSONResponse(ctx(request).call(lambda s: history(s, _few(tag), key, offset, limit)))


@router.get("/tags", summary="Every key=value tag in the store, with how many traces carry it")
def get_tags(request: Request):
    from alloctrace.traces.store.tags import as_dict
    counts: dict[str, dict[str, int]] = {}
    for tags in ctx(request).call(lambda st: st.all_tags()):
        for k, v in as_dict(tags).items():
            counts.setdefault(k, {})
            counts[k][v] = counts[k].get(v, 0) + 1
    return {"tags": {k: dict(sorted(v.items())) for k, v in sorted(counts.items())}}
