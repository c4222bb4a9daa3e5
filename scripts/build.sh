#!/usr/bin/env bash
# Installs dependencies and builds kforge into ${KFORGE_BUILD_DIR:-build}.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
build=${KFORGE_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKFORGE_CUDA_ROOT="${KFORGE_CUDA_ROOT:-/usr/local/cuda}" >/dev/null
cmake --build "$build" -j"$(nproc)"
