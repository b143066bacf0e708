"""Static hazard check time on a ~3,000-node synthetic chain of transformer-like layers.

Run: python bench/bench_hazards.py [--layers N] [--repeat R]
Prints plan size, parse_seq length and check times (serial, and concurrent levels).
"""
from __future__ import annotations

import argparse
import time

from alloctrace.allocator import LegacyAllocator, get_profile
from alloctrace.allocator.tensor import Graph, Tensor
from alloctrace.metal_exec.hazards import check
from alloctrace.metal_exec.plan import plan_from_legacy
from figures import Figure, add_option, write

WEIGHTS = 0x7F0000000000


def layer_graph(n_layers: int, E: int = 256, N: int = 8, H: int = 4) -> Graph:
    """Per layer: rms_norm, q/k/v matmuls, views and permutes, attention, output, two-branch MLP, residuals."""
    addr = [WEIGHTS]

    def weight(name, ne):
        t = Tensor(name, ne=ne, data=addr[0])
        addr[0] += t.nbytes + 32
        leafs.append(t)
        return t

    leafs, nodes = [], []

    def node(name, op, ne, srcs, **kw):
        t = Tensor(name, op, ne=ne, srcs=srcs, **kw)
        nodes.append(t)
        return t

    x = Tensor("x", ne=(E, N))
    leafs.append(x)
    cur, D = x, E // H
    for i in range(n_layers):
        n = node(f"norm{i}", "RMS_NORM", (E, N), [cur])
        g = node(f"norm_g{i}", "MUL", (E, N), [n, weight(f"g{i}", (E, 1))])
        q = node(f"q{i}", "MUL_MAT", (E, N), [weight(f"wq{i}", (E, E)), g])
        k = node(f"k{i}", "MUL_MAT", (E, N), [weight(f"wk{i}", (E, E)), g])
        v = node(f"v{i}", "MUL_MAT", (E, N), [weight(f"wv{i}", (E, E)), g])
        q3 = node(f"q3_{i}", "RESHAPE", (D, H, N), [q])
        k3 = node(f"k3_{i}", "RESHAPE", (D, H, N), [k])
        qr = node(f"qr{i}", "ROPE", (D, H, N), [q3])
        kr = node(f"kr{i}", "ROPE", (D, H, N), [k3])
        Q = node(f"Q{i}", "PERMUTE", (D, N, H), [qr], nb=(4, D * H * 4, D * 4, D * H * N * 4))
        K = node(f"K{i}", "PERMUTE", (D, N, H), [kr], nb=(4, D * H * 4, D * 4, D * H * N * 4))
        kq = node(f"kq{i}", "MUL_MAT", (N, N, H), [K, Q])
        sc = node(f"kq_scaled{i}", "SCALE", (N, N, H), [kq, weight(f"s{i}", (1,))])
        mk = node(f"kq_masked{i}", "DIAG_MASK_INF", (N, N, H), [sc])
        sm = node(f"kq_soft{i}", "SOFT_MAX", (N, N, H), [mk])
        v3 = node(f"v3_{i}", "RESHAPE", (D, H, N), [v])
        vt = node(f"vt{i}", "PERMUTE", (N, D, H), [v3], nb=(D * H * 4, 4, D * 4, D * H * N * 4))
        vc = node(f"vc{i}", "CONT", (N, D, H), [vt])
        kqv = node(f"kqv{i}", "MUL_MAT", (D, N, H), [vc, sm])
        mg = node(f"merged{i}", "PERMUTE", (D, H, N), [kqv], nb=(4, D * N * 4, D * 4, D * H * N * 4))
        ac = node(f"attn{i}", "CONT", (E, N), [mg])
        o = node(f"o{i}", "MUL_MAT", (E, N), [weight(f"wo{i}", (E, E)), ac])
        r1 = node(f"res1_{i}", "ADD", (E, N), [o, cur])
        n2 = node(f"ffn_norm{i}", "RMS_NORM", (E, N), [r1])
        a = node(f"w1_{i}", "MUL_MAT", (2 * E, N), [weight(f"w1{i}", (E, 2 * E)), n2])
        b = node(f"w3_{i}", "MUL_MAT", (2 * E, N), [weight(f"w3{i}", (E, 2 * E)), n2])
        s = node(f"silu{i}", "UNARY", (2 * E, N), [a], op_desc="SILU")
        gt = node(f"gate{i}", "MUL", (2 * E, N), [s, b])
        d = node(f"w2_{i}", "MUL_MAT", (E, N), [weight(f"w2{i}", (2 * E, E)), gt])
        cur = node(f"res2_{i}", "ADD", (E, N), [d, r1])
    return Graph(nodes, leafs)


def levels_by_depth(graph: Graph) -> list[int]:
    """A parse_seq: each node one level after its deepest node source, -1 after each level."""
    depth = {}
    for t in graph.nodes:
        depth[t] = 1 + max((depth.get(s, -1) for s in t.srcs if s is not None), default=-1)
    by = {}
    for t in graph.nodes:
        by.setdefault(depth[t], []).append(t.index)
    seq = []
    for d in sorted(by):
        seq += by[d] + [-1]
    return seq


def timed(fn, repeat: int):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=100, help="layers of 30 nodes (default 100: 3,000 nodes)")
    ap.add_argument("--repeat", type=int, default=3)
    add_option(ap)
    args = ap.parse_args()
    figures = []
    graph = layer_graph(args.layers)
    seq = levels_by_depth(graph)
    print(f"graph: {graph.n_nodes} nodes, {graph.n_leafs} leafs; parse_seq {len(seq)} entries")
    for profile, parse_seq in (("ggml-2023-08-28", None), ("ggml-2023-08-28", seq), ("ggml-2023-08-16", seq)):
        p = get_profile(profile)
        t_alloc, alloc = timed(lambda: _alloc(graph, p, parse_seq), 1)
        plan = plan_from_legacy(graph, alloc, parse_seq)
        t_check, hazards = timed(lambda: check(plan), args.repeat)
        mode = f"{len(plan.levels)} concurrent levels" if plan.concurrent else "serial"
        print(f"{profile:16s} {mode:24s} buffer {plan.buffer_size:>9,} B  allocate {t_alloc * 1e3:7.1f} ms  "
              f"check {t_check * 1e3:7.1f} ms  hazards {len(hazards)}")
        figures.append(Figure(f"hazard check: {profile} {mode}, {graph.n_nodes} nodes", round(t_check * 1e3, 1), "ms",
                              baseline=f"allocating the plan: {t_alloc * 1e3:.1f} ms"))
    # a broken plan: the middle layer's w3 output moved onto its w1 output, both live until the gate
    mid = args.layers // 2
    broken = plan.moved(graph.by_name(f"w3_{mid}"), plan.range(graph.by_name(f"w1_{mid}"))[0])
    t_check, hazards = timed(lambda: check(broken), args.repeat)
    print(f"{'broken plan':16s} {'(one tensor moved)':24s} {'':20s}  {'':17s}  "
          f"check {t_check * 1e3:7.1f} ms  hazards {len(hazards)}")
    figures.append(Figure(f"hazard check: broken plan, {graph.n_nodes} nodes", round(t_check * 1e3, 1), "ms"))
    write(args.json, figures)


def _alloc(graph, profile, parse_seq):
    alloc = LegacyAllocator.measure(profile, 32)
    alloc.alloc_tensor(graph.leafs[0])
    alloc.alloc_graph(graph, parse_seq=parse_seq)
    return alloc


if __name__ == "__main__":
    main()
