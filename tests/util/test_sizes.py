"""One reading of a size for every face: whatif --cap, check --max-memory and fit --budget agree."""
from __future__ import annotations

import argparse

import pytest

from alloctrace.commands.check import _size_arg
from alloctrace.traces.errors import UserError
from alloctrace.traces.preflight.budget import parse_budget
from alloctrace.traces.util.sizes import fmt_bytes, parse_size
from alloctrace.traces.whatif.torch_request import apply_overrides
from alloctrace.allocator.cuda_caching import AllocatorSettings


@pytest.mark.parametrize("text, n", [
    ("6G", 6 << 30), ("6GiB", 6 << 30), ("6 gib", 6 << 30), ("6GB", 6 * 10 ** 9), ("512M", 512 << 20),
    ("512MB", 512 * 10 ** 6), ("1.5GiB", 3 << 29), ("4096", 4096), ("4096B", 4096), ("2T", 2 << 40),
    ("1_000", 1000), ("8k", 8192), ("8KB", 8000)])
def test_every_face_reads_a_size_the_same(text, n):
    assert parse_size(text) == n
    assert _size_arg(text) == n  # check --max-memory
    assert parse_budget(text) == n  # fit --budget
    assert apply_overrides(AllocatorSettings(), {}, cap=text).memory_limit == n  # whatif --cap


@pytest.mark.parametrize("text", ["", "G", "six gigs", "0", "-1G", "1e3", "nan", "inf", "2000P", "3 parsecs",
                                  str(1 << 61)])
def test_what_is_not_a_size_is_refused_by_every_face(text):
    with pytest.raises(ValueError):
        parse_size(text)
    with pytest.raises(argparse.ArgumentTypeError):
        _size_arg(text)
    with pytest.raises(UserError):
        parse_budget(text)


def test_a_parsed_size_prints_back_as_written():
    for text in ("6GiB", "512MiB", "3KiB"):
        assert fmt_bytes(parse_size(text)).replace(".00 ", "") == text
