#!/usr/bin/env bash
# Packs the device check's programs from a build folder, with the shared libraries they load
# (LLVM, MLIR, fmt and their own dependencies; not the C and C++ runtimes), for a GPU machine
# that has no LLVM/MLIR 22 and cannot install them (no network).
#
# Usage: benchmarks/gpu/pack_build.sh [BUILD] [DIR]
#   BUILD  a Release build made with -DKILN_NATIVE=OFF, so that its code runs on any x86-64
#          (default build-gpu)
#   DIR    where the archives go (default BUILD-bundle): programs.tar.xz, remade each time, and
#          libs.tar.xz, made only when absent (the libraries change only with the system's).
# On the GPU machine:
#   mkdir K && for a in DIR/*.tar.xz; do tar xJf $a -C K; done
#   LD_LIBRARY_PATH=K/lib BUILD=K benchmarks/gpu/run_device_check.sh --no-build
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-gpu}
DIR=${2:-$BUILD-bundle}
PROGRAMS=(tests/test_cuda tests/test_codegen tests/test_tracer benchmarks/kiln-bench)
# The system's own libraries: the GPU machine has these (its newer versions are compatible).
SYSTEM='^(linux-vdso|ld-linux|libc\.|libm\.|libmvec|libstdc\+\+|libgcc_s|libdl|libpthread|librt)'

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/programs/tests" "$stage/programs/benchmarks" "$stage/libs/lib" "$DIR"
for p in "${PROGRAMS[@]}"; do
  [ -x "$BUILD/$p" ] || { echo "missing $BUILD/$p: build it first" >&2; exit 1; }
  if ldd "$BUILD/$p" | grep -q 'not found'; then echo "unresolved libraries in $p" >&2; exit 1; fi
  strip --strip-debug -o "$stage/programs/$p" "$BUILD/$p"
  ldd "$BUILD/$p" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $SYSTEM ]] || cp -L "$path" "$stage/libs/lib/$name"
  done
done
tar -C "$stage/programs" -cf - . | xz -6 -T0 > "$DIR/programs.tar.xz"
if [ ! -f "$DIR/libs.tar.xz" ]; then
  tar -C "$stage/libs" -cf - . | xz -9 -T0 > "$DIR/libs.tar.xz"
fi
du -m "$DIR"/*.tar.xz
