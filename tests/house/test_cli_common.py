"""Helpers the commands share live once in alloctrace/commands/_common.py, so they cannot drift apart again."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from alloctrace.commands import _common, check, diff, replay, sweep
from alloctrace.traces.errors import UserError

COMMANDS = Path(_common.__file__).parent


def test_check_and_replay_read_hparams_with_one_function():
    assert check.hparams is replay.hparams is _common.hparams
    assert _common.hparams(["n_layer=3", " n_head = 8 "]) == {"n_layer": "3", "n_head": "8"}
    for bad in ("n_layer", " =3", "=3"):
        with pytest.raises(UserError, match="KEY=VALUE"):
            _common.hparams([bad])


def test_exact_counts_are_written_by_one_function():
    assert diff.exact_count is sweep.exact_count is _common.exact_count
    assert _common.exact_count(1234567) == "1,234,567" and _common.exact_count(None) == "-"


def test_no_command_module_repeats_a_function_body_of_another():
    """A private helper copied into two command modules is the drift this layout exists to prevent."""
    seen: dict[str, str] = {}
    for path in sorted(COMMANDS.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name not in ("add_arguments", "run", "register"):
                body = ast.dump(ast.Module(body=node.body, type_ignores=[]))
                key = body
                assert key not in seen, f"{node.name} in {path.name} repeats {seen.get(key)}"
                seen[key] = f"{node.name} in {path.name}"
