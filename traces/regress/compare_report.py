"""What `alloctrace compare` prints: a text report, or a markdown table fit for a pull-request comment."""
from __future__ import annotations

from alloctrace.traces.explain.peak import attribution_lines, text_table
from alloctrace.traces.util.sizes import fmt_bytes

from alloctrace.traces.regress.compare import BufferChange, Comparison


def _signed(n: int | None) -> str:
    return "-" if n is None else ("+" if n > 0 else "") + fmt_bytes(n)


def _percent(c: BufferChange) -> str:
    return "" if not c.base or c.delta is None else f" ({c.delta * 100 / c.base:+.1f}%)"


def _cause(c: BufferChange) -> str:
    cause = c.cause()
    return "" if cause is None or not (c.delta or 0) > 0 else f"{cause['family']} {_signed(cause['delta'])}"


def _key(tags: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in tags.items()) or "(no other tags)"


def text_lines(cmp: Comparison) -> list[str]:
    lines = [f"compare {' '.join(cmp.base)} -> {' '.join(cmp.head)} (a buffer may grow {cmp.threshold})"]
    if cmp.baseline:
        lines.append(cmp.baseline["text"])
    for p in cmp.pairs:
        lines.append(f"{_key(p.key)}: base {p.base_id}, head {p.head_id}" + ("  GREW" if p.grew else ""))
        rows = [["buffer", "base", "head", "delta", "cause"]]
        rows += [[c.buffer, fmt_bytes(c.base), fmt_bytes(c.head), _signed(c.delta) + _percent(c), _cause(c)]
                 for c in p.buffers]
        lines += ["  " + line for line in text_table(rows)]
        for c in p.buffers:
            if c.attribution:
                lines.append(f"  {c.buffer}: graph {p.base_id}:{c.base_graph} -> {p.head_id}:{c.head_graph}, "
                             "high-water mark by family")
                lines += ["  " + line for line in attribution_lines(c.attribution, top=8)]
    for label, rows in (("only in base", cmp.only_base), ("only in head", cmp.only_head)):
        for s in rows:
            lines.append(f"{label}: {s['id']} {s['name']} ({_tags(s)})")
    grew = sum(p.grew for p in cmp.pairs)
    lines.append(f"{grew} of {len(cmp.pairs)} pair(s) grew past the threshold" if grew else
                 f"no buffer grew past the threshold in {len(cmp.pairs)} pair(s)")
    if cmp.unpaired:
        lines.append(_unpaired_sentence(cmp))
    return lines


def _unpaired_sentence(cmp: Comparison) -> str:
    if not cmp.pairs:
        return "UNPAIRED: no trace of one side pairs with a trace of the other (tags differ?)"
    return (f"UNPAIRED: {len(cmp.only_base)} base and {len(cmp.only_head)} head trace(s) pair with nothing "
            "(a renamed tag, or a config recorded on one side only)")


def _tags(s: dict) -> str:
    return " ".join(t for t in s["tags"] if "=" in t) or "no tags"


def _md(text) -> str:
    """A cell's text: no table breaks, no markup."""
    out = str(text)
    for ch in "\\|`*_<>[]":
        out = out.replace(ch, "\\" + ch)
    return out.replace("\n", " ")


def markdown(cmp: Comparison) -> str:
    status = ("grew" if cmp.failed else "no growth") + (", unpaired traces" if cmp.unpaired else "")
    lines = [f"### Memory: {_md(' '.join(cmp.base))} → {_md(' '.join(cmp.head))} ({status}, threshold "
             f"{_md(cmp.threshold)})", ""]
    if cmp.baseline:
        lines += [_md(cmp.baseline["text"]), ""]
    lines += ["| run | buffer | base | head | delta | cause |", "|---|---|---|---:|---:|---|"]
    for p in cmp.pairs:
        for c in p.buffers:
            delta = _md(_signed(c.delta) + _percent(c))
            if p.grew and (c.delta or 0) > 0:
                delta = f"**{delta}**"
            lines.append(f"| {_md(_key(p.key))} | {_md(c.buffer)} | {_md(fmt_bytes(c.base))} | "
                         f"{_md(fmt_bytes(c.head))} | {delta} | {_md(_cause(c))} |")
    for p in cmp.pairs:
        for c in p.buffers:
            if not c.attribution:
                continue
            lines += ["", f"<details><summary>{_md(_key(p.key))}, {_md(c.buffer)}: by family</summary>", "",
                      "| family | base | head | delta |", "|---|---:|---:|---:|"]
            for r in c.attribution["families"][:12]:
                if r["delta"]:
                    lines.append(f"| {_md(r['family'])} | {_md(fmt_bytes(r['a']))} | {_md(fmt_bytes(r['b']))} | "
                                 f"{_md(_signed(r['delta']))} |")
            lines.append(f"| fragmentation | {_md(fmt_bytes(c.attribution['a_fragmentation']))} | "
                         f"{_md(fmt_bytes(c.attribution['b_fragmentation']))} | "
                         f"{_md(_signed(c.attribution['fragmentation_delta']))} |")
            lines += ["", "</details>"]
    if cmp.unpaired:
        lines += ["", f"**{_md(_unpaired_sentence(cmp))}**"]
    if cmp.only_base or cmp.only_head:
        lines.append("")
        lines += [f"- only in base: {_md(s['name'])} ({_md(s['id'])}; {_md(_tags(s))})" for s in cmp.only_base]
        lines += [f"- only in head: {_md(s['name'])} ({_md(s['id'])}; {_md(_tags(s))})" for s in cmp.only_head]
    return "\n".join(lines) + "\n"
