"""Pre-flight totals against what llama.cpp prints about itself, on a sliding-window (iSWA) and a MoE model.

For each model (tests/iswa_gguf.py's tiny gemma3: two KV caches; tests/moe_gguf.py's tiny qwen3moe; and
tiny-llama.gguf where it is there):
- `alloctrace sweep` of llama.cpp's weightless dry run (llama-fit-params -v) over contexts and micro-batches:
  every point's total (exact compute buffers + the weights, every KV cache and the output buffer as printed)
  checked against the program's own memory breakdown printed by that same run (`| - Host | N = model +
  context + compute |`, whole MiB rounded down);
- `alloctrace fit` under a budget, then llama-completion (weights and caches really allocated, -fit off -v)
  run at the answer and one step above: its printed sizes summed (model + every KV cache + output +
  compute) against fit's totals, and its breakdown where it printed one.

    python bench/bench_preflight.py [--llama-bin DIR] [--json PATH]

DIR holds llama-completion, llama-fit-params and their libraries (default: the directory of
$ALLOCTRACE_LLAMA_BIN).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from figures import Figure, add_option, write

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the GGUF writers of the tests

CONTEXTS = "256,512,1024,2048,4096,8192,16384"
UBATCHES = "128,512"
STEP = 256
ROUNDING = 0.005  # MiB: a two-decimal printed figure


def alloctrace(env, *args) -> dict:
    r = subprocess.run([sys.executable, "-m", "alloctrace", *args], env=env, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=600)
    if r.returncode not in (0, 1):
        sys.exit(f"alloctrace {' '.join(args[:2])} failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout)


def real_run(env, completion, model, c) -> dict:
    """llama-completion at -c `c` with its weights and caches allocated: what it printed (printed.py)."""
    from alloctrace.traces.preflight.printed import printed_sizes

    r = subprocess.run([completion, "-m", model, "-p", "Hi", "-n", "1", "-c", str(c), "-t", "2", "-no-cnv",
                        "--temp", "0", "-fit", "off", "-v"], env=env, capture_output=True, text=True,
                       errors="replace", stdin=subprocess.DEVNULL, timeout=300)
    if r.returncode:
        sys.exit(f"llama-completion -c {c} failed: {r.stderr[-2000:]}")
    return printed_sizes(r.stdout + r.stderr)


def bench_model(name, model, budget_mib, bindir, env, store) -> list[Figure]:
    from alloctrace.traces.preflight.breakdown import check, check_lines
    from alloctrace.traces.preflight.printed import MIB, total_mib

    fit_params, completion = str(bindir / "llama-fit-params"), str(bindir / "llama-completion")
    t0 = time.perf_counter()
    out = alloctrace(env, "sweep", "--store", f"{store}/{name}-sweep", "--json", f"--vary=-c={CONTEXTS}",
                     f"--vary=-ub={UBATCHES}", "--", fit_params, "-m", model, "-v")
    wall = time.perf_counter() - t0
    pts = out["points"]
    agree = [p for p in pts if p["check"] and p["check"]["agrees"]]
    caches = sorted({label for p in pts for label in p["printed"].get("kv_cache", {})})
    print(f"\n{name}: sweep of {len(pts)} dry-run points ({wall:.2f} s), KV caches {caches}")
    print(f"  {'-c':>6} {'-ub':>4} {'total (B)':>12} {'total MiB':>10}  breakdown printed (self = model + context "
          "+ compute)")
    for p in pts:
        dev = p["check"]["devices"][0] if p["check"] else None
        shown = (f"{dev['device']} {dev['printed']['self']:.0f} = {dev['printed']['model']:.0f} + "
                 f"{dev['printed']['context']:.0f} + {dev['printed']['compute']:.0f}") if dev else "none printed"
        verdict = "agrees" if p in agree else "DIFFERS"
        print(f"  {p['values']['-c']:>6} {p['values']['-ub']:>4} {p['total']:>12,} {p['total'] / MIB:>10.2f}  "
              f"{shown}: {verdict}")
        if p not in agree and p["check"]:
            print("\n".join(check_lines(p["check"], "      ")))
    figures = [Figure(f"{name}: swept points whose total equals the program's own breakdown", len(agree),
                      f"of {len(pts)}", f"= {len(pts)}", len(agree) == len(pts),
                      f"the breakdown each dry run printed ({len(pts)} points, caches {', '.join(caches)})")]
    fit = alloctrace(env, "fit", "--store", f"{store}/{name}-fit", "--json", "--budget", f"{budget_mib}MiB",
                     f"--vary=-c={STEP}..65536", "--step", str(STEP), "--", fit_params, "-m", model, "-v")
    if fit["value"] is None:
        sys.exit(f"{name}: nothing fits {budget_mib} MiB")
    print(f"  fit --budget {budget_mib}MiB: -c {fit['value']} ({fit['total']:,} B = {fit['total'] / MIB:.2f} MiB), "
          f"{len(fit['probes'])} dry runs; -c {fit['next']['value']} needs {fit['next']['total'] / MIB:.2f} MiB")
    verified = 0
    for what, c, total, dry in (("answer", fit["value"], fit["total"], fit["check"]),
                                ("one step above", fit["next"]["value"], fit["next"]["total"], fit["next"]["check"])):
        real = real_run(env, completion, model, c)
        theirs = total_mib(real) + sum(real.get("compute", {}).values())
        n_figures = sum(len(real.get(k, {})) for k in ("weights", "kv_cache", "output", "compute"))
        close = abs(total / MIB - theirs) <= ROUNDING * n_figures
        breakdown = check({k: round(v * MIB) for k, v in real.get("compute", {}).items()}, real)
        ok = close and (dry or {}).get("agrees", False) and (breakdown is None or breakdown["agrees"])
        verified += ok
        b_text = "none printed" if breakdown is None else ("agrees" if breakdown["agrees"] else "DIFFERS")
        print(f"  {what} -c {c}: fit's total {total / MIB:.3f} MiB; the real llama-completion printed "
              f"{theirs:.2f} MiB (model + {len(real.get('kv_cache', {}))} KV caches + output + compute, within "
              f"{ROUNDING * n_figures:.3f}: {'yes' if close else 'NO'}); dry run's breakdown "
              f"{'agrees' if (dry or {}).get('agrees') else 'DIFFERS'}, real run's breakdown {b_text}")
    figures.append(Figure(f"{name}: fit's answer and one step above, verified by real llama-completion runs",
                          verified, "of 2", "= 2", verified == 2,
                          f"llama-completion -fit off -v at -c {fit['value']} and {fit['next']['value']}"))
    return figures


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", default=None, help="directory with llama-completion and llama-fit-params")
    add_option(ap)
    a = ap.parse_args()
    bindir = Path(a.llama_bin or Path(os.environ.get("ALLOCTRACE_LLAMA_BIN", "")).parent).resolve()
    if not (bindir / "llama-fit-params").exists() or not (bindir / "llama-completion").exists():
        sys.exit(f"needs llama-fit-params and llama-completion in {bindir} (--llama-bin or $ALLOCTRACE_LLAMA_BIN)")
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(p for p in (str(bindir), os.environ.get("LD_LIBRARY_PATH"))
                                                    if p))
    os.environ["LD_LIBRARY_PATH"] = env["LD_LIBRARY_PATH"]
    from iswa_gguf import write as write_iswa
    from moe_gguf import write as write_moe

    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        iswa, moe = f"{tmp}/gemma3-iswa.gguf", f"{tmp}/qwen3moe.gguf"
        write_iswa(iswa)
        write_moe(moe)
        models = [("iSWA gemma3", iswa, 20), ("MoE qwen3moe", moe, 20)]
        llama = bindir.parent / "models" / "tiny-llama.gguf"
        if llama.exists():
            models.append(("tiny-llama", str(llama), 30))
        for name, model, budget in models:
            figures += bench_model(name, model, budget, bindir, env, f"{tmp}/stores")
    print()
    for f in figures:
        print(f"{f.figure}: {f.value} {f.unit} ({'ok' if f.ok else 'NOT MET'}, goal {f.goal})")
    write(a.json, figures)
    return 0 if all(f.ok for f in figures) else 1


if __name__ == "__main__":
    sys.exit(main())
