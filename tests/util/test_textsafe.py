"""traces/util/textsafe.py `safe`: printable ASCII is returned without the control-character expression (not
compiled until some text needs it); every text gets exactly what the expression makes of it."""
from __future__ import annotations

import random
import subprocess
import sys

from alloctrace.traces.util import textsafe


def by_the_expression(s: str) -> str:
    return textsafe.control_re().sub(textsafe._escape, s)


def test_every_text_is_escaped_as_the_expression_escapes_it():
    alphabet = ([chr(c) for c in range(0x00, 0xa1)] + ["\u2028", "\u2029", "\u200e", "\u200f", "\u202a", "\u202e",
                "\u2066", "\u2069", "\u2065", "\u206a", "\u202f", "é", "名", "\U0001f600", "\ufeff"])
    rng = random.Random(40)
    texts = ["", "plain name", "ctx 4096", "a\x1b]0;title\x07b", "row\nforged", "tab\there", "\x7f", "\x9f"]
    texts += ["".join(rng.choices(alphabet, k=rng.randint(1, 12))) for _ in range(5000)]
    for s in texts:
        assert textsafe.safe(s) == by_the_expression(s), repr(s)
    assert textsafe.safe(12) == "12" and textsafe.safe("a\nb") == "a\\nb"


def test_printable_ascii_needs_no_expression():
    code = ("from alloctrace.traces.util import textsafe as t; print(t.safe('trace 1  llama-fit-params ~!'), "
            "len(t._compiled), t.safe('x\\ty'), len(t._compiled))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.stdout.split() == ["trace", "1", "llama-fit-params", "~!", "0", "x\\ty", "1"]
