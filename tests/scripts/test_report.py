#!/usr/bin/python3
"""Test of scripts/report.py: speed-ups from known records, the tables, and the charts."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    records = [
        {"suite": "digits", "case": "digits_mlp_step", "mode": "eager", "value": 100.0, "unit": "steps/s",
         "avg_step_time": 0.264, "gemm_time_per_step": 0.093},
        {"suite": "digits", "case": "digits_mlp_step", "mode": "compiled", "value": 250.0, "unit": "steps/s",
         "avg_step_time": 0.148, "gemm_time_per_step": 0.092},
        {"suite": "digits", "case": "digits_mlp_accuracy", "mode": "eager", "value": 97.0, "unit": "percent",
         "loss_epoch_1": 1.5, "loss_epoch_2": 0.7},
        {"suite": "digits", "case": "digits_mlp_accuracy", "mode": "compiled", "value": 97.0, "unit": "percent",
         "loss_epoch_1": 1.5, "loss_epoch_2": 0.7},
        {"suite": "x", "case": "latency", "mode": "eager", "value": 10.0, "unit": "ms"},
        {"suite": "x", "case": "latency", "mode": "compiled", "value": 4.0, "unit": "ms"},
        {"suite": "t", "case": "step", "mode": "eager", "value": 20.0, "unit": "samples/s",
         "avg_step_time": 50.0, "gemm_time_per_step": 30.0},
        {"suite": "t", "case": "step", "mode": "compiled", "value": 25.0, "unit": "samples/s",
         "avg_step_time": 40.0, "gemm_time_per_step": 25.0},
        {"suite": "x", "case": "broken", "mode": "compiled", "value": None, "unit": "ms",
         "status": "failed", "error": "boom"},
        {"suite": "x", "case": "on_gpu", "mode": "compiled", "value": None, "unit": "GB/s",
         "status": "skipped", "error": "no CUDA device"},
    ]
    out = tempfile.mkdtemp(prefix="kiln-report-test-")
    path = os.path.join(out, "results.json")
    json.dump(records, open(path, "w"))
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "report.py"), path, out], check=True)
    md = open(os.path.join(out, "report.md")).read()
    assert "| digits_mlp_step | steps/s | 100 | 250 |  | 2.50x |" in md, md
    assert "| latency | ms | 10.00 | 4.00 |  | 2.50x |" in md, md  # time: eager / compiled
    assert "| digits_mlp_accuracy | percent | 97.00 | 97.00 |  |  |" in md, md  # no speed-up
    assert "| broken | ms |  | failed |" in md, md
    assert "| on_gpu | GB/s |  | skipped |" in md, md  # a skipped case is not "failed"
    assert "| t/step | 50.0 | 30.0 | 40.0 | 25.0 | 2.00x |" in md, md  # bound: 50 / 25
    assert md.count("| t/step |") == 1, md  # only cases with GEMM time in both modes
    # Sub-millisecond steps keep three digits: bound 0.264 / 0.092.
    assert "| digits/digits_mlp_step | 0.264 | 0.093 | 0.148 | 0.092 | 2.87x |" in md, md
    for png in ("speedup.png", "loss.png"):
        data = open(os.path.join(out, png), "rb").read()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000, png
    print("report.py: ok")


if __name__ == "__main__":
    main()
