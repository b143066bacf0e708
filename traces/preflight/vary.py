"""`--vary FLAG=V1,V2,...`: which flags a sweep varies, and each point's arguments.

A flag's values replace the value after that flag in the program's arguments (every occurrence, also the
`FLAG=VALUE` spelling), or are appended when the arguments lack the flag. Points are the combinations of
all varied flags, the first `--vary` outermost.
"""
from __future__ import annotations

import re
from itertools import product

from alloctrace.traces.errors import UserError

MAX_POINTS = 256
MAX_VALUES = 64
MAX_VALUE_LEN = 200


class Vary:
    """One varied flag and its values. A plain class, not a dataclass: a sweep's first programs start before
    the command imports dataclasses (prestart.py)."""

    __slots__ = ("flag", "values")

    def __init__(self, flag: str, values: tuple[str, ...]):
        self.flag = flag  # as the program spells it: "-c", "--ctx-size", "-fa"
        self.values = tuple(values)

    def __eq__(self, other) -> bool:
        return isinstance(other, Vary) and (self.flag, self.values) == (other.flag, other.values)

    def __hash__(self) -> int:
        return hash((self.flag, self.values))

    def __repr__(self) -> str:
        return f"Vary(flag={self.flag!r}, values={self.values!r})"

    @property
    def numeric(self) -> bool:
        return all(_is_int(v) for v in self.values)


def _is_int(v: str) -> bool:
    return v.isdecimal() and len(v) < 19


def _split(text: str, what: str) -> tuple[str, str]:
    flag, sep, rest = text.partition("=")
    if not sep or not flag or not rest:
        raise UserError(f"{what} wants FLAG=VALUES (e.g. --vary=-c=512,4096), got {text!r}")
    if not flag.startswith("-") or any(c.isspace() for c in flag):
        raise UserError(f"{what}: {flag!r} is not a flag of the program (it starts with '-', e.g. -c)")
    return flag, rest


def parse_vary(text: str) -> Vary:
    """"-c=512,4096" -> Vary("-c", ("512", "4096"))."""
    flag, rest = _split(text, "--vary")
    values = tuple(v.strip() for v in rest.split(","))
    if any(not v or len(v) > MAX_VALUE_LEN or "\0" in v for v in values):
        raise UserError(f"--vary {flag}: empty or overlong value in {rest!r}")
    if len(values) > MAX_VALUES:
        raise UserError(f"--vary {flag}: at most {MAX_VALUES} values, got {len(values)}")
    if len(set(values)) != len(values):
        raise UserError(f"--vary {flag}: a value is given twice in {rest!r}")
    return Vary(flag, values)


def parse_range(text: str) -> tuple[str, int, int]:
    """`fit`'s "-c=512..131072" -> ("-c", 512, 131072)."""
    flag, rest = _split(text, "--vary")
    lo, sep, hi = rest.partition("..")
    if not sep or not _is_int(lo.strip()) or not _is_int(hi.strip()):
        raise UserError(f"fit --vary wants FLAG=LOW..HIGH with whole numbers (e.g. -c=512..131072), got {text!r}")
    lo_v, hi_v = int(lo), int(hi)
    if not 0 < lo_v < hi_v:
        raise UserError(f"fit --vary {flag}: wants 0 < LOW < HIGH, got {lo_v}..{hi_v}")
    return flag, lo_v, hi_v


def check_distinct(varies: list[Vary]):
    seen = set()
    for v in varies:
        if v.flag in seen:
            raise UserError(f"--vary {v.flag} is given twice: put all its values in one --vary")
        seen.add(v.flag)


def points(varies: list[Vary], max_points: int = MAX_POINTS) -> list[dict[str, str]]:
    """Every combination, as {flag: value}, the first flag outermost."""
    check_distinct(varies)
    n = 1
    for v in varies:
        n *= len(v.values)
    if n > max_points:
        raise UserError(f"a sweep is limited to {max_points} points, this one has {n}")
    return [dict(zip((v.flag for v in varies), combo)) for combo in product(*(v.values for v in varies))]


def with_values(argv: list[str], values: dict[str, str]) -> list[str]:
    """The program's arguments with each flag set to its value: replaced where present, else appended."""
    out = list(argv)
    for flag, value in values.items():
        found = False
        i = 1
        while i < len(out):
            word = out[i]
            if word == flag and i + 1 < len(out):
                out[i + 1] = value
                found = True
                i += 2
                continue
            if word.startswith(flag + "="):
                out[i] = f"{flag}={value}"
                found = True
            i += 1
        if not found:
            out += [flag, value]
    return out


def tag_key(flag: str) -> str:
    """The tag key of a flag: "-c" -> "c", "--ctx-size" -> "ctx-size" (a tag key is an identifier)."""
    key = re.sub(r"[^A-Za-z0-9_.-]", "_", flag.lstrip("-"))[:63]
    return key if key[:1].isalpha() or key[:1] == "_" else f"flag_{key}"[:63]


def tags(values: dict[str, str]) -> list[str]:
    """A point's tags, one key=value per varied flag: {"-c": "512", "-fa": "on"} -> ["c=512", "fa=on"]."""
    return [f"{tag_key(f)}={v}" for f, v in values.items()]


def label(values: dict[str, str]) -> str:
    """"-c=512 -fa=on": a point as trace names spell it."""
    return " ".join(f"{k}={v}" for k, v in values.items())
