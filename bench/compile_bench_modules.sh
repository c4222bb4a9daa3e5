#!/usr/bin/env bash
# Compiles the modules bench/bench_sparse_mla.py times: deepseek-v3.2 at TP 1
# and 8 (128 and 16 heads), glm-5 at TP 1 and 8 (64 and 8 heads), topk 2048
# (the V4 records: the same heads with rope_dim 0).
# usage: compile_bench_modules.sh KFORGE_BINARY OUT_DIR [ARCH] [KV_DTYPE] [MAX_SMEM]
# MAX_SMEM (bytes per block, e.g. 101376) times the 99 KB (sm_86/89/120/121)
# tiling on the H200.
set -euo pipefail
kforge=$1
out=$2
arch=${3:-sm_90a}
dtype=${4:-bf16}
smem=${5:+--max-smem-per-block $5}
case "$dtype" in
  fp8_ds_mla_v4 | mxfp8_ds_mla_v41)
    # DeepSeek-V4's geometry (d_qk = d_v = 512: the record's last 64 columns
    # are its rope): the presets' heads and scales with rope_dim 0.
    specs=$(mktemp -d)
    trap 'rm -rf "$specs"' EXIT
    enum=KV_CACHE_DTYPE_$(echo "$dtype" | tr a-z A-Z)
    for hs in 128:0.135234 16:0.135234 64:0.0625 8:0.0625; do
      cat >"$specs/h${hs%%:*}.json" <<JSON
{"num_q_heads": ${hs%%:*}, "kv_lora_rank": 512,
 "rope_dim": 0, "topk": 2048, "kv_cache_dtype": "$enum", "page_block_size": 64,
 "softmax_scale": ${hs##*:}, "return_lse": true}
JSON
    done
    ls "$specs"/*.json | xargs -P "$(nproc)" -I{} bash -c '"$0" compile --spec {} --arch '"$arch"' '"$smem"' -o '"$out" "$kforge"
    ;;
  *)
    printf '%s\n' "deepseek-v3.2 1" "deepseek-v3.2 8" "glm-5 1" "glm-5 8" |
      xargs -P "$(nproc)" -L 1 bash -c '"$0" compile --preset "$1" --tp "$2" --arch '"$arch"' --kv-dtype '"$dtype"' '"$smem"' -o '"$out" "$kforge"
    ;;
esac
