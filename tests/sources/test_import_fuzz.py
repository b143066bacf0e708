"""Mutated real logs never crash the importer and never leave a partial trace."""
from hypothesis import HealthCheck, given, settings, strategies as st

from alloctrace.traces.errors import UserError
from alloctrace.traces.sources import import_paths
from alloctrace.traces.store.store import open_store

from conftest import FIXTURES

LOGS = sorted(FIXTURES.glob("*/harness*.log")) + [FIXTURES / "head-gallocr" / "gpt-2-alloc_tiny_short.AT.log"]


def mutate(lines: list[bytes], ops) -> bytes:
    lines = list(lines)
    for op, a, b, junk in ops:
        if not lines:
            break
        i, j = a % len(lines), b % len(lines)
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(j, lines[i])
        elif op == "swap":
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "digit":
            lines[i] = bytes(c if not 48 <= c <= 57 else 48 + (c + b) % 10 for c in lines[i])
        elif op == "insert":
            lines.insert(i, junk)
        elif op == "glue":
            lines[i] = junk.rstrip(b"\n") + lines[i]
        elif op == "cut":
            lines[i] = lines[i][: b % (len(lines[i]) + 1)]
        elif op == "truncate":
            lines = lines[:i]
    return b"".join(lines)


OPS = st.lists(st.tuples(st.sampled_from(["delete", "duplicate", "swap", "digit", "insert", "glue", "cut", "truncate"]),
                         st.integers(0, 10**6), st.integers(0, 10**6), st.binary(max_size=40)), max_size=12)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(log=st.sampled_from(LOGS), ops=OPS)
def test_mutated_logs_import_or_fail_cleanly(tmp_path_factory, log, ops):
    tmp = tmp_path_factory.mktemp("fuzz")
    store = open_store(tmp / "store")
    path = tmp / "m.log"
    path.write_bytes(mutate(log.read_bytes().splitlines(keepends=True), ops))
    try:
        [tid] = import_paths(store, [path])
    except UserError as e:
        assert str(e) and "\n" not in str(e)
        assert store.list() == []
        assert store.db.execute("SELECT (SELECT count(*) FROM graphs) + (SELECT count(*) FROM columns)").fetchone() == (0,)
        return
    s = store.summary(tid)
    assert s["graphs"], "a stored trace has at least one graph"
    for g in s["graphs"]:
        assert len(store.events(tid, g["index"])) == g["n_events"]
        assert g["role"] in ("measure", "eval", "reserve")
