#!/usr/bin/python3
"""PyTorch peer of kiln-bench's `fusion` suite: softmax and layer_norm on [4096, 1024] float32,
x*x + x and the tanh-gelu formula on 2^24 float32, in PyTorch eager mode, GB/s counted like
kiln-bench (one input read + one output written per element).

Needs Debian's python3-torch and libopenblas0-pthread (not installed by scripts/setup.sh). Usage (Debian's python):
  /usr/bin/python3 benchmarks/peers/fusion_torch.py [--threads N] [--json FILE]
"""
import argparse
import json
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402


def timed(fn, reps=20):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    n16 = 1 << 24
    x16 = torch.rand(n16) * 6 - 3
    xr = torch.rand(4096, 1024) * 8 - 4
    w, b = torch.rand(1024), torch.rand(1024)

    def gelu():
        return 0.5 * x16 * (1 + torch.tanh(0.79788456 * (x16 + 0.044715 * x16 * x16 * x16)))

    cases = [
        ("x_mul_x_plus_x_16M", lambda: x16 * x16 + x16, 8.0 * n16),
        ("gelu_16M", gelu, 8.0 * n16),
        ("softmax_4096x1024", lambda: torch.softmax(xr, -1), 8.0 * 4096 * 1024),
        ("layer_norm_4096x1024",
         lambda: torch.nn.functional.layer_norm(xr, [1024], w, b), 8.0 * 4096 * 1024),
    ]
    records = []
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    with torch.no_grad():
        for name, fn, nbytes in cases:
            s = timed(fn)
            gbs = nbytes / s / 1e9
            print(f"  {name:<24} {s * 1e3:8.3f} ms  {gbs:7.2f} GB/s")
            records.append({"suite": "fusion", "case": name, "mode": "peer",
                            "framework": f"pytorch {torch.__version__}", "median_ms": s * 1e3,
                            "value": gbs, "unit": "GB/s"})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
