#!/usr/bin/env bash
# A kernel change against its base on one GPU, in one call: the bench
# (bench/bench_sparse_mla.py, the selector's split only) over the base's
# modules and the change's, alternating, ROUNDS times each, so that both
# see the same card and clocks; prints each case's medians side by side.
# A timing is never a test assertion: the table goes in BENCH.md. Exits 1
# when a run failed.
#
#   tests/gpu/ab_bench.sh BASE_DIR NEW_DIR[,NEW_DIR...] KV_DTYPE CASES [ROUNDS]   (default 2)
#
# Under $OUT (default /tmp/kforge-ab) two files a dtype, so that a device
# call brings them back (its limit is eight): ab_<dtype>.md, every round's
# rows, and ab_<dtype>.log, the last run's output.
# BASE_CAPI_LIB: the base's native library (its KFORGE_CAPI_LIB), where the
# change moved the artifact format and the base's modules need their own.
set -o pipefail
shopt -s nullglob
base=${1:?usage: ab_bench.sh BASE_DIR NEW_DIR[,NEW_DIR...] KV_DTYPE CASES [ROUNDS]}
new=${2:?}
dtype=${3:?}
cases=${4:?}
rounds=${5:-2}
[[ $rounds =~ ^[1-9][0-9]?$ ]] || { echo "ab_bench.sh: ROUNDS: got '$rounds', supported 1 to 99" >&2; exit 2; }
out=${OUT:-/tmp/kforge-ab}
tables=$(mktemp -d)
trap 'rm -rf "$tables"' EXIT
mkdir -p "$out"
export PYTHONUNBUFFERED=1
failed=0
# NEW_DIR may name several variants, comma-separated: each runs after the
# base in every round, labelled by its directory's name ("new" when one).
IFS=, read -r -a news <<<"$new"
for d in "${news[@]}"; do
  [ -n "$d" ] || { echo "ab_bench.sh: NEW_DIR: an empty name in '$new'" >&2; exit 2; }
done
label_of() {
  if [ ${#news[@]} -eq 1 ]; then echo new; else basename "$1" | tr -c 'A-Za-z0-9_.\n-' _; fi
}
labels=base
for d in "${news[@]}"; do labels+=$'\n'$(label_of "$d"); done
if [ "$(sort <<<"$labels" | uniq -d)" != "" ]; then
  echo "ab_bench.sh: two variants share a directory name (or one is named base): ${labels//$'\n'/ }" >&2
  exit 2
fi
for ((r = 1; r <= rounds; ++r)); do
  for ((i = -1; i < ${#news[@]}; ++i)); do
    if ((i < 0)); then
      dir=$base side=base
      lib=${BASE_CAPI_LIB:-${KFORGE_CAPI_LIB:-}}
    else
      dir=${news[i]} side=$(label_of "${news[i]}")
      lib=${KFORGE_CAPI_LIB:-}
    fi
    table=$tables/ab_${dtype}_${side}_$r.md
    if ! KFORGE_CAPI_LIB=$lib timeout 200 python3 bench/bench_sparse_mla.py "$dir" --no-torch --auto-only \
      --kv-dtype "$dtype" --cases "$cases" --out "$table" >"$out/ab_${dtype}.log" 2>&1; then
      echo "ab_bench.sh: $side round $r failed:"
      tail -n 5 "$out/ab_${dtype}.log"
      failed=1
    fi
  done
done
# Each case's row of every table, each side's rounds in turn.
for f in "$tables"/ab_"${dtype}"_*.md; do
  echo "== $(basename "$f" .md)"
  grep -E '^\| [0-9]+ x [0-9]+' "$f" | cut -c1-160
done | tee "$out/ab_${dtype}.md"
exit $failed
