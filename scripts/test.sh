#!/usr/bin/env bash
# Sets up (if needed), configures, builds and runs kiln's whole test suite. Non-zero on failure.
# Usage: scripts/test.sh            (build dir: build/, override with KILN_BUILD_DIR)
#
# Three stages (CI runs all):
#  1. the normal Release build and every ctest test;
#  2. the sanitizer stage: a second build dir ($KILN_BUILD_DIR-asan) with
#     -DKILN_SANITIZE=address,undefined (ASan + UBSan + LeakSanitizer) at -O1 and
#     -DKILN_NATIVE=OFF (plain x86-64: the portable code paths that stage 1's -march=native build
#     skips; randn was wrong only there), building only the test executables (no
#     benchmarks/examples) and running them (tests/README.md, "Sanitizers");
#  3. the ThreadSanitizer stage: $KILN_BUILD_DIR-tsan with -DKILN_SANITIZE=thread, test_tracer
#     and test_eager, running the threaded compile() tests (ctest tracer_tsan: 8 threads x 1,000
#     calls) and the thread pool's tests (ctest eager_tsan).
# KILN_SKIP_SANITIZERS=1 skips stages 2 and 3 (fast local runs). KILN_SANITIZER_TESTS (a space
# list of core eager nn ir codegen tracer cuda) picks stage 2's tests; the default is all of them,
# the JIT tests (codegen, tracer) included (tests/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build=${KILN_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"

if [[ "${KILN_SKIP_SANITIZERS:-0}" == 1 ]]; then
  echo "test.sh: sanitizer stage skipped (KILN_SKIP_SANITIZERS=1)"
  exit 0
fi
asan=${KILN_ASAN_BUILD_DIR:-$build-asan}
tests=(${KILN_SANITIZER_TESTS:-core eager nn ir codegen tracer cuda})
start=$SECONDS
cmake -S . -B "$asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1" \
  -DKILN_SANITIZE=address,undefined -DKILN_NATIVE=OFF >/dev/null
cmake --build "$asan" -j "$(nproc)" --target "${tests[@]/#/test_}"
built=$SECONDS
regex="^($(IFS='|'; echo "${tests[*]}"))\$"
ctest --test-dir "$asan" --output-on-failure -j "$(nproc)" -R "$regex"
echo "test.sh: sanitizer stage: build $((built - start)) s, tests $((SECONDS - built)) s"

tsan=${KILN_TSAN_BUILD_DIR:-$build-tsan}
start=$SECONDS
cmake -S . -B "$tsan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1" \
  -DKILN_SANITIZE=thread >/dev/null
cmake --build "$tsan" -j "$(nproc)" --target test_tracer test_eager
built=$SECONDS
ctest --test-dir "$tsan" --output-on-failure -R '^(tracer|eager)_tsan$'
echo "test.sh: ThreadSanitizer stage: build $((built - start)) s, tests $((SECONDS - built)) s"
