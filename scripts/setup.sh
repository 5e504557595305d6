#!/usr/bin/env bash
# Installs every Debian package kiln needs. Idempotent; run as root (or with sudo).
# Usage: scripts/setup.sh
set -euo pipefail

packages=(
  cmake ninja-build ccache pkg-config
  clang-22 lld-22 llvm-22-dev llvm-22-tools libmlir-22-dev mlir-22-tools
  libfmt-dev catch2 libbenchmark-dev
  libdnnl-dev      # sgemm at full speed on this CPU without environment variables
  libxsimd-dev     # portable SIMD batches with vectorised exp/log/tanh/erf
  libclang-rt-22-dev  # sanitizer runtimes for -DKILN_SANITIZE=address,undefined with clang
  g++ python3
  python3-matplotlib  # charts of the demo report (scripts/report.py)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
  exit 0
fi

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends "${missing[@]}"
echo "setup: done"
