#!/usr/bin/env bash
# The indexer's e4m3 mma.sync logits path (sm_89 / sm_120a / sm_121a) on the
# H200: builds tests/gpu/indexer_fp8_mma_unit.cu with nvcc for sm_90a beside
# the JSON of the same module compiled by kforge, then runs the GPU check.
# usage: check_indexer_fp8_mma.sh KFORGE_BINARY [SEED]   (on the GPU machine)
set -euo pipefail
kforge=$1
seed=${2:-5}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$kforge" compile --preset glm-5 --kind dsa-indexer --arch sm_90a -o "$dir" >/dev/null
name=dsa_indexer_h32_d128_topk2048_pb64_sm90a
nvcc -cubin -arch=sm_90a -std=c++17 -I templates -o "$dir/$name.cubin" \
  tests/gpu/indexer_fp8_mma_unit.cu
python3 tests/gpu/check_dsa_indexer.py "$dir" --seed "$seed"
