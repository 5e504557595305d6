#!/usr/bin/env bash
# kiln's main job: sets up, builds (Release) and runs the eager demo and benchmark.
# Usage: scripts/demo.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build=${KILN_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$build" -j "$(nproc)"
"$build/examples/eager_demo"
"$build/benchmarks/kiln-bench" eager-ops "$@"
