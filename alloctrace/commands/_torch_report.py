"""Terminal reports for PyTorch snapshot traces (used by `peak` and `diff`)."""
from __future__ import annotations

import json

from ._common import table


def is_torch(store, ref: str) -> bool:
    from alloctrace.traces.store.kinds import TORCH, trace_kind
    return trace_kind(store, ref) == TORCH


def diff_snapshots(store, ref_a: str, ref_b: str, as_json: bool, skip=None, top: int = 20) -> int:
    """`alloctrace diff` of two snapshots: peak by call site side by side, the exact decomposition, alignment.
    Exit status as diff(1): 0 when both runs allocated the same sizes in the same order, else 1."""
    from alloctrace.traces.diff.torch_snapshots import diff_stored
    from alloctrace.traces.state.torch_device import DEFAULT_SKIP, load_device
    from alloctrace.traces.state.torch_wrapped import note as partial_note

    d = diff_stored(store, ref_a, ref_b, skip=DEFAULT_SKIP if skip is None else skip, top=top)
    al = d["alignment"]
    same = al["same_sequence"] and al["grew"] == 0 and al["shrank"] == 0
    if as_json:
        print(json.dumps(d, indent=1))
        return 0 if same else 1
    a, b, p = d["a"], d["b"], d["decomposition"]
    print(f"a: {a['name']} ({a['trace_id']}:{a['device']})   b: {b['name']} ({b['trace_id']}:{b['device']})")
    for side, ref in zip("ab", (ref_a, ref_b)):
        tid, g = store.resolve(ref)
        line = partial_note(load_device(store, tid, 0 if g is None else g).extra)
        if line:
            print(f"note ({side}): {line}")
    print(f"peak requested {a['peak_requested']:,} -> {b['peak_requested']:,} ({d['delta_requested']:+,})")
    print(f"peak reserved  {a['peak_reserved']:,} -> {b['peak_reserved']:,} "
          f"({d['reserved']['delta_peak_reserved']:+,})")
    print(f"  = resized {p['resized']['bytes']:+,} ({p['resized']['count']:,} allocations live at both peaks)"
          f" + live only at b's peak {p['only_b']['bytes']:+,} - live only at a's peak {p['only_a']['bytes']:,}")
    print(f"aligned: {al['paired']:,} allocations paired"
          f"{' (same call-site sequence)' if al['same_sequence'] else ''}, {al['only_a']:,} only in a, "
          f"{al['only_b']:,} only in b; {al['grew']:,} grew, {al['shrank']:,} shrank")
    first = d["first_difference"]
    if first:
        def one(x):
            return "none" if x is None else f"#{x['index']:,} {x['size']:,} B at {x['site']}"
        print(f"first allocation that differs ({first['differs_in']}): a {one(first['a'])}; b {one(first['b'])}")
    rows = [["A BYTES", "B BYTES", "DELTA", "CALL SITE"]]
    rows += [[f"{r['a_bytes']:,}", f"{r['b_bytes']:,}", f"{r['delta']:+,}", r["site"]] for r in d["by_call_site"]]
    print(table(rows))
    return 0 if same else 1
