#!/usr/bin/env bash
# Times `kforge prebuild` of the default deployment matrix (80 kernels) at
# several -j values, each into a fresh bundle directory, then the start-up
# of `kforge serve --warm-from` on the result with an empty cache. Prints a
# markdown report (and writes it to OUT_TABLE when given).
#
#   bench/prebuild_bench.sh KFORGE_BINARY [OUT_TABLE]
#
# Environment:
#   PREBUILD_BENCH_JOBS    -j values to run, e.g. "1 4 16" (default: 1,
#                          nproc/2 and nproc, without repeats)
#   PREBUILD_BENCH_MATRIX  a matrix file instead of the default matrix (a
#                          subset for a quick run; the report names it)
#   PREBUILD_BENCH_TIMEOUT seconds allowed for each prebuild (default 3600)
#
# Checks on the way: every bundle verifies (`kforge verify`) and all runs
# give the same checksums.sha256 (the bundle does not depend on -j).
# Needs bash, coreutils and awk; the health check at warm-up uses a python3
# with grpcio ($PYTHON, python3, /usr/bin/python3) and is skipped without.
set -euo pipefail

KFORGE=${1:?usage: prebuild_bench.sh KFORGE_BINARY [OUT_TABLE]}
OUT_TABLE=${2:-}
MATRIX=${PREBUILD_BENCH_MATRIX:-}
TIMEOUT=${PREBUILD_BENCH_TIMEOUT:-3600}
if [[ ! -x $KFORGE ]]; then
  echo "prebuild_bench.sh: $KFORGE is not an executable (build the kforge target)" >&2
  exit 2
fi
if [[ -n $MATRIX && ! -r $MATRIX ]]; then
  echo "prebuild_bench.sh: PREBUILD_BENCH_MATRIX=$MATRIX cannot be read" >&2
  exit 2
fi

CPUS=$(nproc)
if [[ -n ${PREBUILD_BENCH_JOBS:-} ]]; then
  JOBS_LIST=$PREBUILD_BENCH_JOBS
else
  JOBS_LIST=$(printf '%s\n' 1 $((CPUS / 2)) "$CPUS" | awk '$1 >= 1 && !seen[$1]++' | tr '\n' ' ')
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kforge_prebuild_bench.XXXXXX")
SERVER_PID=
HEALTH_PID=
cleanup() {
  if [[ -n $HEALTH_PID ]]; then kill -KILL "$HEALTH_PID" 2>/dev/null || true; fi
  if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

REPORT=$WORK/report.md
say() { printf '%s\n' "$*" >>"$REPORT"; }

COMMIT=$(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown)
CPU_MODEL=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || true)
say "## kforge prebuild"
say ""
say "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
say "- host: nproc $CPUS${CPU_MODEL:+, $CPU_MODEL}"
say "- commit: $COMMIT"
say "- matrix: ${MATRIX:-the built-in default (deploy/default_matrix.json)}"
say ""

# --- prebuild at each -j -----------------------------------------------------
say "| jobs | wall s | CPU s (user + sys) | kernels | kernels/s | speedup vs -j1 | parallel efficiency |"
say "|---:|---:|---:|---:|---:|---:|---:|"
BASE_WALL=
FIRST_BUNDLE=
SAME_CHECKSUMS=yes
for jobs in $JOBS_LIST; do
  bundle=$WORK/bundle_j$jobs
  log=$WORK/prebuild_j$jobs.log
  echo "prebuild_bench.sh: prebuild -j $jobs ..." >&2
  start=$(now)
  rc=0
  # CPU of the prebuild and its compile workers (bash's `time`: user, sys):
  # on a shared machine the column to read.
  { TIMEFORMAT='%U %S'; time timeout "$TIMEOUT" "$KFORGE" prebuild ${MATRIX:+"$MATRIX"} \
      --out "$bundle" -j "$jobs" >"$log" 2>&1 || rc=$?; } 2>"$WORK/cpu_j$jobs"
  end=$(now)
  cpu=$(awk '{ printf "%.1f", $1 + $2 }' "$WORK/cpu_j$jobs")
  if [[ $rc -ne 0 ]]; then
    echo "prebuild_bench.sh: prebuild -j $jobs exited $rc; last lines:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  if ! "$KFORGE" verify "$bundle" >"$WORK/verify_j$jobs.log" 2>&1; then
    echo "prebuild_bench.sh: the -j $jobs bundle does not verify:" >&2
    tail -n 20 "$WORK/verify_j$jobs.log" >&2
    exit 1
  fi
  # "prebuild: DIR: 80 kernels, 80 compiled, 0 already in the bundle, ..."
  kernels=$(awk '/^prebuild: .* compiled, / { for (i = 1; i <= NF; ++i) if ($(i + 1) == "compiled,") print $i }' "$log" | tail -n 1)
  wall=$(elapsed "$start" "$end")
  [[ -z $BASE_WALL ]] && BASE_WALL=$wall
  if [[ -z $FIRST_BUNDLE ]]; then
    FIRST_BUNDLE=$bundle
  elif ! cmp -s "$FIRST_BUNDLE/checksums.sha256" "$bundle/checksums.sha256"; then
    SAME_CHECKSUMS=no
  fi
  awk -v j="$jobs" -v w="$wall" -v c="$cpu" -v k="$kernels" -v b="$BASE_WALL" -v first="${JOBS_LIST%% *}" 'BEGIN {
    speedup = b / w
    # Efficiency is relative to the first -j value (normally 1).
    eff = speedup * first / j
    printf "| %d | %.1f | %s | %d | %.2f | %.2fx | %.0f%% |\n", j, w, c, k, k / w, speedup, 100 * eff
  }' >>"$REPORT"
done
say ""
say "Every bundle verifies; checksums.sha256 identical across the runs: $SAME_CHECKSUMS."
say ""

# --- serve --warm-from ---------------------------------------------------------
# The health poller starts first (importing grpc takes longer than a small
# warm-up) and says "ready"; it then reads the address from the server's
# log and prints the time at which health first answered SERVING.
HEALTH_PY='
import re, sys, time
import grpc
log, limit = sys.argv[1], time.time() + float(sys.argv[2])
print("ready", flush=True)
address = None
while address is None and time.time() < limit:
    try:
        m = re.search(r"^kforge: serving on (\S+)", open(log).read(), re.M)
        address = m and m.group(1)
    except OSError:
        pass
    time.sleep(0.002)
check = grpc.insecure_channel(address).unary_unary("/grpc.health.v1.Health/Check")
while time.time() < limit:
    try:
        if check(b"", timeout=1) == b"\x08\x01":
            print("%.6f" % time.time(), flush=True)
            sys.exit(0)
    except grpc.RpcError:
        pass
    time.sleep(0.002)
sys.exit(1)
'
# The first of $PYTHON, python3 on PATH and Debian's /usr/bin/python3 (which
# has python3-grpcio where a pyenv or venv python3 may not) with grpcio.
PY=
for candidate in ${PYTHON:-} python3 /usr/bin/python3; do
  if "$candidate" -c 'import grpc' 2>/dev/null; then
    PY=$candidate
    break
  fi
done

echo "prebuild_bench.sh: serve --warm-from ..." >&2
serve_log=$WORK/serve.log
health_out=$WORK/health.out
if [[ -n $PY ]]; then
  "$PY" -c "$HEALTH_PY" "$serve_log" 300 >"$health_out" &
  HEALTH_PID=$!
  until grep -q ready "$health_out" 2>/dev/null; do
    kill -0 "$HEALTH_PID" 2>/dev/null || { HEALTH_PID=; break; }
    sleep 0.01
  done
fi
start=$(now)
"$KFORGE" serve --listen 127.0.0.1:0 --cache-dir "$WORK/cache" --warm-from "$FIRST_BUNDLE" \
  >"$serve_log" 2>&1 &
SERVER_PID=$!
warm_line=
deadline=$(($(date +%s) + 300))
while [[ -z $warm_line ]]; do
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "prebuild_bench.sh: kforge serve exited; log:" >&2
    cat "$serve_log" >&2
    exit 1
  fi
  if [[ $(date +%s) -gt $deadline ]]; then
    echo "prebuild_bench.sh: no warm-up line within 300 s; log:" >&2
    cat "$serve_log" >&2
    exit 1
  fi
  if grep -q '^kforge: warm-up done' "$serve_log"; then
    line_wall=$(elapsed "$start" "$(now)")
    warm_line=$(grep '^kforge: warm-up done' "$serve_log")
  else
    sleep 0.002
  fi
done
serving_wall="not measured (no python3 with grpcio)"
if [[ -n $HEALTH_PID ]]; then
  if wait "$HEALTH_PID"; then
    serving_wall="$(elapsed "$start" "$(tail -n 1 "$health_out")") s"
  else
    serving_wall="never (health did not answer SERVING)"
  fi
  HEALTH_PID=
fi
kill -TERM "$SERVER_PID" 2>/dev/null || true
wait "$SERVER_PID" 2>/dev/null || true
SERVER_PID=

say "### kforge serve --warm-from (empty cache)"
say ""
say "- start to the \"warm-up done\" line: $line_wall s"
say "- start to health SERVING: $serving_wall"
say "- server's own line: \`${warm_line#kforge: }\`"
say "- skipped kernels: $(grep -c '^kforge: warm-up skipped' "$serve_log" || true)"

cat "$REPORT"
if [[ -n $OUT_TABLE ]]; then
  cp "$REPORT" "$OUT_TABLE"
  echo "prebuild_bench.sh: report written to $OUT_TABLE" >&2
fi
