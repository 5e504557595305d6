#!/usr/bin/env bash
# The CUDA device check (issue 7): run on a machine with an NVIDIA GPU (an H200 is the target).
# Builds kiln (Release; CUDA support is always compiled in: the driver and cuBLAS are loaded at
# run time), runs the GPU tests, times the GPU path and prints a short table last.
#
# Usage: benchmarks/gpu/run_device_check.sh [--quick]
#   BUILD=dir    build folder (default build-gpu)
#   OUT=dir      where the JSON records and the log go (default $OUT if set, else report/gpu)
#   KILN_CUDA_ARCH is not needed: sm_90 is the default target (codegen::GpuTarget).
# Exit status: 0 when the tests passed and every case ran (or was skipped), 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/../.."
QUICK=""
[ "${1:-}" = "--quick" ] && QUICK="--quick"
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-report/gpu}
mkdir -p "$OUT"
LOG="$OUT/device_check.log"
: > "$LOG"
status=0
step() { echo "== $* ($(date +%T))" | tee -a "$LOG"; }

step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$LOG" || true

step "build (Release)"
if ! command -v clang++-22 > /dev/null || ! command -v mlir-opt-22 > /dev/null; then
  bash scripts/setup.sh 2>&1 | tail -3 | tee -a "$LOG"
fi
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >> "$LOG" 2>&1 &&
  ninja -C "$BUILD" test_cuda test_codegen test_tracer kiln-bench >> "$LOG" 2>&1 || {
  echo "build failed; see $LOG" | tee -a "$LOG"
  tail -30 "$LOG"
  exit 1
}

step "GPU tests"
tests=("$BUILD/tests/test_cuda" "$BUILD/tests/test_codegen gpu*" "$BUILD/tests/test_tracer [cuda]")
for t in "${tests[@]}"; do
  # shellcheck disable=SC2086
  if timeout 600 $t >> "$LOG" 2>&1; then echo "passed: $t" | tee -a "$LOG"
  else echo "FAILED: $t" | tee -a "$LOG"; status=1; fi
done

step "timings: gpu suite"
"$BUILD/benchmarks/kiln-bench" gpu $QUICK --json "$OUT/gpu.json" 2>&1 | tee -a "$LOG" || status=1

step "timings: Transformer training step at its original size on the GPU"
KILN_BENCH_DEVICE=cuda "$BUILD/benchmarks/kiln-bench" transformer --full $QUICK \
  --json "$OUT/transformer.json" 2>&1 | tee -a "$LOG" || status=1

step "table"
python3 - "$OUT/gpu.json" "$OUT/transformer.json" <<'PY' | tee -a "$LOG"
import json, sys
rows = []
for path in sys.argv[1:]:
    try:
        rows += json.load(open(path))
    except Exception as e:
        print(f"(no records in {path}: {e})")
copy = next((r["value"] for r in rows if r.get("case") == "d2d_copy_1GiB" and r.get("status") == "ok"), None)
print(f"{'case':<22} {'mode':<10} {'value':>10} {'unit':<10} {'% of copy':>9}")
for r in rows:
    if r.get("status") != "ok":
        print(f"{r.get('case',''):<22} {r.get('mode',''):<10} {r.get('status','')}: {(r.get('error') or '')[:60]}")
        continue
    pct = f"{100 * r['value'] / copy:.1f}" if copy and r.get("unit") == "GB/s" and r.get("case") != "d2d_copy_1GiB" else ""
    print(f"{r['case']:<22} {r['mode']:<10} {r['value']:>10.1f} {r['unit']:<10} {pct:>9}")
e = next((r["value"] for r in rows if r.get("case") == "transformer_step" and r.get("mode") == "eager" and r.get("status") == "ok"), None)
c = next((r["value"] for r in rows if r.get("case") == "transformer_step" and r.get("mode") == "compiled" and r.get("status") == "ok"), None)
if e and c:
    print(f"transformer step compiled / eager: {c / e:.2f}x (target >= 1.3x)")
PY
exit $status
