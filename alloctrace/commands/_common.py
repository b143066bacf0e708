"""Helpers shared by the store commands: the --store option and readable tables."""
from __future__ import annotations

import re

from alloctrace.traces.util.textsafe import safe


def examples(*lines: str) -> str:
    """A --help epilog: "Examples:" and one command per line ("COMMAND   # what it does" puts the comment
    on the line above), kept as written by the CLI's formatter (cli.py) while descriptions are re-wrapped."""
    out = ["Examples:"]
    for line in lines:
        command, _, comment = line.partition("   # ")
        out += ([f"  # {comment}"] if comment else []) + [f"  {command}"]
    return "\n".join(out)


def add_store_arg(parser):
    parser.add_argument("--store", metavar="DIR|URL", default=None,
                        help="trace store directory, or a PostgreSQL URL postgresql://user@host:port/db "
                             "(default: $ALLOCTRACE_STORE, else the per-user data directory)")


def add_tag_arg(parser):
    parser.add_argument("--tag", metavar="KEY=VALUE", action="append", default=[], dest="tags",
                        help="tag the stored traces (repeatable), e.g. --tag commit=abc123 --tag config=fa-on")


def tags_from(args) -> list[str]:
    from alloctrace.traces.store.tags import parse_tags

    return parse_tags(getattr(args, "tags", None))


def open_store_from(args, create: bool = False):
    """The store --store names. Only commands that add traces (import, record, sweep, fit) pass `create`: a
    mistyped path given to a command that reads must not quietly answer from a new, empty store."""
    from alloctrace.traces.errors import UserError
    from alloctrace.traces.store.store import open_store, store_dir, store_url

    path = getattr(args, "store", None)
    d = store_dir(path)
    if not create and store_url(path) is None and not d.exists():
        raise UserError(f"no store at {d} (check --store or $ALLOCTRACE_STORE; "
                        "`alloctrace import LOG` makes one)")
    return open_store(path)


def _size(v) -> str:
    return "-" if v is None else f"{v:,}"


def _oom(o) -> str:
    if not o:
        return "-"
    if "needed" not in o:  # a PyTorch snapshot's OOM
        return f"requested {o.get('requested', 0):,} with {o.get('reserved', 0):,} reserved"
    return f"{o.get('tensor') or '?'} needed {o['needed']:,} > {o['largest_available']:,}"


def _yes_no(v, complete: bool = True) -> str:
    if not complete:
        return "INCOMPLETE"  # the log ends inside the walk: never shown as a consistent whole
    return "-" if v is None else ("yes" if v else "NO")


def terminal_width() -> int | None:
    """The width a table must fit: $COLUMNS, else the terminal's; None when printing into a pipe or file
    (a script reads whole cells)."""
    import os
    import shutil
    import sys

    if os.environ.get("COLUMNS", "").isdigit():
        return max(20, int(os.environ["COLUMNS"]))
    try:
        return shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    except (OSError, ValueError):
        return None


def cut_middle(text: str, width: int) -> str:
    """`text` in `width` characters, its middle replaced by an ellipsis (a name's start and end both tell)."""
    if len(text) <= width:
        return text
    if width < 3:
        return text[:width]
    head = width // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def fit_columns(rows: list[list[str]], width: int | None, floor: int = 6) -> list[list[str]]:
    """Narrow the widest columns (never below `floor` or their heading) until the table fits `width`, cutting
    the middle of the cells that no longer fit."""
    if width is None or not rows:
        return rows
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    numeric = [all(re.fullmatch(r"[-+]?[0-9][0-9,.]*|-", r[i]) for r in rows[1:]) for i in range(len(widths))]
    # numbers are never cut (their heading may be); text columns keep `floor` characters
    data = [max([len(r[i]) for r in rows[1:]] or [0]) for i in range(len(widths))]
    least = [max(data[i], 3) if numeric[i] else min(floor, widths[i]) for i in range(len(widths))]
    while sum(widths) + 2 * (len(widths) - 1) > width:
        shrinkable = [i for i, w in enumerate(widths) if w > least[i]]
        if not shrinkable:
            break
        widths[max(shrinkable, key=lambda i: widths[i])] -= 1
    return [[cut_middle(c, w) for c, w in zip(r, widths)] for r in rows]


def table_lines(rows: list[list[str]]) -> list[str]:
    """A text table, one string per row (for reports printed line by line through `safe_lines`), no wider
    than the terminal."""
    from alloctrace.traces.explain.peak import text_table

    # names are data: no escape sequences, no forged rows
    return text_table(fit_columns([[safe(str(c)) for c in r] for r in rows], terminal_width()))


def table(rows: list[list[str]]) -> str:
    return "\n".join(table_lines(rows))


def traces_table(summaries: list[dict]) -> str:
    """One row per trace."""
    if not summaries:
        return "no traces"
    tagged = any("=" in str(t) for s in summaries for t in s.get("tags") or ())
    rows = [["ID", "NAME", "GENERATION", "GRAPHS", "MAX BUFFER", "OOM", "CONSISTENT", "CREATED"]
            + (["TAGS"] if tagged else [])]
    for s in summaries:
        gs = s["graphs"]
        roles = {}
        for g in gs:
            roles[g["role"]] = roles.get(g["role"], 0) + 1
        bufs = [g["buffer_size"] or g["max_size"] for g in gs if (g["buffer_size"] or g["max_size"]) is not None]
        consistent = [g["consistent"] for g in gs if g["consistent"] is not None]
        rows.append([s["id"], s["name"], s["generation"], ", ".join(f"{n} {r}" for r, n in roles.items()) or "0",
                     _size(max(bufs) if bufs else None), "yes" if any(g["oom"] for g in gs) else "-",
                     _yes_no(all(consistent) if consistent else None, all(g.get("complete", True) for g in gs)),
                     s["created"]] + ([" ".join(t for t in s.get("tags") or () if "=" in str(t))] if tagged else []))
    return table(rows)


def graphs_table(summary: dict) -> str:
    """A trace's header and one row per graph."""
    head = (f"trace {summary['id']}  {safe(summary['name'])}\n"
            + safe(f"  source {summary['source']}, generation {summary['generation']}, created {summary['created']}"
                   + (f", tags {', '.join(map(str, summary['tags']))}" if summary.get("tags") else "")))
    rows = [["GRAPH", "ROLE", "EVENTS", "MAX_SIZE", "BUFFER", "OOM", "CONSISTENT"]]
    for g in summary["graphs"]:
        rows.append([str(g["index"]), g["role"], _size(g["n_events"]), _size(g["max_size"]),
                     _size(g["buffer_size"]), _oom(g["oom"]), _yes_no(g["consistent"], g.get("complete", True))])
    return head + "\n" + table(rows)
