#!/usr/bin/env bash
# Packs the device check's programs from a build folder, with the shared libraries they load
# (LLVM, MLIR, fmt and their own dependencies; not the C and C++ runtimes), for a GPU machine
# that has no LLVM/MLIR 22 and cannot install them (no network). The archives are about 61 MB:
# within the 64 MiB a device call carries, with the repository's 3 MB.
#
# Usage: benchmarks/gpu/pack_build.sh [BUILD] [DIR]
#   BUILD  a Release build made with -DKILN_NATIVE=OFF, so that its code runs on any x86-64
#          (default build-gpu)
#   DIR    where the archives go (default BUILD-bundle): programs.tar.xz, remade each time;
#          llvm.tar.xz and libs.tar.xz, made only when absent (they change with the system's
#          packages only, and take minutes: xz -9e with the x86 filter)
# On the GPU machine:
#   mkdir K && for a in DIR/*.tar.xz; do tar xJf $a -C K; done
#   LD_LIBRARY_PATH=K/lib:<cuBLAS folder> BUILD=K benchmarks/gpu/run_device_check.sh --no-build
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-gpu}
DIR=${2:-$BUILD-bundle}
PROGRAMS=(tests/test_cuda tests/test_codegen tests/test_tracer benchmarks/kiln-bench)
# The system's own libraries: the GPU machine has these (its newer versions are compatible).
SYSTEM='^(linux-vdso|ld-linux|libc\.|libm\.|libmvec|libstdc\+\+|libgcc_s|libdl|libpthread|librt)'
XZ=(xz --x86 --lzma2=preset=9e,dict=192MiB)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/programs/tests" "$stage/programs/benchmarks" "$stage/libs/lib" "$DIR"
for p in "${PROGRAMS[@]}"; do
  [ -x "$BUILD/$p" ] || { echo "missing $BUILD/$p: build it first" >&2; exit 1; }
  # (no `| grep -q`: under pipefail its early exit fails ldd with SIGPIPE)
  if [[ $(ldd "$BUILD/$p") == *"not found"* ]]; then
    echo "unresolved libraries in $p" >&2
    exit 1
  fi
  strip --strip-all -o "$stage/programs/$p" "$BUILD/$p"
  ldd "$BUILD/$p" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $SYSTEM ]] || cp -L "$path" "$stage/libs/lib/$name"
  done
done
# Each archive is written to a .tmp file and renamed when complete, so an interrupted run
# leaves no truncated archive that a later run would keep.
pack() {  # pack ARCHIVE TAR-ARGUMENTS...
  local archive=$1
  shift
  tar "$@" | "${XZ[@]}" > "$archive.tmp" && mv "$archive.tmp" "$archive"
}
pack "$DIR/programs.tar.xz" -C "$stage/programs" -cf - .
# The two library archives, compressed side by side on two cores.
llvm=$(cd "$stage/libs" && ls lib/libLLVM.so.*)
pid=""
if [ ! -f "$DIR/llvm.tar.xz" ]; then
  pack "$DIR/llvm.tar.xz" -C "$stage/libs" -cf - "$llvm" &
  pid=$!
fi
[ -f "$DIR/libs.tar.xz" ] || pack "$DIR/libs.tar.xz" -C "$stage/libs" --exclude="$llvm" -cf - lib
[ -z "$pid" ] || wait "$pid"
du -m "$DIR"/*.tar.xz
