"""A real PyTorch trace's JSON Lines export with random fields changed, dropped or lines moved: the import stores
a trace or refuses it with one line (nothing stored), and a stored one answers every view (state, peak, flame)
or refuses with one line, never a traceback."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from alloctrace.cli import main
from alloctrace.traces.errors import UserError
from alloctrace.traces.sources import import_file
from alloctrace.traces.store.store import open_store

SNAPSHOT = Path(__file__).resolve().parents[1] / "data" / "torch" / "small_cap_expandable_streams.pickle.gz"
TYPES = ("trace", "device", "strings", "frame", "stack", "entry", "segment", "block")
numbers = st.sampled_from([-1, 0, 1, 2, 511, 512, 1 << 20, (1 << 31) - 1, 1 << 31, 1 << 50, (1 << 62), (1 << 63) - 1,
                           1 << 63, 1 << 64]) | st.integers(-10, 10 ** 7)
values = st.recursive(st.none() | st.booleans() | numbers | st.floats(allow_nan=False) | st.text(max_size=5)
                      | st.sampled_from(["alloc", "free_requested", "segment_map", "oom", "inactive", "START",
                                         "large", "small", "torch"]),
                      lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                      max_leaves=8)
OPS = st.lists(st.tuples(st.sampled_from(["set", "nudge", "nudge", "nudge", "drop", "delete", "duplicate", "swap"]),
                         st.sampled_from(TYPES + ("entry",) * 5 + ("segment", "block") * 2),
                         st.integers(0, 10 ** 6), st.integers(0, 10 ** 6), values), min_size=1, max_size=4)


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> list[dict]:
    store = str(tmp_path_factory.mktemp("fuzz-src") / "s")
    assert main(["import", str(SNAPSHOT), "--store", store]) == 0
    [t] = open_store(store).list()
    out = io.StringIO()
    from alloctrace.traces.export.torch_jsonl import write_jsonl
    write_jsonl(open_store(store), t["id"], out)
    return [json.loads(x) for x in out.getvalue().splitlines()]


def mutate(lines: list[dict], ops) -> str:
    lines = [dict(d) for d in lines]
    for op, kind, a, b, value in ops:
        at = [k for k, d in enumerate(lines) if d.get("type") == kind] or list(range(len(lines)))
        i, j = at[a % len(at)], b % len(lines)
        keys = sorted(lines[i])
        if op == "set":
            lines[i][keys[b % len(keys)]] = value
        elif op == "nudge":  # an integer field to another plausible integer: mostly still a valid file
            ints = [k for k in keys if type(lines[i][k]) is int and k not in ("device", "id", "i", "version")]
            if ints:
                lines[i][ints[b % len(ints)]] = (b * 512) % (1 << 34) if a % 3 else -1
        elif op == "drop":
            lines[i].pop(keys[b % len(keys)])
        elif op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(j, dict(lines[i]))
        else:
            lines[i], lines[j] = lines[j], lines[i]
        if not lines:
            break
    return "".join(json.dumps(d) + "\n" for d in lines)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_changed_exports_import_or_fail_cleanly(exported, tmp_path_factory, ops, capsys):
    root = tmp_path_factory.mktemp("fuzz")
    store = open_store(root / "s")
    try:
        [s] = import_file(store, io.BytesIO(mutate(exported, ops).encode()), filename="m.jsonl")
    except UserError as e:
        assert str(e).startswith("m.jsonl") and "\n" not in str(e), str(e)
        assert store.list() == []
        event("refused")
        return
    event("stored")
    for g in store.summary(s["id"])["graphs"]:
        ref = f"{s['id']}:{g['index']}"
        for argv in (["state", ref, "--event", "end", "--json"], ["state", ref, "--event", "peak", "--json"],
                     ["peak", ref, "--json"], ["flame", ref, "--at", "peak"]):
            assert main([*argv, "--store", str(root / "s")]) in (0, 2), argv
            err = capsys.readouterr().err
            assert "Traceback" not in err and err.count("\n") <= 1, err
