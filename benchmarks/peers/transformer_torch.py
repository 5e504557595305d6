#!/usr/bin/python3
"""PyTorch peer of kiln-bench's train-eager/transformer_step and mlp_64_128_10.

The same workloads, for a same-machine comparison:
  transformer: TransformerEncoder (d_model 256, 4 heads, FFN 1024, gelu, dropout 0.1,
  batch_first, 2 layers), batch 8, seq 128, AdamW lr 1e-4, loss = output.sum(),
  5 warm-up steps, 50 timed.
  mlp: 64→128→10 (ReLU), batch 64, SGD lr 0.01, cross-entropy.

Needs Debian's python3-torch (not installed by scripts/setup.sh; `apt-get install
python3-torch libopenblas0-pthread`). Usage (Debian's python, not a pyenv one): /usr/bin/python3 benchmarks/peers/transformer_torch.py [--threads N] [--json FILE]
Prints the benchmark's fields and optionally writes kiln-bench-style JSON records (mode "peer").
It reports the BLAS core type and thread settings it ran with.
"""
import argparse
import json
import os
import time

import torch


def transformer(steps=50, warmup=5):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, 0.1, activation="gelu", batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8, 128, 256)

    def step():
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


def mlp(seconds=2.0):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(50):
        step()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        n += 1
    return (time.perf_counter() - t0) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}, "
          f"ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', '(unset)')}")
    times = transformer()
    total = sum(times)
    avg = total / len(times)
    print("framework/mode: pytorch/eager")
    print(f"total_time: {total:.3f} s\navg_step_time: {avg * 1e3:.1f} ms\n"
          f"throughput: {8 / avg:.1f} samples/s")
    mlp_s = mlp()
    print(f"mlp_64_128_10: {1 / mlp_s:.0f} steps/s")
    if args.json:
        st = sorted(times)
        rec = [{"suite": "train-eager", "case": "transformer_step", "mode": "peer",
                "median_ms": st[len(st) // 2] * 1e3, "min_ms": st[0] * 1e3, "max_ms": st[-1] * 1e3,
                "value": 8 / avg, "unit": "samples/s", "total_time": total,
                "avg_step_time": avg * 1e3},
               {"suite": "train-eager", "case": "mlp_64_128_10", "mode": "peer",
                "median_ms": mlp_s * 1e3, "min_ms": mlp_s * 1e3, "max_ms": mlp_s * 1e3,
                "value": 1 / mlp_s, "unit": "steps/s"}]
        with open(args.json, "w") as f:
            json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
