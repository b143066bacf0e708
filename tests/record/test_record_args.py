"""`alloctrace record`'s usual command line is read without argparse (commands/record.py `args_from`, on
traces/sources/early.py `record_argv`): what it reads must be exactly what argparse reads, and whatever it
leaves (help, a usage error, an option it does not know) must still reach argparse, so that the messages and
exit statuses stay argparse's."""
from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from alloctrace.cli import build_parser, main
from alloctrace.commands import record


def by_argparse(argv: list[str]) -> dict | None:
    """argparse's arguments for `argv` (None where it exits: a usage error, --help)."""
    try:
        args = build_parser(argv).parse_args(argv)
    except SystemExit:
        return None
    return comparable(args)


def comparable(args) -> dict:
    """The arguments as `record.run` sees them: `--` before the program or not (argparse keeps it on some
    Python versions, not on others; `run` drops it either way)."""
    got = dict(vars(args))
    program = got["program"]
    got["program"] = program[1:] if program[:1] == ["--"] else program
    return got


READ_WITHOUT_ARGPARSE = [
    ["record", "--", "prog"],
    ["record", "--", "prog", "-v", "--store", "x", "--", "y"],  # the program's own words
    ["record", "--", "--", "prog"],  # a second -- is the program's
    ["record", "--", "-x"],
    ["record", "--store", "s", "--", "prog"],
    ["record", "--store=s", "--", "prog"],
    ["record", "--store=", "--", "prog"],  # an empty value, given
    ["record", "--store", "", "--", "prog"],
    ["record", "--store", "a", "--store=b", "--", "prog"],  # the last one counts
    ["record", "--name", "ctx 4096", "--name=n2", "--", "prog"],
    ["record", "--name=--odd", "--", "prog"],  # after = a value may start with a dash
    ["record", "--tag", "a=b", "--tag=c=d", "--tag", "a=e", "--", "prog"],
    ["record", "--tag", "not a tag", "--", "prog"],  # read as given: the command refuses it later
    ["record", "--ggml", "--", "prog"],
    ["record", "--ggml", "--ggml", "--store", "s", "--", "prog"],
    ["record", "--store", "s", "--name", "n", "--tag", "k=v", "--ggml", "--", "prog", "arg"],
]

LEFT_TO_ARGPARSE = [
    ["record"],
    ["record", "--"],  # no program: run() says so
    ["record", "prog"],  # no --
    ["record", "--help"],
    ["record", "--help", "--", "prog"],
    ["record", "-h", "--", "prog"],
    ["record", "-v", "--", "prog"],
    ["record", "--verbose", "--", "prog"],
    ["record", "--store", "--", "prog"],  # a missing value
    ["record", "--store"],
    ["record", "--store", "-s", "--", "prog"],  # a value that starts with a dash: argparse decides
    ["record", "--store", "-1", "--", "prog"],
    ["record", "--stor", "s", "--", "prog"],  # an abbreviation
    ["record", "--sto=s", "--", "prog"],
    ["record", "--ggml=yes", "--", "prog"],
    ["record", "--torch", "--", "prog"],
    ["record", "--torch", "--ggml", "--", "prog"],  # not allowed together
    ["record", "-o", "out.rec", "--", "prog"],
    ["record", "--output=out.rec", "--", "prog"],
    ["record", "--stacks", "all", "--", "prog"],
    ["record", "--max-entries", "5", "--", "prog"],
    ["record", "--ggml-include", "/x", "--", "prog"],
    ["record", "extra", "--", "prog"],
    ["record", "--bogus", "--", "prog"],
    ["-v", "record", "--", "prog"],
    ["sweep", "--vary=-c=1", "--", "prog"],
]


@pytest.mark.parametrize("argv", READ_WITHOUT_ARGPARSE)
def test_what_it_reads_is_what_argparse_reads(argv):
    fast = record.args_from(argv)
    assert fast is not None
    assert comparable(fast) == by_argparse(argv)


@pytest.mark.parametrize("argv", LEFT_TO_ARGPARSE)
def test_anything_else_is_left_to_argparse(argv):
    assert record.args_from(argv) is None


def test_random_command_lines_read_the_same_or_are_left_to_argparse():
    """Command lines made of record's options, their values, dashes and misspellings: every one read without
    argparse is read as argparse reads it (so every one argparse refuses is left to argparse)."""
    words = ["--store", "--store=s", "s", "", "--name", "--name=n", "n", "--tag", "--tag=a=b", "a=b", "--ggml",
             "--torch", "-o", "out", "-", "-1", "-x", "--sto", "--stor=s", "-v", "--", "prog", "--", "-y"]
    rng = random.Random(40)
    read = 0
    for _ in range(3000):
        argv = ["record", *rng.choices(words, k=rng.randint(0, 7))]
        fast = record.args_from(argv)
        if fast is not None:
            read += 1
            assert comparable(fast) == by_argparse(argv), argv
    assert read > 100  # the table reached the lines it reads


@pytest.mark.parametrize("argv, message", [
    (["record", "--store", "--", "prog"], "record: error: argument --store: expected one argument"),
    (["record", "--torch", "--ggml", "--", "prog"], "record: error: argument --ggml: not allowed with argument --torch"),
    (["record", "--bogus", "--", "prog"], "alloctrace: error: unrecognized arguments: --bogus"),
    (["record", "--help", "--", "prog"], "PROGRAM [ARGS...]"),
])
def test_usage_errors_and_help_are_argparses(argv, message, capsys):
    with pytest.raises(SystemExit) as by_parser:
        build_parser(argv).parse_args(argv)
    expected = capsys.readouterr()
    with pytest.raises(SystemExit) as by_main:
        main(argv)
    assert by_main.value.code == by_parser.value.code
    assert capsys.readouterr() == expected
    assert message in expected.err + expected.out


def test_a_record_without_argparse_runs_as_with_it(tmp_path):
    """The same command line, once read without argparse and once by it (ALLOCTRACE_PRESTART=0 keeps the
    program started late in both): same exit status, same error line."""
    code = ("import sys; from alloctrace.cli import main; from alloctrace.commands import record; "
            "record.args_from = (lambda argv: None) if sys.argv[1] == 'argparse' else record.args_from; "
            "rc = main(sys.argv[2:]); print('argparse' in sys.modules); sys.exit(rc)")
    env_line = ["record", "--store", str(tmp_path / "s"), "--", sys.executable, "-c", "raise SystemExit(3)"]
    env = {**os.environ, "ALLOCTRACE_PRESTART": "0"}
    runs = {how: subprocess.run([sys.executable, "-c", code, how, *env_line], capture_output=True, text=True,
                                env=env, timeout=120) for how in ("argparse", "fast")}
    assert runs["argparse"].stdout.split() == ["True"] and runs["fast"].stdout.split() == ["False"]
    assert runs["argparse"].returncode == runs["fast"].returncode == 3
    assert runs["argparse"].stderr == runs["fast"].stderr
    assert "error" in runs["fast"].stderr
