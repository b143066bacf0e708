"""Every subcommand's --help: a description, and an Examples section whose commands the parser accepts."""
from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from alloctrace.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def example_commands(help_text: str) -> list[str]:
    section = re.split(r"\n[Ee]xamples:\n", help_text, maxsplit=1)[1]
    return [line.strip() for line in section.splitlines() if line.strip().startswith("alloctrace ")]


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_help_has_a_description_and_examples_the_parser_accepts(name, capsys):
    sub = subcommands()[name]
    assert sub.description and len(sub.description) > 20, f"`{name} --help` has no description"
    text = sub.format_help()
    assert re.search(r"\n[Ee]xamples:\n", text), f"`{name} --help` has no Examples section"
    commands = example_commands(text)
    assert any(c.split()[1] == name for c in commands), f"`{name} --help`: Examples shows no `alloctrace {name}`"
    for command in commands:
        words = shlex.split(command)
        argv = words[1:next((i for i, w in enumerate(words) if w in (">", "|", "<")), len(words))]  # the shell's part
        try:
            build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"`{command}` from `{name} --help` does not parse: {capsys.readouterr().err}")


def test_examples_are_kept_line_by_line_in_a_narrow_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    text = subcommands()["diff"].format_help()
    section = text.split("\nExamples:\n", 1)[1]
    assert "  alloctrace diff 59b3150c:0 59b3150c:1 --store ./store\n" in section  # not re-wrapped
    assert max(len(line) for line in text.split("\nExamples:\n", 1)[0].splitlines()) <= 60  # the rest is


def test_paths_named_in_help_exist_in_the_repository():
    for name, sub in subcommands().items():
        text = re.sub(r"-\n\s+", "-", sub.format_help())  # argparse breaks a long path after a dash
        for path in re.findall(r"(?<![\w/])(?:tests|server|docs|fixtures)/[\w./*-]+\.(?:json|log|gz)\b", text):
            assert any(ROOT.glob(path)), f"`{name} --help` names {path}, which does not exist"


def test_a_command_imports_only_its_own_module():
    """`alloctrace sweep ...` builds a parser of sweep alone: serve's web stack and the other commands' imports
    stay out of a short command's start (the parser of every command would import them all)."""
    import subprocess
    import sys

    probe = ("import sys\nfrom alloctrace.cli import main\ntry:\n    main(['sweep', '--help'])\nexcept SystemExit:\n"
             "    pass\nprint(sorted(m for m in sys.modules if m.startswith('alloctrace.commands.')))\n"
             "print('numpy' in sys.modules, 'uvicorn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    mods, heavy = out.strip().splitlines()[-2:]
    assert mods == "['alloctrace.commands._common', 'alloctrace.commands.sweep']", mods
    assert heavy == "False False", heavy
    # the whole parser still knows every command
    assert set(subcommands()) >= {"sweep", "serve", "import", "list", "record"}
