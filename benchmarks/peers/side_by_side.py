#!/usr/bin/python3
"""kiln and PyTorch side by side in one run: the transformer, digits and fusion workloads.

Runs `kiln-bench transformer digits fusion` (eager and compiled) and the PyTorch peers
(transformer_torch.py, digits_torch.py, fusion_torch.py; Debian's python3-torch 1.13, CPU),
then prints, per case, kiln eager, kiln compiled, PyTorch, and the ratios kiln / PyTorch.

Usage: /usr/bin/python3 benchmarks/peers/side_by_side.py [--build build] [--quick] [--threads N]

BLAS: kiln multiplies float32 matrices with oneDNN's sgemm (libdnnl, loaded at run time; no
OpenBLAS). Debian's PyTorch calls the system BLAS (libblas.so.3): install OpenBLAS
(`apt-get install python3-torch libopenblas0-pthread`), else Debian's reference BLAS runs
its matrix products ~20x slower (1024^3: 3.7 against 72 GFLOP/s on one Zen 3 core). OpenBLAS
0.3.21 falls back to slow kernels on CPUs it does not know (the AVX-512 Xeon of
notes/cpu-performance.md): on a CPU with AVX-512 this script sets OPENBLAS_CORETYPE=SkylakeX
unless it is set; elsewhere OpenBLAS's own choice stands (it picks Zen on an AMD EPYC Zen 3).
It prints what each side used.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
HIGHER_IS_BETTER = {"GB/s", "GFLOP/s", "steps/s", "samples/s", "percent"}
# Issue 6: compiled kiln against PyTorch 1.13 eager on the same workload, same machine.
COMPILED_VS_PEER_TARGETS = {"transformer_step": 1.3, "digits_mlp_step": 2.0}


def run(cmd, env=None):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=False, env=env)


def cpu_has(flag):
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and flag in line.split() for line in f)
    except OSError:
        return False


def system_blas():
    """The library behind libblas.so.3, which Debian's PyTorch calls for its products."""
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib"):
        path = os.path.join(d, "libblas.so.3")
        if os.path.exists(path):
            return os.path.realpath(path)
    return "(libblas.so.3 not found)"


def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()

    env = dict(os.environ)
    if cpu_has("avx512f"):
        env.setdefault("OPENBLAS_CORETYPE", "SkylakeX")
    blas = system_blas()
    if "openblas" not in blas:
        print(f"warning: PyTorch's BLAS is {blas}, not OpenBLAS: its matrix products will be "
              "~20x slower (apt-get install libopenblas0-pthread)", flush=True)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    tmp = tempfile.mkdtemp(prefix="kiln-peers-")
    kiln_json = os.path.join(tmp, "kiln.json")
    bench = [os.path.join(args.build, "benchmarks", "kiln-bench"), "transformer", "digits", "fusion",
             "--json", kiln_json, "--threads", str(args.threads)] + (["--quick"] if args.quick else [])
    run(bench, env)
    peers = []
    for script, extra in (("transformer_torch.py", ["--threads", str(args.threads)]),
                          ("digits_torch.py", ["--threads", str(args.threads)]
                           + (["--epochs", "3"] if args.quick else [])),
                          ("fusion_torch.py", ["--threads", str(args.threads)])):
        out = os.path.join(tmp, script + ".json")
        run([sys.executable, os.path.join(HERE, script), "--json", out] + extra, env)
        peers += load(out)

    kiln = load(kiln_json)
    print(f"\nBLAS: kiln = oneDNN sgemm (libdnnl); PyTorch = {blas} with "
          f"OPENBLAS_CORETYPE={env.get('OPENBLAS_CORETYPE', '(unset: its own choice)')}; "
          f"{args.threads} thread(s) each\n")
    print(f"{'case':<28} {'unit':<10} {'kiln eager':>11} {'kiln comp.':>11} {'PyTorch':>11} "
          f"{'eager/PT':>9} {'comp./PT':>9}  target (issue 6)")
    for p in peers:
        if p.get("value") is None:
            continue
        ks = {r["mode"]: r for r in kiln if r["case"] == p["case"] and r.get("value") is not None}
        if not ks:
            continue

        def ratio(r):
            if not r or r["unit"] != p["unit"]:
                return None
            return r["value"] / p["value"] if p["unit"] in HIGHER_IS_BETTER else p["value"] / r["value"]

        def shown(v):
            return "" if v is None else f"{v:.2f}x"

        e, c = ks.get("eager"), ks.get("compiled")
        target, rc = COMPILED_VS_PEER_TARGETS.get(p["case"]), ratio(c)
        verdict = "" if target is None or rc is None else \
            f"compiled >= {target}x: {'met' if rc >= target else 'MISSED'}"
        print(f"{p['case']:<28} {p['unit']:<10} {e['value'] if e else float('nan'):>11.4g} "
              f"{c['value'] if c else float('nan'):>11.4g} {p['value']:>11.4g} {shown(ratio(e)):>9} "
              f"{shown(rc):>9}  {verdict}")
    print("\n(ratios > 1: kiln faster)")


if __name__ == "__main__":
    main()
