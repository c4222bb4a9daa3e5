#!/usr/bin/env bash
# Compiles the DSA indexer modules tests/gpu/check_dsa_indexer.py and
# bench/indexer_ab.py use: deepseek-v3.2 (64 index heads) and glm-5 TP8 (32)
# at top-k 2048, glm-5 TP8 at top-k 3 and 4096, and 8 / 20 / 128 index
# heads from spec files (top-k 2048 / 100 / 4096).
# usage: compile_indexer_modules.sh KFORGE_BINARY OUT_DIR [ARCH]
set -euo pipefail
kforge=$1
out=$2
arch=${3:-sm_90a}
mkdir -p "$out"
specs=$(mktemp -d)
trap 'rm -rf "$specs"' EXIT
run() { "$kforge" compile "$@" --arch "$arch" -o "$out" > /dev/null; }
run --preset deepseek-v3.2 --kind dsa-indexer
for k in 2048 3 4096; do run --preset glm-5 --tp 8 --topk "$k" --kind dsa-indexer; done
for hk in 8:2048 20:100 128:4096; do
  echo "{\"dsa_indexer\":{\"topk\":${hk#*:},\"page_block_size\":64,\"index_heads\":${hk%:*},\"index_head_dim\":128}}" \
    > "$specs/h${hk%:*}.json"
  run --spec "$specs/h${hk%:*}.json"
done
ls "$out"/*.json | wc -l
