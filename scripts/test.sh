#!/usr/bin/env bash
# Sets up (if needed), configures, builds and runs kiln's whole test suite. Non-zero on failure.
# Usage: scripts/test.sh            (build dir: build/, override with KILN_BUILD_DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build=${KILN_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
