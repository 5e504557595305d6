#!/usr/bin/env bash
# kiln's main job: sets up, builds (Release), runs the eager demo, then kiln-bench's eager-ops,
# train-eager, fusion (compiled vs eager), compile-time, compile-overhead (kiln::compile call
# overhead and trace + compile time) and digits (an MLP trained on real data, eager vs compiled
# training step) suites (arguments go to kiln-bench, e.g. --quick or --json FILE).
# Usage: scripts/demo.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build=${KILN_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$build" -j "$(nproc)"
"$build/examples/eager_demo"
"$build/benchmarks/kiln-bench" eager-ops train-eager fusion compile-time compile-overhead digits "$@"
