"""The CI recipe, shipped inside the package so a workflow needs no file of this repository: `python -m
alloctrace.ci` prints the path of memory-check.sh (github-actions.yml is the workflow that runs it)."""
from pathlib import Path

SCRIPT = Path(__file__).resolve().with_name("memory-check.sh")
WORKFLOW = SCRIPT.with_name("github-actions.yml")
