#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan, in their own
# build directory) and runs each over its seed corpus for a share of a total
# time. Exit 1, with the crashing input's path and how to rerun it, when a
# target crashes, leaks, hits UB, breaks a property or runs out of memory.
#
#   scripts/fuzz.sh [--seconds N] [--only NAME] [--build-only]
#
#   --seconds N   total fuzzing time over all targets (default 60, what CI
#                 runs); each target gets N / targets, at least 1 s
#   --only NAME   run one target (spec, matrix, cubin, bundle, disk_cache,
#                 cache_entry, request, warm_request, answer), for all N
#                 seconds
#   --build-only  configure and build, run nothing
#
# Build directory: ${KFORGE_FUZZ_BUILD_DIR:-build-fuzz}. New inputs that
# reach new code accumulate in <build dir>/corpus/<name>/ (not in the
# checked-in seeds of fuzz/corpus/<name>/, which every run replays first);
# crash inputs go to <build dir>/crashes/<name>/. A crash input kept as a
# regression case is copied into fuzz/corpus/<name>/ with the fix.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
only=""
build_only=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --build-only) build_only=1; shift ;;
    *) echo "fuzz.sh: unknown argument $1 (see the comment at the top)" >&2; exit 2 ;;
  esac
done
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [[ "$seconds" -lt 1 ]]; then
  echo "fuzz.sh: --seconds: got '$seconds', want a whole number >= 1" >&2
  exit 2
fi

targets=(spec matrix cubin bundle disk_cache cache_entry request warm_request answer)
if [[ -n "$only" ]]; then
  if [[ ! " ${targets[*]} " =~ " $only " ]]; then
    echo "fuzz.sh: --only: got '$only', supported ${targets[*]}" >&2
    exit 2
  fi
  targets=("$only")
fi

for tool in clang clang++; do
  if ! command -v "$tool" >/dev/null; then
    echo "fuzz.sh: $tool not found; scripts/install_deps.sh installs it (Debian clang)" >&2
    exit 1
  fi
done

build=${KFORGE_FUZZ_BUILD_DIR:-build-fuzz}
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKFORGE_FUZZ=ON -DKFORGE_CUDA_ROOT="${KFORGE_CUDA_ROOT:-/usr/local/cuda}" >/dev/null
cmake --build "$build" --target kforge_fuzzers -j"${KFORGE_BUILD_JOBS:-$(nproc)}"
[[ "$build_only" -eq 1 ]] && exit 0

# Scratch files of the targets that read directories (bundle, disk_cache):
# in memory where possible, removed when the script exits.
scratch_root=/tmp
[[ -d /dev/shm && -w /dev/shm ]] && scratch_root=/dev/shm
scratch=$(mktemp -d "$scratch_root/kforge-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

per_target=$((seconds / ${#targets[@]}))
[[ "$per_target" -lt 1 ]] && per_target=1
failed=0
for name in "${targets[@]}"; do
  bin="$build/fuzz/${name}_fuzzer"
  work="$build/corpus/$name"
  crashes="$build/crashes/$name"
  log="$build/logs/$name.log"
  mkdir -p "$work" "$crashes" "$(dirname "$log")"
  start=$(date +%s)
  # -timeout: one input taking 10 s is a finding (work amplification);
  # -rss_limit_mb: so is 2 GB of memory.
  if TMPDIR="$scratch" "$bin" -max_total_time="$per_target" -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$crashes/" -print_final_stats=1 "$work" "fuzz/corpus/$name" \
      >"$log" 2>&1; then
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
    echo "fuzz $name: ok, ${execs:-?} inputs in $(($(date +%s) - start)) s (${cov:-cov: ?})"
  else
    failed=1
    echo "fuzz $name: FAILED after $(($(date +%s) - start)) s; log $log" >&2
    tail -n 40 "$log" >&2
    input=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    if [[ -n "$input" ]]; then
      echo "fuzz $name: input $input; rerun with: $bin $input" >&2
    fi
  fi
done
exit "$failed"
