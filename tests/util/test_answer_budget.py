"""An answer's size is counted before it is written: shared references count once per reference, walked once."""
from __future__ import annotations

import json

import pytest

from alloctrace.traces.util.answer_budget import AnswerTooLarge, answer_budget, charge, check_json, json_size


def compact(obj) -> int:
    return len(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))


def test_json_size_is_close_to_the_encoded_size_of_a_real_shaped_answer():
    answer = {"total": 3, "entries": [{"i": i, "action": "alloc", "addr": 4096 * i, "size": 512, "site": "f.py:1",
                                       "frames": [{"name": "f", "filename": "a.py", "line": 7}]} for i in range(3)]}
    assert 0.8 < json_size(answer) / compact(answer) < 1.5, (json_size(answer), compact(answer))


def test_a_shared_container_counts_once_per_reference():
    frames = [{"name": "f", "filename": "x" * 2000, "line": k} for k in range(1000)]
    one = json_size({"frames": frames})
    many = json_size({"entries": [{"frames": frames} for _ in range(5000)]})
    assert many > 5000 * (one - 20), (one, many)  # 10 GB written out; the walk visits the frames once
    assert many > 10_000_000_000


def test_past_the_budget_is_one_line_naming_it():
    with answer_budget(1 << 20):
        check_json({"x": "y" * 1000})
        with pytest.raises(AnswerTooLarge) as e:
            check_json({"x": ["y" * 1000] * 2000})
    assert "more than 1,048,576 bytes" in str(e.value) and "ALLOCTRACE_MAX_ANSWER_BYTES" in str(e.value)
    with answer_budget(1000):
        charge(600, "stack frames")
        with pytest.raises(AnswerTooLarge, match="stack frames"):
            charge(600, "stack frames")
    charge(1 << 40, "outside an answer")  # no budget open: the CLI's own commands are not answers
