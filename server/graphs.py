"""The API's limits on what one answer may carry: rows per page, shapes, points, and bytes.

Every JSON answer goes through `BudgetJSONResponse`, the one place its byte budget is enforced
(traces/util/answer_budget.py: ALLOCTRACE_MAX_ANSWER_BYTES, 256 MiB): an answer that would carry more is a
413 with one line saying the limit. `AnswerBudget` opens the budget per request, so what expands stacks while
the answer is built is charged against it before it is built."""
from __future__ import annotations

from fastapi.responses import JSONResponse

from alloctrace.traces.util.answer_budget import answer_budget, check_json

MAX_PAGE = 5000
MAX_SHAPES = 20000
MAX_POINTS = 10000


class BudgetJSONResponse(JSONResponse):
    """A JSON answer sized before it is encoded: AnswerTooLarge (413) past the budget."""

    def render(self, content) -> bytes:
        check_json(content)
        return super().render(content)


class AnswerBudget:
    """ASGI middleware: each request's answer gets its own byte budget (a context variable the handler's
    thread inherits)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        with answer_budget():
            return await self.app(scope, receive, send)
