#!/usr/bin/env bash
# GetKernel to the answer on a running server, cold (nothing cached), for
# every preset module (issue 46's list: both presets x TP 1/2/4/8 x bf16 /
# fp8_ds_mla x sm_90a / sm_120a, plus each preset's DSA indexer module on
# both archs: 36 modules), one at a time. One `kforge serve` with an empty
# cache on its own port; for each module one `kforge get --first-answer`
# (GetKernelRequest.first_answer): the seconds of that process (a
# GetManifest, then the GetKernel), the server's seconds for the answer,
# and whether the answer was a first answer (its entries of the module's);
# then the seconds until the server has cached the whole module (polled with
# `kforge stats` until no compile is in flight), so that each module is
# measured on an otherwise idle server. Prints a markdown table and the
# median and max of each column. Run it on an idle machine: a timing is
# never a test assertion (BENCH.md keeps them).
#
#   bench/first_answer_times.sh KFORGE_BINARY [OUT_TABLE]
#
# Environment: FIRST_ANSWER_ARCHS (default "sm_90a sm_120a"),
# FIRST_ANSWER_TPS (default "1 2 4 8"), FIRST_ANSWER_GET_ARGS (default
# "--first-answer"; "" measures the whole module's answer the same way).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
KFORGE=${1:?usage: first_answer_times.sh KFORGE_BINARY [OUT_TABLE]}
OUT_TABLE=${2:-}
PRESET_ARCHS=${FIRST_ANSWER_ARCHS:-sm_90a sm_120a}
PRESET_TPS=${FIRST_ANSWER_TPS:-1 2 4 8}
read -r -a GET_ARGS <<<"${FIRST_ANSWER_GET_ARGS---first-answer}"
[[ -x $KFORGE ]] || { echo "first_answer_times.sh: $KFORGE is not an executable" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'stop_server; rm -rf "$tmp"' EXIT
start_server "$KFORGE" "$tmp/cache" "$tmp/serve.log"
address=$SERVER_ADDRESS
# Seconds since the epoch, with nanoseconds.
now() { date +%s.%N; }
# Waits until the server has no compile in flight or queued (the rest of a
# module after its first answer).
settle() {
  local stats
  for _ in $(seq 6000); do
    stats=$("$KFORGE" stats --server "$address")
    if grep -q '"in_flight_compiles": 0,' <<<"$stats" && grep -q '"queue_depth": 0,' <<<"$stats"; then
      return 0
    fi
    sleep 0.02
  done
  echo "first_answer_times.sh: the server still compiles after 120 s" >&2
  exit 1
}
: >"$tmp/rows"
measure() {
  local label=$1; shift
  rm -rf "$tmp/out"
  local start answered settled line
  start=$(now)
  if ! "$KFORGE" get --server "$address" "$@" "${GET_ARGS[@]}" -o "$tmp/out" >"$tmp/get.txt" 2>&1; then
    echo "first_answer_times.sh: get $label failed: $(tail -n 3 "$tmp/get.txt")" >&2
    exit 1
  fi
  answered=$(now)
  settle
  settled=$(now)
  line=$(tail -n 1 "$tmp/get.txt")
  local server_s entries
  server_s=$(sed -n 's/.*source [a-z_]* *\([0-9.]*\) s.*/\1/p' <<<"$line")
  entries=$(sed -n 's/.*first answer: \([0-9]* of [0-9]*\) entries.*/\1/p' <<<"$line")
  printf '%s\t%s\t%s\t%s\t%s\n' "$label" \
    "$(awk -v a="$start" -v b="$answered" 'BEGIN { printf "%.2f", b - a }')" "$server_s" \
    "${entries:-whole}" "$(awk -v a="$start" -v b="$settled" 'BEGIN { printf "%.2f", b - a }')" \
    >>"$tmp/rows"
  tail -n 1 "$tmp/rows" >&2
}
for_each_preset_module measure
# The median and the max of column `col`.
stats() {
  sort -t$'\t' -k"$1" -g "$tmp/rows" | awk -F'\t' -v c="$1" '{t[NR] = $c; s += $c} END {
    m = (NR % 2) ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2
    printf "median %.2f s, max %.2f s", m, t[NR] }'
}
{
  echo "date $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end; get args: ${GET_ARGS[*]:-none}"
  echo
  echo "| module | answer (s, \`kforge get\` wall) | server (s) | answer holds | whole module cached (s) |"
  echo "|---|---:|---:|---|---:|"
  awk -F'\t' '{printf "| %s | %.2f | %.2f | %s | %.2f |\n", $1, $2, $3, $4 == "whole" ? "whole module" : $4 " entries", $5}' "$tmp/rows"
  echo
  echo "$(wc -l <"$tmp/rows") modules:"
  echo "- answer (\`kforge get\` wall): $(stats 2)"
  echo "- server: $(stats 3)"
  echo "- whole module cached: $(stats 5)"
} | tee "${OUT_TABLE:-/dev/null}"
