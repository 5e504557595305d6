#!/usr/bin/python3
"""Turns kiln-bench's JSON records into report.md and PNG charts.

Usage: /usr/bin/python3 scripts/report.py RESULTS_JSON OUT_DIR

Writes OUT_DIR/report.md (a table per suite; compiled / eager speed-up where a case ran in
both modes), OUT_DIR/speedup.png (compiled over eager per case) and, when the digits suite ran,
OUT_DIR/loss.png (training loss per epoch, eager vs compiled). Charts are drawn with
matplotlib (Debian's python3-matplotlib, installed by scripts/setup.sh).
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display
import matplotlib.pyplot as plt  # noqa: E402

# Units where a larger value is better (throughput); for the others (time) smaller is better.
HIGHER_IS_BETTER = {"GB/s", "GFLOP/s", "steps/s", "samples/s", "percent"}


def speedup(eager, compiled):
    """compiled over eager, as 'how many times faster' (None if not comparable)."""
    if not eager or not compiled or eager["value"] is None or compiled["value"] is None:
        return None
    if eager["unit"] != compiled["unit"] or eager["value"] == 0 or compiled["value"] == 0:
        return None
    if eager["unit"] in HIGHER_IS_BETTER:
        return compiled["value"] / eager["value"]
    return eager["value"] / compiled["value"]


def cell(record):
    """A record's figure, or why it has none: skipped (no GPU, no data) or failed."""
    if record is None:
        return ""
    if record["value"] is None:
        return record.get("status", "failed")
    return fmt(record["value"])


def fmt(v):
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    records = json.load(open(sys.argv[1]))
    out = sys.argv[2]
    os.makedirs(out, exist_ok=True)

    suites = []
    by_case = {}
    for r in records:
        if r["suite"] not in suites:
            suites.append(r["suite"])
        by_case.setdefault((r["suite"], r["case"]), {})[r["mode"]] = r

    lines = ["# kiln benchmark report", "",
             "Eager and compiled runs of each workload in the same process on this machine. "
             "`speed-up` is compiled over eager (higher is better).", ""]
    bars = []
    for suite in suites:
        lines += [f"## {suite}", "", "| case | unit | eager | compiled | reference / peer | speed-up |",
                  "|---|---|---:|---:|---:|---:|"]
        for (s, case), modes in by_case.items():
            if s != suite:
                continue
            e, c = modes.get("eager"), modes.get("compiled")
            other = modes.get("reference") or modes.get("peer")
            unit = (e or c or other)["unit"]
            sp = speedup(e, c) if unit not in ("percent", "relative") else None
            if sp is not None:  # speeds only
                bars.append((f"{suite}/{case}", sp))
            lines.append(f"| {case} | {unit} | {cell(e)} | {cell(c)} | {cell(other)} | "
                         f"{f'{sp:.2f}x' if sp is not None else ''} |")
        lines.append("")

    if bars:
        fig, ax = plt.subplots(figsize=(8, 0.45 * len(bars) + 1.2))
        names = [b[0] for b in bars]
        values = [b[1] for b in bars]
        colors = ["tab:green" if v >= 1 else "tab:red" for v in values]
        ax.barh(names, values, color=colors)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel("compiled / eager (x faster)")
        ax.set_title("kiln: speed-up of compiled over eager")
        ax.invert_yaxis()
        for i, v in enumerate(values):
            ax.text(v, i, f" {v:.2f}x", va="center")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "speedup.png"), dpi=110)
        lines += ["![speed-up of compiled over eager](speedup.png)", ""]

    # Training steps (fixed-step cases) carry their CPU GEMM time: matrix products run in the
    # BLAS library in both modes, so eager's step over compiled's GEMM time bounds the speed-up.
    steps = [(s, case, modes) for (s, case), modes in by_case.items()
             if all(m.get("gemm_time_per_step") for m in (modes.get("eager"), modes.get("compiled"))
                    if m is not None) and "eager" in modes and "compiled" in modes]
    if steps:
        lines += ["## Where a training step's time goes", "",
                  "GEMM: matrix products in oneDNN (the same calls in both modes); other: every "
                  "other op, which compile() fuses. The bound is the speed-up if every other op "
                  "took no time.", "",
                  "| case | eager step ms | eager GEMM ms | compiled step ms | compiled GEMM ms | "
                  "bound |", "|---|---:|---:|---:|---:|---:|"]
        def ms(v):  # 0.148 ms steps (digits) keep 3 digits; 64.5 ms ones one decimal
            return f"{v:.1f}" if v >= 10 else f"{v:.3g}"
        for s, case, modes in steps:
            e, c = modes["eager"], modes["compiled"]
            lines.append(f"| {s}/{case} | {ms(e['avg_step_time'])} | "
                         f"{ms(e['gemm_time_per_step'])} | {ms(c['avg_step_time'])} | "
                         f"{ms(c['gemm_time_per_step'])} | "
                         f"{e['avg_step_time'] / c['gemm_time_per_step']:.2f}x |")
        lines.append("")

    # Training loss curves: digits records carry loss_epoch_<n> extra fields per mode.
    curves = {}
    for r in records:
        if r["suite"] == "digits":
            pts = sorted((int(k.split("_")[-1]), v) for k, v in r.items()
                         if k.startswith("loss_epoch_") and v is not None)
            if pts:
                curves[r["mode"]] = pts
    if curves:
        fig, ax = plt.subplots(figsize=(6, 4))
        for mode, pts in curves.items():
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o" if mode == "eager" else "x",
                    linestyle="-" if mode == "eager" else "--", label=mode)
        ax.set_xlabel("epoch")
        ax.set_ylabel("training loss (mean over the epoch)")
        ax.set_title("digits MLP: eager vs compiled training")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out, "loss.png"), dpi=110)
        lines += ["![training loss per epoch, eager vs compiled](loss.png)", ""]

    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines))
    print(f"report: wrote {os.path.join(out, 'report.md')}"
          + (", speedup.png" if bars else "") + (", loss.png" if curves else ""))


if __name__ == "__main__":
    main()
