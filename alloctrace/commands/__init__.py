"""CLI subcommands, one module each (see alloctrace/cli.py)."""
