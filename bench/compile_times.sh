#!/usr/bin/env bash
# Cold compile time of every preset module, one `kforge compile` at a time
# (no cache is involved: compile always runs NVRTC): both presets x TP
# 1/2/4/8 x bf16 / fp8_ds_mla x sm_90a / sm_120a, plus each preset's DSA
# indexer module on both archs (36 modules). Prints a markdown table, one
# row a module: the seconds `kforge compile` reports for it (NVRTC, wall),
# the whole process's wall seconds and its CPU seconds (user + sys, every
# thread: what a compile costs a loaded machine); then the median and max
# of each column and the sums. Writes the table to OUT_TABLE when given.
# Run it on an idle machine: a timing is never a test assertion (BENCH.md
# keeps them); on a shared machine read the CPU column.
#
#   bench/compile_times.sh KFORGE_BINARY [OUT_TABLE]
#
# Environment: COMPILE_TIMES_ARCHS (default "sm_90a sm_120a"),
# COMPILE_TIMES_TPS (default "1 2 4 8"), COMPILE_TIMES_ARGS (more
# `kforge compile` arguments for every module), COMPILE_TIMES_ROUNDS
# (default 1: each module compiled that many times, the lowest of each
# column kept), COMPILE_TIMES_BASE (a second binary, compiled right before
# KFORGE_BINARY for every module and round, so that both see the same
# machine: this machine's speed drifts by 10% within an hour; its table
# comes first).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
KFORGE=${1:?usage: compile_times.sh KFORGE_BINARY [OUT_TABLE]}
OUT_TABLE=${2:-}
PRESET_ARCHS=${COMPILE_TIMES_ARCHS:-sm_90a sm_120a}
PRESET_TPS=${COMPILE_TIMES_TPS:-1 2 4 8}
read -r -a EXTRA <<<"${COMPILE_TIMES_ARGS:-}"
ROUNDS=${COMPILE_TIMES_ROUNDS:-1}
BASE=${COMPILE_TIMES_BASE:-}
[[ $ROUNDS =~ ^[1-9][0-9]?$ ]] || {
  echo "compile_times.sh: COMPILE_TIMES_ROUNDS: got '$ROUNDS', supported 1 to 99" >&2
  exit 2
}
for b in "$KFORGE" ${BASE:+"$BASE"}; do
  [[ -x $b ]] || { echo "compile_times.sh: $b is not an executable" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: >"$tmp/raw.new"
: >"$tmp/raw.base"
# One module with one binary (`new` or `base`): the seconds the CLI prints
# last on its line ("... 1.20 s"), and bash's `time` of the process (real,
# user + sys).
compile_with() {
  local which=$1 binary=$2 label=$3; shift 3
  local line times
  rm -rf "$tmp/out"
  if ! times=$( { TIMEFORMAT='%R %U %S'; time "$binary" compile "$@" "${EXTRA[@]}" -o "$tmp/out" \
      >"$tmp/line" 2>&1; } 2>&1); then
    echo "compile_times.sh: $label ($binary) failed: $(tail -n 3 "$tmp/line")" >&2
    exit 1
  fi
  line=$(tail -n 1 "$tmp/line")
  local seconds real cpu
  seconds=$(awk '{print $(NF-1)}' <<<"$line")
  read -r real cpu < <(awk '{printf "%.2f %.2f\n", $1, $2 + $3}' <<<"$times")
  printf '%s\t%s\t%s\t%s\n' "$label" "$seconds" "$real" "$cpu" >>"$tmp/raw.$which"
  printf '%-4s %-44s %6s s  process %5s s  cpu %5s s\n' "$which" "$label" "$seconds" "$real" \
    "$cpu" >&2
}
# One module, every round: the base binary (if any) right before this one.
compile() {
  local r
  for ((r = 0; r < ROUNDS; ++r)); do
    [[ -n $BASE ]] && compile_with base "$BASE" "$@"
    compile_with new "$KFORGE" "$@"
  done
}
for_each_preset_module compile
# Each module's lowest of every column over the rounds, in module order.
for which in base new; do
  awk -F'\t' '!($1 in n) {order[++k] = $1; n[$1] = 1; a[$1] = $2; b[$1] = $3; c[$1] = $4; next}
    {if ($2 < a[$1]) a[$1] = $2; if ($3 < b[$1]) b[$1] = $3; if ($4 < c[$1]) c[$1] = $4}
    END {for (i = 1; i <= k; ++i) printf "%s\t%s\t%s\t%s\n", order[i], a[order[i]], b[order[i]], c[order[i]]}' \
    "$tmp/raw.$which" >"$tmp/rows.$which"
done
# The median and the max of column `col` of rows file $2.
stats() {
  sort -t$'\t' -k"$1" -g "$2" | awk -F'\t' -v c="$1" '{t[NR] = $c; s += $c} END {
    m = (NR % 2) ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2
    printf "median %.2f s, max %.2f s, sum %.1f s", m, t[NR], s }'
}
# One binary's table and summary.
table() {
  local rows=$1
  echo "| module | compile (s, wall) | process (s, wall) | CPU (s, user + sys) |"
  echo "|---|---:|---:|---:|"
  awk -F'\t' '{printf "| %s | %.2f | %.2f | %.2f |\n", $1, $2, $3, $4}' "$rows"
  echo
  echo "$(wc -l <"$rows") modules:"
  echo "- compile (wall): $(stats 2 "$rows")"
  echo "- process (wall): $(stats 3 "$rows")"
  echo "- CPU: $(stats 4 "$rows")"
}
{
  echo "date $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end; $ROUNDS round(s), the lowest of each"
  echo
  if [[ -n $BASE ]]; then
    echo "Base: $BASE"
    echo
    table "$tmp/rows.base"
    echo
    echo "New: $KFORGE"
    echo
  fi
  table "$tmp/rows.new"
} | tee "${OUT_TABLE:-/dev/null}"
