#!/usr/bin/env bash
# One device call for a kernel change: the benchmark (bf16 and fp8_ds_mla),
# the GPU correctness checks (sparse MLA over every format, the DSA indexer,
# the runtimes' GPU tests), the KV conversion's exhaustive unit
# (tests/gpu/kv_convert_unit.cu), the runtime end to end (no prebuild
# benchmark) and the C++ Run host time, over what was built and staged here
# by tests/gpu/stage_device_suite.sh (modules and binaries, packed into
# DIR/pack.tgz); then, on the GPU machine (carry DIR/pack.tgz,
# python/kforge/v1, python/kforge/_version.py):
#   tests/gpu/run_device_suite.sh [DIR] [PART]   (default .gpu, all)
# Tables and logs under $OUT (at most six files, the device tool's limit is
# eight); the e2e scratch stays in /tmp/e2e. The whole suite can run past
# one device call's ten minutes; PART picks half of it for one call each:
#   tests/gpu/run_device_suite.sh DIR check   (the GPU checks and units)
#   tests/gpu/run_device_suite.sh DIR bench   (the benchmark, the e2e, host time)
set -o pipefail
dir=${1:-.gpu}
part=${2:-all}
case $part in all | check | bench) ;; *) echo "run_device_suite.sh: PART is all, check or bench" >&2; exit 2 ;; esac
[ -d "$dir/check" ] || tar -C "$dir" -xzf "$dir/pack.tgz" || exit 1
out=${OUT:-/tmp/kforge-suite}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 KFORGE_CAPI_LIB=$PWD/$dir/stage/capi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
bench() {
cases=128x1,64x1,16x1,8x1,128x2,64x2,16x4,8x4,8x8,128x4,128x8,64x8,128x32,64x64,16x128,128x128
for d in bf16 fp8_ds_mla; do
  mods=$dir/bench; [ $d = fp8_ds_mla ] && mods=$dir/bench8
  timeout 150 python3 bench/bench_sparse_mla.py "$mods" --no-torch --kv-dtype $d --cases $cases \
    --out "$out/bench_$d.md" >"$out/bench_$d.log" 2>&1
  echo "bench $d rc=$?"
  cut -c1-330 "$out/bench_$d.log"
done
}
check() {
timeout 360 python3 tests/gpu/check_sparse_mla.py "$dir/check" --json-out /tmp/check.json \
  >"$out/check.log" 2>&1
echo "check rc=$?"
tail -n 1 "$out/check.log"
grep FAIL "$out/check.log" | head
timeout 120 python3 tests/gpu/check_dsa_indexer.py "$dir/ix" >"$out/indexer.log" 2>&1
echo "indexer check rc=$?"
tail -n 2 "$out/indexer.log"
# (cuda_runtime_test runs in the e2e)
LD_LIBRARY_PATH=$PWD/$dir/stage/lib timeout 120 "$dir/stage/bin/dsa_indexer_runtime_test" 2>&1 |
  tail -n 3
echo "dsa_indexer_runtime_test rc=$?"
nvcc -std=c++17 -arch=sm_90a -I templates -o /tmp/kv_convert_unit tests/gpu/kv_convert_unit.cu &&
  /tmp/kv_convert_unit
echo "kv_convert_unit rc=$?"
}
e2e() {
OUT=/tmp/e2e timeout 240 tests/gpu/run_e2e.sh "$dir/stage" --no-prebuild-bench >"$out/e2e.log" 2>&1
echo "e2e rc=$?"
grep -E '^==|passed|failed|FAILED|us/call|SparseMlaDecoder|sparse_mla_decode\(' "$out/e2e.log" |
  cut -c1-200 | tail -n 60
for a in "glm-5 --tp 8 --batch 1" "glm-5 --tp 1 --batch 1" "deepseek-v3.2 --tp 1 --batch 1" \
  "deepseek-v3.2 --tp 1 --batch 32"; do
  echo "== C++ Run host time: $a"
  # shellcheck disable=SC2086
  timeout 60 /tmp/e2e/wrap/kforge_decode_example --bundle /tmp/e2e/bundle --preset $a \
    --time-host 200 2>&1 | grep -E 'host time|PASS|FAIL'
done
}
case $part in
all) bench; check; e2e ;;
check) check ;;
bench) bench; e2e ;;
esac
