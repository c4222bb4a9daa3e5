#!/usr/bin/env bash
# Installs dependencies and builds kforge into ${KFORGE_BUILD_DIR:-build}.
# KFORGE_BUILD_TARGETS="kforge ..." builds only those targets (what the
# container image needs); unset, everything is built.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
build=${KFORGE_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKFORGE_CUDA_ROOT="${KFORGE_CUDA_ROOT:-/usr/local/cuda}" >/dev/null
targets=()
for t in ${KFORGE_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j"$(nproc)" "${targets[@]}"
