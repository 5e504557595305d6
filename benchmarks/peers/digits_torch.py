#!/usr/bin/python3
"""PyTorch peer of kiln-bench's `digits` suite: the same data, split, MLP and training.

UCI 8x8 digits (data/digits.csv.gz), pixels / 16, 20 % test held out by the same splitmix64
Fisher-Yates shuffle as benchmarks/digits.cpp (seed 42), MLP 64-128-128-10 (ReLU, dropout 0.1),
AdamW lr 3e-3, cross_entropy, batch 64 (last partial batch dropped), 20 epochs, the training
order reshuffled per epoch with the same seeds. Prints per-epoch loss and test accuracy, the
final test accuracy and steps/s over the epochs after the first (only the step calls timed),
for each thread count. Initial weights and dropout masks come from torch's generator, so the
losses are not kiln's step for step; the split and the batch order are the same.

Needs Debian's python3-torch and libopenblas0-pthread (not installed by scripts/setup.sh). Usage (Debian's python):
  /usr/bin/python3 benchmarks/peers/digits_torch.py [--threads 1 2] [--epochs 20] [--json FILE]
"""
import argparse
import gzip
import json
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import numpy as np  # noqa: E402
import torch  # noqa: E402

MASK = (1 << 64) - 1
BATCH, FEATURES, CLASSES = 64, 64, 10


def splitmix64(seed):
    s = seed & MASK
    while True:
        s = (s + 0x9E3779B97F4A7C15) & MASK
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        yield z ^ (z >> 31)


def permutation(n, seed):
    p = list(range(n))
    g = splitmix64(seed)
    for i in range(n - 1, 0, -1):
        j = next(g) % (i + 1)
        p[i], p[j] = p[j], p[i]
    return p


def load(path):
    with gzip.open(path, "rt") as f:
        rows = [[int(v) for v in line.split(",")] for line in f if line.strip()]
    a = np.array(rows, dtype=np.int64)
    return a[:, :FEATURES].astype(np.float32) / 16.0, a[:, FEATURES]


def split(x, y):
    perm = permutation(len(y), 42)
    n_test = len(y) // 5
    te, tr = perm[:n_test], perm[n_test:]
    return x[tr], y[tr], x[te], y[te]


def train(x_tr, y_tr, x_te, y_te, epochs, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 128), torch.nn.ReLU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(128, CLASSES))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x_tr), torch.from_numpy(y_tr)
    xe, ye = torch.from_numpy(x_te), torch.from_numpy(y_te)
    steps = len(y_tr) // BATCH

    def step(x, y):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    log = []
    for e in range(epochs):
        order = torch.tensor(permutation(len(y_tr), 1000 + e))
        model.train()
        seconds, total = 0.0, 0.0
        for k in range(steps):
            idx = order[k * BATCH:(k + 1) * BATCH]
            x, y = xt[idx], yt[idx]
            t0 = time.perf_counter()
            loss = step(x, y)
            seconds += time.perf_counter() - t0
            total += loss.item()
        model.eval()
        with torch.no_grad():
            acc = (model(xe).argmax(1) == ye).double().mean().item() * 100
        log.append({"epoch": e + 1, "loss": total / steps, "accuracy": acc,
                    "steps": steps, "seconds": seconds})
    later = log[1:] or log
    sps = sum(r["steps"] for r in later) / sum(r["seconds"] for r in later)
    return log, sps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--data", default=os.path.join(
        os.environ.get("KILN_DATA_DIR", os.path.join(here, "..", "..", "data")), "digits.csv.gz"))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    x_tr, y_tr, x_te, y_te = split(*load(args.data))
    print(f"PyTorch {torch.__version__}: digits {len(y_tr)} train / {len(y_te)} test, "
          f"MLP 64-128-128-10, AdamW lr 3e-3, batch {BATCH}, {args.epochs} epochs")
    records = []
    for t in args.threads:
        log, sps = train(x_tr, y_tr, x_te, y_te, args.epochs, t)
        print(f"\n{t} thread(s):\n  epoch        loss   test acc   steps/s")
        for r in log:
            print(f"  {r['epoch']:>5} {r['loss']:>11.6f} {r['accuracy']:>9.2f}% "
                  f"{r['steps'] / r['seconds']:>9.0f}")
        print(f"  final test accuracy {log[-1]['accuracy']:.2f} %, "
              f"{sps:.0f} steps/s (epochs 2..{args.epochs})")
        records.append({"suite": "digits", "case": "digits_mlp_step", "mode": "peer",
                        "framework": f"pytorch-{torch.__version__}", "threads": t,
                        "value": sps, "unit": "steps/s"})
        records.append({"suite": "digits", "case": "digits_mlp_accuracy", "mode": "peer",
                        "framework": f"pytorch-{torch.__version__}", "threads": t,
                        "value": log[-1]["accuracy"], "unit": "percent"})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
