#!/usr/bin/env bash
# Regenerates the binary seeds of fuzz/corpus/ (bundle, cubin, disk_cache,
# cache_entry, request, answer) from one real kernel: glm-5 at TP 8, bf16, sm_90a, compiled by
# `kforge prebuild` into a one-kernel bundle. Run after a change to a format
# those seeds hold (bundle layout, artifact, disk entry, request).
#
#   fuzz/make_seeds.sh [KFORGE_BINARY]   (default build/cli/kforge)
set -euo pipefail
cd "$(dirname "$0")/.."
kforge=${1:-build/cli/kforge}
build=${KFORGE_FUZZ_BUILD_DIR:-build-fuzz}
scripts/fuzz.sh --build-only
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/matrix.json" <<'JSON'
{"models": [{"preset": "glm-5", "tp": [8], "kv_dtypes": ["bf16"]}], "archs": ["sm_90a"]}
JSON
"$kforge" prebuild "$work/matrix.json" --out "$work/bundle" -j 1
rm -f fuzz/corpus/{bundle,cubin,disk_cache,cache_entry,request,answer}/seed_*
"$build/fuzz/kforge_fuzz_make_seeds" "$work/bundle" fuzz/corpus
