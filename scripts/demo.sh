#!/usr/bin/env bash
# kiln's main job: sets up, builds (Release), then runs kiln-bench's reference workloads eager
# and compiled — tutorial programs, the digits MLP on real data, the Transformer training step,
# an embedding classifier's step, fusion, compile time and call overhead, eager ops — prints a
# summary table and writes a report (report.md, results.json, speedup.png, loss.png) to report/
# (or --out DIR).
#
# Usage: scripts/demo.sh [--quick] [--full] [--out DIR] [--suites "s1 s2 ..."]
#   --quick   fewer repetitions / epochs (about 25 s after the build, against 40-60 s)
#   --full    the Transformer at its original sizes (d_model 768, 12 layers, batch 32, seq 512)
#   Other arguments go to kiln-bench (e.g. --threads N, --filter TEXT).
set -euo pipefail
cd "$(dirname "$0")/.."

out=report
suites="tutorial digits transformer embedding fusion compile-overhead compile-time eager-ops"
bench_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --suites) suites="$2"; shift 2 ;;
    *) bench_args+=("$1"); shift ;;
  esac
done

start=$(date +%s)
stage() { echo; echo "== [$1/4] $2 ($(( $(date +%s) - start )) s elapsed)"; }

stage 1 "set-up (scripts/setup.sh)"
bash scripts/setup.sh

stage 2 "build (Release, ninja)"
build=${KILN_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$build" -j "$(nproc)" --target kiln-bench

stage 3 "benchmarks: $suites"
mkdir -p "$out"
set +e
# shellcheck disable=SC2086
"$build/benchmarks/kiln-bench" $suites --json "$out/results.json" "${bench_args[@]}" \
  | tee "$out/kiln-bench.txt"
bench_status=${PIPESTATUS[0]}
set -e

stage 4 "report"
/usr/bin/python3 scripts/report.py "$out/results.json" "$out"
echo
sed -n '/^## /,$p' "$out/report.md" | grep -v '^!\[' || true
echo
echo "demo: done in $(( $(date +%s) - start )) s; report in $out/ (report.md, results.json, kiln-bench.txt, *.png)"
exit "$bench_status"
