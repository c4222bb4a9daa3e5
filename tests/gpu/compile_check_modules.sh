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
# fmt: empty (bf16), a KV_SCALE_FORMAT_* (fp8_ds_mla with those scales) or
# another KV_CACHE_DTYPE_* (a record with scales of its own).
write_spec() {  # heads topk scale lse page [fmt rope kv_lora_rank]
  local fmt=${6:-} rope=${7:-64} rank=${8:-512}
  local f="$specs/h$1_k$2_sc$3_$4_p$5_${fmt:-bf16}_r${rope}_l$rank.json"
  local dtype='"kv_cache_dtype": "KV_CACHE_DTYPE_BF16"'
  case "$fmt" in
    KV_SCALE_FORMAT_*) dtype='"kv_cache_dtype": "KV_CACHE_DTYPE_FP8_DS_MLA", "kv_scale_format": "'$fmt'"' ;;
    KV_CACHE_DTYPE_*) dtype='"kv_cache_dtype": "'$fmt'"' ;;
  esac
  cat >"$f" <<JSON
{"num_q_heads": $1, "kv_lora_rank": $rank,
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
# The issue-15 records: DeepSeek-V4 (584 B, page-blocked, d_qk 512), V4.1
# (528 B, page-blocked) and nvfp4 (352 B, V3.2 geometry), on sm_90a (wgmma
# at 64 heads) and on the 99 KB pipeline, 64 heads x topk 1152 included
# (DeepSeek-V4.1's shape on sm_120), pages of 64 and of 16 tokens.
for fmt in KV_CACHE_DTYPE_FP8_DS_MLA_V4:0 KV_CACHE_DTYPE_MXFP8_DS_MLA_V41:0 KV_CACHE_DTYPE_NVFP4_DS_MLA:64; do
  rope=${fmt##*:}; fmt=${fmt%%:*}
  for h in 1 16 64 128; do
    for k in 63 2048; do
      jobs+=("$(write_spec $h $k 0.135234 true 64 $fmt $rope) sm_90a 0")
    done
  done
  jobs+=("$(write_spec 64 1152 0.0625 true 64 $fmt $rope) sm_90a 101376")
  jobs+=("$(write_spec 8 63 0.0625 false 16 $fmt $rope) sm_90a 101376")
  # Crossover pairs of two short head groups (50 of 64 rows), pages of 16.
  jobs+=("$(write_spec 100 1152 0.0625 true 16 $fmt $rope) sm_90a 0")
done
# Other latent widths (bf16): the combine's column slices (CombineSlices:
# 256 -> 4 slices, 448 -> 1 slice of 7 pairs, 384 -> 2) and the small-batch
# kernel beside a 64-head tile.
jobs+=("$(write_spec 64 2048 0.0625 true 64 "" 64 256) sm_90a 0")
jobs+=("$(write_spec 16 1152 0.0625 true 64 "" 64 448) sm_90a 0")
jobs+=("$(write_spec 128 2048 0.0625 true 64 "" 0 384) sm_90a 0")
# The extra KV cache (spec extra_kv, issue 15): a second cache of its own
# format, page size and top-k in the same softmax. DeepSeek-V4's shape (V4
# records in both, 64 heads, topk 512 + 128) on sm_90a (wgmma) and the
# 99 KB pipeline; mixed formats (an fp8_ds_mla cache beside a bf16 one,
# whose rows then go through the staging buffer, and nvfp4 beside
# fp8_ds_mla), odd top-k values that leave a partial tile before the extra
# list, pages of 16; both bf16 (the direct pipeline) at 128 heads.
write_extra_spec() {  # name heads topk main-dtype-json rope extra-json
  local f="$specs/x_$1.json"
  cat >"$f" <<JSON
{"num_q_heads": $2, "kv_lora_rank": 512,
 "rope_dim": $5, "topk": $3, $4, "page_block_size": 64, "softmax_scale": 0.0441941738,
 "return_lse": true, "extra_kv": {$6}}
JSON
  echo "$f"
}
v4='"kv_cache_dtype": "KV_CACHE_DTYPE_FP8_DS_MLA_V4"'
jobs+=("$(write_extra_spec v4_64 64 512 "$v4" 0 "$v4, \"topk\": 128, \"page_block_size\": 64") sm_90a 0")
jobs+=("$(write_extra_spec v4_64s 64 512 "$v4" 0 "$v4, \"topk\": 128, \"page_block_size\": 64") sm_90a 101376")
jobs+=("$(write_extra_spec v4_16 16 1000 "$v4" 0 "$v4, \"topk\": 72, \"page_block_size\": 16") sm_90a 0")
fp8='"kv_cache_dtype": "KV_CACHE_DTYPE_FP8_DS_MLA", "kv_scale_format": "KV_SCALE_FORMAT_ARBITRARY"'
bf16='"kv_cache_dtype": "KV_CACHE_DTYPE_BF16"'
jobs+=("$(write_extra_spec fp8_bf16 16 1000 "$fp8" 64 "$bf16, \"topk\": 100, \"page_block_size\": 16") sm_90a 0")
jobs+=("$(write_extra_spec bf16_fp8 64 2048 "$bf16" 64 "$fp8, \"topk\": 63, \"page_block_size\": 64") sm_90a 101376")
jobs+=("$(write_extra_spec nvfp4_fp8 8 63 '"kv_cache_dtype": "KV_CACHE_DTYPE_NVFP4_DS_MLA"' 64 "$fp8, \"topk\": 256, \"page_block_size\": 64") sm_90a 0")
jobs+=("$(write_extra_spec bf16_bf16 128 2048 "$bf16" 64 "$bf16, \"topk\": 64, \"page_block_size\": 64") sm_90a 0")
# NVRTC is thread-safe but each compile is single-threaded: one per core.
printf '%s\n' "${jobs[@]}" | xargs -P "$(nproc)" -L 1 bash -c '
  extra=(); [ "$3" != 0 ] && extra=(--max-smem-per-block "$3") || true
  "$0" compile --spec "$1" --arch "$2" "${extra[@]}" -o '"$out"' >/dev/null' "$kforge"
ls "$out"/*.json | wc -l
