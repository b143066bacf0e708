"""Helpers shared by the store commands: the --store option and readable tables."""
from __future__ import annotations

from alloctrace.traces.errors import UserError
from alloctrace.traces.util.textsafe import safe, text_table


def examples(*lines: str) -> str:
    """A --help epilog: "Examples:" and one command per line ("COMMAND   # what it does" puts the comment
    on the line above), kept as written by the CLI's formatter (parser.py) while descriptions are re-wrapped."""
    out = ["Examples:"]
    for line in lines:
        command, _, comment = line.partition("   # ")
        out += ([f"  # {comment}"] if comment else []) + [f"  {command}"]
    return "\n".join(out)


def add_store_arg(parser):
    parser.add_argument("--store", metavar="DIR|URL", default=None,
                        help="trace store directory, or a PostgreSQL URL postgresql://user@host:port/db "
                             "(default: $ALLOCTRACE_STORE, else the per-user data directory)")


def add_retry_hung_arg(p) -> None:
    p.add_argument("--retry-hung", type=int, default=None, metavar="N",
                   help="run again, up to N times, a program killed at --timeout while it hung: every thread "
                        "asleep, no CPU used (a deadlock, not slow work); default 1, 0: never")


def retry_hung_of(args) -> int:
    """--retry-hung as run_points takes it: the default when not given, refused outside 0..MAX_RETRY_HUNG."""
    from alloctrace.traces.preflight.programs import DEFAULT_RETRY_HUNG, MAX_RETRY_HUNG

    if args.retry_hung is None:
        return DEFAULT_RETRY_HUNG
    if not 0 <= args.retry_hung <= MAX_RETRY_HUNG:
        raise UserError(f"--retry-hung wants 0 to {MAX_RETRY_HUNG} runs again (0: never), got {args.retry_hung}")
    return args.retry_hung


def retried_line(what: str, retried: str | None) -> list[str]:
    """A point or run whose program hung and was run again (--retry-hung), as one line."""
    return [f"  {what}: run again (--retry-hung): {retried}"] if retried else []


def add_tag_arg(parser):
    parser.add_argument("--tag", metavar="KEY=VALUE", action="append", default=[], dest="tags",
                        help="tag the stored traces (repeatable), e.g. --tag commit=abc123 --tag config=fa-on")


def tags_from(args) -> list[str]:
    tags = getattr(args, "tags", None)
    if not tags:
        return []  # without importing the checks (and their regular expression)
    from alloctrace.traces.store.tags import parse_tags

    return parse_tags(tags)


def open_store_from(args, create: bool = False):
    """The store `--store` names; only the commands that add traces (`create=True`) may make a new one."""
    from alloctrace.traces.store.store import open_store

    return open_store(getattr(args, "store", None), create=create)


def exact_count(v) -> str:
    """A count or a byte size as its exact digits with thousands separators ("-" for none): for tables where
    the last byte matters (fmt_bytes rounds)."""
    return "-" if v is None else f"{v:,}"


def hparams(items) -> dict:
    """--hparam KEY=VALUE ... as a dict (check and replay): a blank key or a missing "=" is a UserError."""
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--hparam wants KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def _oom(o) -> str:
    if not o:
        return "-"
    if "needed" not in o:  # a PyTorch snapshot's OOM
        return f"requested {o.get('requested', 0):,} with {o.get('reserved', 0):,} reserved"
    return f"{o.get('tensor') or '?'} needed {o['needed']:,} > {o['largest_available']:,}"


def _yes_no(v, complete: bool = True, unsure: int = 0) -> str:
    if not complete:
        return "INCOMPLETE"  # the log ends inside the walk: never shown as a consistent whole
    if v and unsure:  # consistent, but the log cannot pin a size to the byte
        return f"yes, exact up to {unsure:,} B"
    return "-" if v is None else ("yes" if v else "NO")


def table_lines(rows: list[list[str]]) -> list[str]:
    """A text table, one string per row (for reports printed line by line through `safe_lines`), as wide as
    the terminal at most (traces/util/fit_width.py; a pipe gets every character)."""
    from alloctrace.traces.util.textsafe import text_table
    from alloctrace.traces.util.fit_width import fit_rows, terminal_width

    # names are data: no escape sequences, no forged rows
    return text_table(fit_rows([[safe(c) for c in r] for r in rows], terminal_width()))


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
                     exact_count(max(bufs) if bufs else None), "yes" if any(g["oom"] for g in gs) else "-",
                     _yes_no(all(consistent) if consistent else None, all(g.get("complete", True) for g in gs),
                             max((g.get("uncertainty_bytes") or 0 for g in gs), default=0)),
                     s["created"]] + ([" ".join(t for t in s.get("tags") or () if "=" in str(t))] if tagged else []))
    return table(rows)


def graphs_table(summary: dict) -> str:
    """A trace's header and one row per graph."""
    head = (f"trace {summary['id']}  {safe(summary['name'])}\n"
            + safe(f"  source {summary['source']}, generation {summary['generation']}, created {summary['created']}"
                   + (f", tags {', '.join(map(str, summary['tags']))}" if summary.get("tags") else "")))
    rows = [["GRAPH", "ROLE", "EVENTS", "MAX_SIZE", "BUFFER", "OOM", "CONSISTENT"]]
    for g in summary["graphs"]:
        rows.append([str(g["index"]), g["role"], exact_count(g["n_events"]), exact_count(g["max_size"]),
                     exact_count(g["buffer_size"]), _oom(g["oom"]),
                     _yes_no(g["consistent"], g.get("complete", True), g.get("uncertainty_bytes") or 0)])
    return head + "\n" + table(rows)
