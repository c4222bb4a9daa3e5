#!/usr/bin/env bash
# Compiles the modules bench/bench_sparse_mla.py times: deepseek-v3.2 at TP 1
# and 8 (128 and 16 heads), glm-5 at TP 1 and 8 (64 and 8 heads), topk 2048.
# usage: compile_bench_modules.sh KFORGE_BINARY OUT_DIR [ARCH] [KV_DTYPE] [MAX_SMEM]
# MAX_SMEM (bytes per block, e.g. 101376) times the 99 KB (sm_86/89/120/121)
# tiling on the H200.
set -euo pipefail
kforge=$1
out=$2
arch=${3:-sm_90a}
dtype=${4:-bf16}
smem=${5:+--max-smem-per-block $5}
printf '%s\n' "deepseek-v3.2 1" "deepseek-v3.2 8" "glm-5 1" "glm-5 8" |
  xargs -P "$(nproc)" -L 1 bash -c '"$0" compile --preset "$1" --tp "$2" --arch '"$arch"' --kv-dtype '"$dtype"' '"$smem"' -o '"$out" "$kforge"
