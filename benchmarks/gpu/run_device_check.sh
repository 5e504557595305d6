#!/usr/bin/env bash
# The CUDA device check (issue 7): run on a machine with an NVIDIA GPU (an H200 is the target).
# Builds kiln (Release; CUDA support is always compiled in: the driver and cuBLAS are loaded at
# run time), runs the GPU tests, times the GPU path and prints a short table last.
#
# Usage: benchmarks/gpu/run_device_check.sh [--quick] [--build-only | --no-build]
#   --build-only builds and stops; --no-build runs the tests and timings on an existing build.
#                A device command is limited to 600 s: build in one command, run in the next.
#   BUILD=dir    build folder (default build-gpu)
#   OUT=dir      where the JSON records and the log go (default $OUT if set, else report/gpu)
#   STEP_TIMEOUT=s  the most seconds each test binary or timing suite may run (default 600)
#   TOTAL_TIMEOUT=s the most seconds the whole run may take (default: no limit). Each step then
#                   gets at most what is left less a reserve for the table, a step that would
#                   get under 20 s is skipped, and the table is always printed: a device call
#                   limited to 600 s still reports what ran.
#   KILN_CUDA_ARCH is not needed: sm_90 is the default target (codegen::GpuTarget).
# The machine needs the build toolchain (scripts/setup.sh installs it; that needs apt and the
# network) unless --no-build runs on a build folder made elsewhere: benchmarks/gpu/pack_build.sh
# packs one with the libraries it needs, for a machine without LLVM/MLIR 22.
# Exit status: 0 when a GPU was usable, the tests passed and every case ran; 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/../.."
QUICK="" BUILD_STEP=1 RUN_STEP=1
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK="--quick" ;;
    --build-only) RUN_STEP=0 ;;
    --no-build) BUILD_STEP=0 ;;
    *) echo "usage: $0 [--quick] [--build-only | --no-build]" >&2; exit 2 ;;
  esac
done
BUILD=${BUILD:-build-gpu}
STEP_TIMEOUT=${STEP_TIMEOUT:-600}
TOTAL_TIMEOUT=${TOTAL_TIMEOUT:-0}
[[ $TOTAL_TIMEOUT =~ ^[0-9]+$ && $STEP_TIMEOUT =~ ^[0-9]+$ ]] || {
  echo "TOTAL_TIMEOUT and STEP_TIMEOUT are whole seconds" >&2
  exit 2
}
START_SECONDS=$SECONDS
# Seconds the next step may run: STEP_TIMEOUT, or less where TOTAL_TIMEOUT leaves less (10 s kept
# for the table). Prints 0 when too little is left to start one.
budget() {
  local left
  if [ "$TOTAL_TIMEOUT" -le 0 ]; then echo "$STEP_TIMEOUT"; return; fi
  left=$((TOTAL_TIMEOUT - (SECONDS - START_SECONDS) - 10))
  if [ "$left" -lt 20 ]; then echo 0
  elif [ "$left" -lt "$STEP_TIMEOUT" ]; then echo "$left"
  else echo "$STEP_TIMEOUT"; fi
}
# Runs "$@" under timeout with budget()'s limit, or says on stdout (which every caller logs)
# that it was skipped, exit status 124.
limited() {
  local t
  t=$(budget)
  if [ "$t" -eq 0 ]; then
    echo "skipped: TOTAL_TIMEOUT=$TOTAL_TIMEOUT s leaves too little time for: $*"
    return 124
  fi
  timeout "$t" "$@"
}
OUT=${OUT:-report/gpu}
mkdir -p "$OUT"
LOG="$OUT/device_check.log"
[ "$BUILD_STEP" = 1 ] && : > "$LOG"  # --no-build adds to the build step's log
status=0
step() { echo "== $* ($(date +%T))" | tee -a "$LOG"; }

step "device"
if ! nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$LOG"
then
  echo "no usable NVIDIA GPU (nvidia-smi failed): the GPU tests skip and the timings cannot run" |
    tee -a "$LOG"
  status=1
fi
cublas_on_path() {  # in the loader's cache, or in a folder of LD_LIBRARY_PATH
  # (no `| grep -q`: under pipefail its early exit fails ldconfig with SIGPIPE)
  [[ $(ldconfig -p) == *libcublas.so* ]] && return 0
  local d lib_path=${LD_LIBRARY_PATH:-}
  for d in ${lib_path//:/ }; do compgen -G "$d/libcublas.so*" > /dev/null && return 0; done
  return 1
}
if cublas_on_path; then echo "cuBLAS: found" | tee -a "$LOG"
else echo "cuBLAS: not found (matmul on the GPU will raise)" | tee -a "$LOG"; status=1; fi

if [ "$BUILD_STEP" = 1 ]; then
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
fi
[ "$RUN_STEP" = 1 ] || exit $status

step "GPU tests"
run_test() {  # a test binary and its Catch filter, each one word (no globbing)
  local out
  if [ "$(budget)" -eq 0 ]; then limited "$@" | tee -a "$LOG"; status=1; return; fi  # skipped
  out=$(mktemp)
  if limited "$@" > "$out" 2>&1; then echo "passed: $*" | tee -a "$LOG"
  else
    echo "FAILED: $*; its output ends:" | tee -a "$LOG"; tail -40 "$out"; status=1
    # Launches are asynchronous: a kernel's fault is reported by a later op. Once more with
    # every launch waiting, so the failure names the op that caused it.
    echo "again with KILN_CUDA_LAUNCH_BLOCKING=1:" | tee -a "$LOG"
    KILN_CUDA_LAUNCH_BLOCKING=1 limited "$@" 2>&1 | tail -40 | tee -a "$LOG"
  fi
  cat "$out" >> "$LOG"
  rm -f "$out"
}
run_test "$BUILD/tests/test_cuda"
run_test "$BUILD/tests/test_codegen" "gpu*"
run_test "$BUILD/tests/test_tracer" "[cuda]"

rm -f "$OUT/gpu.json" "$OUT/transformer.json" "$OUT/transformer_tf32.json"  # no stale records
step "timings: gpu suite"
limited "$BUILD/benchmarks/kiln-bench" gpu $QUICK --json "$OUT/gpu.json" 2>&1 |
  tee -a "$LOG" || status=1

step "timings: Transformer training step at its original size on the GPU"
KILN_BENCH_DEVICE=cuda limited "$BUILD/benchmarks/kiln-bench" transformer --full \
  $QUICK --json "$OUT/transformer.json" 2>&1 | tee -a "$LOG" || status=1

# The same step with float32 matmuls on TF32 tensor cores (set_float32_matmul_precision("high"),
# what TensorFlow and JAX do by default on such GPUs): the GEMMs then no longer hide the rest.
step "timings: the same step with TF32 matmuls (--matmul-precision high)"
KILN_BENCH_DEVICE=cuda limited "$BUILD/benchmarks/kiln-bench" transformer --full \
  $QUICK --matmul-precision high --json "$OUT/transformer_tf32.json" 2>&1 | tee -a "$LOG" ||
  status=1

step "table"
records=("$OUT/gpu.json" "$OUT/transformer.json" "$OUT/transformer_tf32.json")
python3 - "${records[@]}" <<'PY' | tee -a "$LOG"
import json, sys
rows = []
for path in sys.argv[1:]:
    try:
        records = json.load(open(path))
    except Exception as e:
        print(f"(no records in {path}: {e})")
        continue
    if path.endswith("_tf32.json"):  # the TF32 run's cases get their own names
        for r in records:
            r["case"] = r.get("case", "") + "_tf32"
    rows += records
def ok(r):  # kiln-bench writes "status" only for cases that did not run
    return r.get("status", "ok") == "ok" and r.get("value") is not None
def value(case, mode=None):
    return next((r["value"] for r in rows if r.get("case") == case and ok(r)
                 and (mode is None or r.get("mode") == mode)), None)
copy = value("d2d_copy_1GiB")
print(f"{'case':<22} {'mode':<10} {'value':>10} {'unit':<10} {'% of copy':>9}")
for r in rows:
    if not ok(r):
        print(f"{r.get('case',''):<22} {r.get('mode',''):<10} {r.get('status','')}: {(r.get('error') or '')[:60]}")
        continue
    pct = f"{100 * r['value'] / copy:.1f}" if copy and r.get("unit") == "GB/s" and r.get("case") != "d2d_copy_1GiB" else ""
    print(f"{r['case']:<22} {r['mode']:<10} {r['value']:>10.1f} {r['unit']:<10} {pct:>9}")
for case, label in (("transformer_step", "float32"), ("transformer_step_tf32", "TF32")):
    e, c = value(case, "eager"), value(case, "compiled")
    if e and c:
        print(f"transformer step ({label} matmuls) compiled / eager: {c / e:.2f}x (target >= 1.3x)")
PY

# Where the step's GPU time goes, per mode: each kernel and cuBLAS GEMM timed with CUDA events
# (backends/cuda/profile.h). After the table, in its own run: the events add host time per
# launch, which would perturb the timings above.
step "profile: Transformer training step, GPU time by kernel (KILN_CUDA_PROFILE=1)"
# Diagnostic only: its failure or timeout does not fail the check.
KILN_CUDA_PROFILE=1 KILN_BENCH_DEVICE=cuda limited \
  "$BUILD/benchmarks/kiln-bench" transformer --full --quick 2>&1 |
  grep --line-buffered -v '^\[' | tee -a "$LOG" ||
  echo "(the profiled run failed or timed out; the table above stands)" | tee -a "$LOG"
exit $status
