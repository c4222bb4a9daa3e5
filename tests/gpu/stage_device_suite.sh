#!/usr/bin/env bash
# Stages here (no GPU needed) everything tests/gpu/run_device_suite.sh runs
# over: the check modules, the bench modules (bf16 and fp8_ds_mla), the DSA
# indexer modules, the binaries and the Python package's native library;
# then packs them into DIR/pack.tgz. Unpacked they are over the device
# tool's 64 MiB carry limit (a module's cubin images add up to ~25% more
# than one image did: about 66 MB at 34e7538); packed, about 22 MB.
#
#   tests/gpu/stage_device_suite.sh [BUILD_DIR] [DIR]     (default build, .gpu)
#
# then carry DIR/pack.tgz, python/kforge/v1 and python/kforge/_version.py
# and run, on the GPU machine, tests/gpu/run_device_suite.sh DIR (it
# unpacks the tarball first).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
dir=${2:-.gpu}
kforge=$build/cli/kforge
rm -rf "${dir:?}/check" "$dir/bench" "$dir/bench8" "$dir/ix" "$dir/stage" "$dir/pack.tgz"
mkdir -p "$dir"
tests/gpu/compile_check_modules.sh "$kforge" "$dir/check"
bench/compile_bench_modules.sh "$kforge" "$dir/bench" sm_90a bf16
bench/compile_bench_modules.sh "$kforge" "$dir/bench8" sm_90a fp8_ds_mla
bench/compile_indexer_modules.sh "$kforge" "$dir/ix"
tests/gpu/stage_binaries.sh "$dir/stage" "$kforge" "$build/examples/kforge_decode_example" \
  "$build/tests/cuda_runtime_test" "$build/tests/dsa_indexer_runtime_test"
tests/gpu/stage_binaries.sh --beside "$dir/stage/capi" "$build/capi/libkforge_capi.so"
tar -C "$dir" -czf "$dir/pack.tgz" check bench bench8 ix stage
ls -l "$dir/pack.tgz"
