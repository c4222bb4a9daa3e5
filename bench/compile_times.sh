#!/usr/bin/env bash
# Cold compile time of every preset module, one `kforge compile` at a time
# (no cache is involved: compile always runs NVRTC): both presets x TP
# 1/2/4/8 x bf16 / fp8_ds_mla x sm_90a / sm_120a, plus each preset's DSA
# indexer module on both archs (36 modules). Prints a markdown table (one
# row a module, the seconds `kforge compile` reports for it) with the
# median and the max, and writes it to OUT_TABLE when given. Run it on an
# idle machine: a timing is never a test assertion (BENCH.md keeps them).
#
#   bench/compile_times.sh KFORGE_BINARY [OUT_TABLE]
#
# Environment: COMPILE_TIMES_ARCHS (default "sm_90a sm_120a"),
# COMPILE_TIMES_TPS (default "1 2 4 8").
set -euo pipefail
KFORGE=${1:?usage: compile_times.sh KFORGE_BINARY [OUT_TABLE]}
OUT_TABLE=${2:-}
ARCHS=${COMPILE_TIMES_ARCHS:-sm_90a sm_120a}
TPS=${COMPILE_TIMES_TPS:-1 2 4 8}
[[ -x $KFORGE ]] || { echo "compile_times.sh: $KFORGE is not an executable" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rows=$tmp/rows
: >"$rows"
# One module: the seconds the CLI prints last on its line ("... 1.20 s").
compile() {
  local label=$1; shift
  local line
  if ! line=$("$KFORGE" compile "$@" -o "$tmp/out" 2>&1 | tail -n 1); then
    echo "compile_times.sh: $label failed: $line" >&2
    exit 1
  fi
  local seconds
  seconds=$(awk '{print $(NF-1)}' <<<"$line")
  printf '%s\t%s\n' "$label" "$seconds" >>"$rows"
  printf '%-44s %6s s\n' "$label" "$seconds" >&2
}
for preset in deepseek-v3.2 glm-5; do
  for arch in $ARCHS; do
    for tp in $TPS; do
      for kv in bf16 fp8_ds_mla; do
        compile "$preset tp$tp $kv $arch" --preset "$preset" --tp "$tp" --kv-dtype "$kv" --arch "$arch"
      done
    done
    compile "$preset dsa-indexer $arch" --preset "$preset" --kind dsa-indexer --arch "$arch"
  done
done
{
  echo "| module | seconds |"
  echo "|---|---:|"
  awk -F'\t' '{printf "| %s | %.2f |\n", $1, $2}' "$rows"
  sort -t$'\t' -k2 -g "$rows" | awk -F'\t' '{t[NR] = $2} END {
    m = (NR % 2) ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2
    printf "\n%d modules: median %.2f s, max %.2f s, sum %.1f s\n", NR, m, t[NR], s }
    { s += $2 }'
} | tee "${OUT_TABLE:-/dev/null}"
