"""What one answer may carry, in bytes: counted before it is written out, refused past a budget.

A shared reference costs its input a few bytes but is written out once per reference: one frames list named
by every entry of a snapshot (a pickle's memo, a stack id in the store) is one stack stored, and a page of
5,000 entries with their frames writes it 5,000 times. So an answer is sized before it is built where it
expands stacks (`charge`, with sizes the columns give without building anything), and once more, whole,
before it is encoded (`json_size`, which walks each shared container once however often it is named).
The budget is per answer (`answer_budget`, a context variable); ALLOCTRACE_MAX_ANSWER_BYTES sets it.
"""
from __future__ import annotations

import os
import re
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from sys import getrefcount

from alloctrace.traces.errors import UserError

ENV = "ALLOCTRACE_MAX_ANSWER_BYTES"
DEFAULT_MAX_ANSWER_BYTES = 256 << 20  # a real answer is under 100 MB (10^6 live tensors of a /state answer: 77 MB)


class AnswerTooLarge(UserError):
    """An answer would carry more bytes than its budget."""

    status = 413


@dataclass
class Budget:
    limit: int
    used: int = 0  # bytes charged so far by what expands stacks


_current: ContextVar[Budget | None] = ContextVar("alloctrace_answer_budget", default=None)


def max_answer_bytes() -> int:
    """The budget: ALLOCTRACE_MAX_ANSWER_BYTES (`512M`, `2G`, bytes) or 256 MiB."""
    raw = os.environ.get(ENV)
    if not raw:
        return DEFAULT_MAX_ANSWER_BYTES
    m = re.fullmatch(r"\s*(\d+)\s*([kmg]?)i?b?\s*", raw.lower())
    if not m:
        raise UserError(f"{ENV}: not an amount: {raw!r} (e.g. 512M, 2G)")
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2)]


@contextmanager
def answer_budget(limit: int | None = None):
    """Within it, what `charge` and `check_json` count belongs to one answer of at most `limit` bytes."""
    token = _current.set(Budget(limit or max_answer_bytes()))
    try:
        yield
    finally:
        _current.reset(token)


def too_large(n: int, limit: int, what: str) -> AnswerTooLarge:
    return AnswerTooLarge(f"the answer would carry more than {limit:,} bytes ({what}: {n:,} so far); ask for less "
                          f"(a smaller page, no frames) or raise {ENV}")


def charge(n: int, what: str) -> None:
    """Count `n` more bytes the current answer will carry; AnswerTooLarge past its budget (none outside one)."""
    b = _current.get()
    if b is None:
        return
    b.used += n
    if b.used > b.limit:
        raise too_large(b.used, b.limit, what)


def check_json(obj) -> None:
    """AnswerTooLarge when `obj` written as JSON would carry more than the current budget (or the default)."""
    b = _current.get()
    limit = b.limit if b is not None else max_answer_bytes()
    n = json_size(obj)
    if n > limit:
        raise too_large(n, limit, "JSON")


def json_size(obj) -> int:
    """About the bytes `obj` takes as compact JSON (characters of strings, 8 per number), without writing it:
    a container named more than once is walked once (its size remembered by identity; only containers whose
    reference count says they may be shared are remembered), so a shared frames list costs one walk. About
    0.6 times the time of encoding it (json.dumps)."""
    memo: dict[int, int] = {}

    def size(o) -> int:
        t = type(o)
        if t is str:
            return len(o) + 2
        if t is int or t is float:
            return 8
        if t is dict:
            shared = getrefcount(o) > 4  # its container, the caller's and this frame's names, the call's argument
            if shared and id(o) in memo:
                return memo[id(o)]
            n = 2 + len(o)
            for key, v in o.items():
                n += (len(key) if type(key) is str else 8) + 3 + size(v)
        elif t is list or t is tuple:
            shared = getrefcount(o) > 4
            if shared and id(o) in memo:
                return memo[id(o)]
            n = 2 + len(o)
            for v in o:
                n += size(v)
        else:
            return 5  # None, true, false
        if shared:
            memo[id(o)] = n
        return n

    return size(obj)
