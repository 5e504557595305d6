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
#   --help    this text
#   Other arguments go to kiln-bench (e.g. --threads N, --filter TEXT; see kiln-bench --help).
#   An argument kiln-bench rejects ends the demo after the build with its message, exit 2.
set -euo pipefail
cd "$(dirname "$0")/.."

out=report
suites="tutorial digits transformer embedding fusion compile-overhead compile-time eager-ops"
bench_args=()
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --out|--suites)
      if [ $# -lt 2 ] || [ -z "$2" ] || [ "${2#--}" != "$2" ]; then
        echo "demo: $1 needs a value (scripts/demo.sh --help)" >&2
        exit 2
      fi
      if [ "$1" = --out ]; then out="$2"; else suites="$2"; fi
      shift 2 ;;
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
rm -f "$out/results.json"  # a failed run must not report an earlier one's figures
set +e
# shellcheck disable=SC2086
"$build/benchmarks/kiln-bench" $suites --json "$out/results.json" "${bench_args[@]}" \
  | tee "$out/kiln-bench.txt"
bench_status=${PIPESTATUS[0]}
set -e
if [ "$bench_status" -eq 2 ] || [ ! -s "$out/results.json" ]; then
  # 2: kiln-bench rejected its arguments (its message is above; `--help` lists them)
  echo "demo: kiln-bench exited with $bench_status and wrote no results; no report" >&2
  exit "$(( bench_status == 0 ? 1 : bench_status ))"
fi

stage 4 "report"
/usr/bin/python3 scripts/report.py "$out/results.json" "$out"
echo
sed -n '/^## /,$p' "$out/report.md" | grep -v '^!\[' || true
echo
echo "demo: done in $(( $(date +%s) - start )) s; report in $out/ (report.md, results.json, kiln-bench.txt, *.png)"
exit "$bench_status"
