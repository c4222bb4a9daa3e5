#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole CPU test suite.
# GPU checks live in tests/gpu/ and bench/ and run on a machine with a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
# The fuzz targets (clang, their own build directory), so that ctest's
# FuzzTest spends its time fuzzing rather than building.
scripts/fuzz.sh --build-only
build=${KFORGE_BUILD_DIR:-build}
ctest --test-dir "$build" --output-on-failure -j"$(nproc)"
