"""No two modules of the package import each other, directly or around a longer circle.

A circle makes the import order matter (a half-initialised module hands out names it has not defined
yet) and ties the modules on it into one piece that can only be read, tested and moved together. The
graph is built by grimp (what lint-imports uses) over the package laid out as a wheel installs it
(tests/house/test_architecture.py: lay_out), every import counted, lazy ones inside functions too.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from test_architecture import lay_out


GRAPH = """
import json, sys
import grimp
graph = grimp.build_graph("alloctrace", cache_dir=None)
print(json.dumps({m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}))
"""


def import_graph(tree) -> dict[str, list[str]]:
    """module -> the modules it imports, built in a process of its own over `tree` (building it finds the
    packages by importing their parents, which must not replace this process's own copy)."""
    r = subprocess.run([sys.executable, "-c", GRAPH], cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def import_circles(tree) -> list[list[str]]:
    """The strongly connected groups of two or more modules in the import graph of `alloctrace` (Tarjan)."""
    edges = import_graph(tree)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    group.append(m)
                    if m == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def test_no_module_of_the_package_is_on_an_import_circle(tmp_path):
    assert import_circles(lay_out(tmp_path)) == []


def test_a_circle_is_found(tmp_path):
    """The check sees a circle through a lazy import, as the memory map and its tile pyramid had one."""
    back = textwrap.dedent("""\
        def later():
            from alloctrace.traces.memmap import view
            return view
        """)
    tree = lay_out(tmp_path, {"alloctrace/traces/util/_back.py": back,
                              "alloctrace/traces/memmap/_front.py": "from alloctrace.traces.util import _back\n"})
    (tmp_path / "alloctrace/traces/memmap/view.py").write_text(
        (tmp_path / "alloctrace/traces/memmap/view.py").read_text() + "\nfrom alloctrace.traces.memmap import _front\n")
    circles = import_circles(tree)
    assert circles and any({"alloctrace.traces.util._back", "alloctrace.traces.memmap.view"} <= set(c) for c in circles)
