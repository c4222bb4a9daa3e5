#!/usr/bin/env bash
# Compiles the modules tests/gpu/check_sparse_mla.py runs on an H200:
#   heads {1, 8, 16, 64, 128} x topk {1, 63, 2048, 2049} for sm_90a (each
#   module serves every s_q; the check runs s_q 1 and 2), plus the 99 KB (sm_86/89/120/121) pipeline compiled for sm_90a
#   with --max-smem-per-block 101376, so the same template logic that ships
#   for sm_120 is checked on a real GPU.
# usage: compile_check_modules.sh KFORGE_BINARY OUT_DIR
set -euo pipefail
kforge=$1
out=$2
mkdir -p "$out"
specs=$(mktemp -d)
trap 'rm -rf "$specs"' EXIT
jobs=()
write_spec() {  # heads topk scale lse page [scale_format rope kv_lora_rank] (a format: fp8_ds_mla)
  local fmt=${6:-} rope=${7:-64} rank=${8:-512}
  local f="$specs/h$1_k$2_sc$3_$4_p$5_${fmt:-bf16}_r${rope}_l$rank.json"
  local dtype='"kv_cache_dtype": "KV_CACHE_DTYPE_BF16"'
  [ -n "$fmt" ] && dtype='"kv_cache_dtype": "KV_CACHE_DTYPE_FP8_DS_MLA", "kv_scale_format": "'$fmt'"'
  cat >"$f" <<JSON
{"kind": "ATTENTION_KIND_SPARSE_MLA_DECODE", "num_q_heads": $1, "kv_lora_rank": $rank,
 "rope_dim": $rope, "topk": $2, $dtype,
 "page_block_size": $5, "softmax_scale": $3, "return_lse": $4}
JSON
  echo "$f"
}
for h in 1 8 16 64 128; do
  for k in 1 63 2048 2049; do
    jobs+=("$(write_spec $h $k 0.135234 true 64) sm_90a 0")
  done
done
for h in 8 24 64 128; do
  jobs+=("$(write_spec $h 2048 0.0625 true 64) sm_90a 101376")
  jobs+=("$(write_spec $h 63 0.0625 false 16) sm_90a 101376")
done
# fp8_ds_mla (656-byte records, 528 with no rope), both scale conventions,
# on sm_90a and on the 99 KB pipeline.
for h in 1 8 64 128; do
  for k in 63 2048; do
    jobs+=("$(write_spec $h $k 0.135234 true 64 KV_SCALE_FORMAT_POW2) sm_90a 0")
  done
done
for h in 16 64; do
  jobs+=("$(write_spec $h 2048 0.0625 true 64 KV_SCALE_FORMAT_ARBITRARY) sm_90a 0")
done
# Two short head groups (50 of 64 rows) on the wgmma pipeline.
jobs+=("$(write_spec 100 2048 0.0625 true 64 KV_SCALE_FORMAT_ARBITRARY) sm_90a 0")
jobs+=("$(write_spec 16 2049 0.0625 true 64 KV_SCALE_FORMAT_ARBITRARY 0) sm_90a 0")
for h in 8 64 128; do
  jobs+=("$(write_spec $h 2048 0.0625 true 64 KV_SCALE_FORMAT_ARBITRARY) sm_90a 101376")
done
jobs+=("$(write_spec 24 63 0.0625 false 16 KV_SCALE_FORMAT_POW2) sm_90a 101376")
# Other latent widths (bf16): the combine's column slices (CombineSlices:
# 256 -> 4 slices, 448 -> 1 slice of 7 pairs, 384 -> 2) and the small-batch
# kernel beside a 64-head tile.
jobs+=("$(write_spec 64 2048 0.0625 true 64 "" 64 256) sm_90a 0")
jobs+=("$(write_spec 16 1152 0.0625 true 64 "" 64 448) sm_90a 0")
jobs+=("$(write_spec 128 2048 0.0625 true 64 "" 0 384) sm_90a 0")
# NVRTC is thread-safe but each compile is single-threaded: one per core.
printf '%s\n' "${jobs[@]}" | xargs -P "$(nproc)" -L 1 bash -c '
  extra=(); [ "$3" != 0 ] && extra=(--max-smem-per-block "$3") || true
  "$0" compile --spec "$1" --arch "$2" "${extra[@]}" -o '"$out"' >/dev/null' "$kforge"
ls "$out"/*.cubin | wc -l
