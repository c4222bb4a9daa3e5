#!/usr/bin/env bash
# Runs on the GPU machine: correctness check, then the benchmark, over
# modules compiled beforehand (see compile_check_modules.sh and
# bench/compile_bench_modules.sh). Writes logs and tables under $OUT.
# The Python package needs its native library staged for that machine
# (tests/gpu/stage_binaries.sh --beside CAPI_DIR build/capi/libkforge_capi.so).
# usage: run_on_device.sh CHECK_DIR BENCH_DIR [CAPI_DIR]
set -uo pipefail
if [ -n "${3:-}" ]; then
  KFORGE_CAPI_LIB=$(cd "$3" && pwd)
  export KFORGE_CAPI_LIB
fi
out=${OUT:-/tmp/kforge-gpu}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
export PYTHONUNBUFFERED=1
rc=0
if [ -d "$1" ]; then
  python3 tests/gpu/check_sparse_mla.py "$1" --json-out "$out/check.json" 2>&1 | tee "$out/check.log" || rc=1
fi
if [ -d "$2" ]; then
  python3 bench/bench_sparse_mla.py "$2" --out "$out/bench.md" 2>&1 | tee "$out/bench.log" || rc=1
fi
exit $rc
