#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole CPU test suite.
# GPU checks live in tests/gpu/ and bench/ and run on a machine with a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
build=${KFORGE_BUILD_DIR:-build}
ctest --test-dir "$build" --output-on-failure -j"$(nproc)"
