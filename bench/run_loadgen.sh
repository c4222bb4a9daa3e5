#!/usr/bin/env bash
# Starts `kforge serve` on a free loopback port with a temporary cache
# directory, runs kforge_loadgen against it, stops the server and removes the
# directory.
#
#   bench/run_loadgen.sh [KFORGE_BINARY] [LOADGEN_ARGS...]
#
# KFORGE_BINARY defaults to build/cli/kforge; kforge_loadgen is taken from
# $LOADGEN, else beside it (../bench/kforge_loadgen). LOADGEN_ARGS go to the
# load generator (e.g. --seconds 5 --out BENCH-loadgen.md). Extra server
# flags can be given in $KFORGE_SERVE_ARGS (e.g. "--workers 2").
# The whole run is bounded by $LOADGEN_TIMEOUT seconds (default 900).
#
# Overload (issue 43; BENCH.md): 64 clients, every 10th call a new kernel with
# a 3 s or 30 s deadline, on 2 workers; compare two binaries with the same
# load generator (LOADGEN=build/bench/kforge_loadgen):
#   KFORGE_SERVE_ARGS="--workers 2" bench/run_loadgen.sh OLD_OR_NEW_KFORGE \
#     --concurrency 64 --seconds 20 --miss-fraction 0.1 --miss-deadlines 3,30 \
#     --cold 0 --drain-wait 150
#
# On a machine shared with other work (e.g. parallel builds), set
# KFORGE_BENCH_PRIORITY=1: the script then runs in a session of its own and
# raises that session's scheduling autogroup to nice -20 (needs root or
# CAP_SYS_NICE), so the server and the load generator get the CPU without
# renicing anything else. Plain `nice` does not help there: with
# sched_autogroup each session shares the CPU equally whatever its nice.
set -euo pipefail

if [[ -n ${KFORGE_BENCH_PRIORITY:-} && -z ${_KFORGE_BENCH_SESSION:-} ]]; then
  exec env _KFORGE_BENCH_SESSION=1 setsid --wait "$BASH" "$0" "$@"
fi
if [[ -n ${_KFORGE_BENCH_SESSION:-} ]]; then
  if ! { echo -20 >"/proc/$$/autogroup"; } 2>/dev/null; then
    echo "run_loadgen.sh: cannot raise the autogroup priority; running as is" >&2
  fi
fi

KFORGE=${1:-build/cli/kforge}
[[ $# -gt 0 ]] && shift
LOADGEN=${LOADGEN:-$(dirname "$KFORGE")/../bench/kforge_loadgen}
TIMEOUT=${LOADGEN_TIMEOUT:-900}

for bin in "$KFORGE" "$LOADGEN"; do
  if [[ ! -x $bin ]]; then
    echo "run_loadgen.sh: $bin is not an executable (build it first)" >&2
    exit 2
  fi
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kforge-loadgen.XXXXXX")
SERVER_PID=""
cleanup() {
  if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 50); do
      kill -0 "$SERVER_PID" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Port 0: the kernel picks a free port and the server prints the one it got,
# so no other process can take it between choosing and binding.
# shellcheck disable=SC2086
"$KFORGE" serve --listen 127.0.0.1:0 --cache-dir "$TMP/cache" \
  ${KFORGE_SERVE_ARGS:-} >"$TMP/server.out" 2>"$TMP/server.err" &
SERVER_PID=$!

ADDR=""
for _ in $(seq 300); do  # up to 30 s
  ADDR=$(sed -n 's/^kforge: serving on \(127\.0\.0\.1:[0-9]*\).*/\1/p' "$TMP/server.out" | head -n1)
  [[ -n $ADDR ]] && break
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "run_loadgen.sh: kforge serve exited:" >&2
    cat "$TMP/server.err" >&2
    exit 1
  fi
  sleep 0.1
done
if [[ -z $ADDR ]]; then
  echo "run_loadgen.sh: kforge serve did not start within 30 s" >&2
  cat "$TMP/server.err" >&2
  exit 1
fi
echo "run_loadgen.sh: server pid $SERVER_PID on $ADDR (cache $TMP/cache)" >&2

# The load generator also polls the server (lookup-only GetKernel) before it
# starts; --wait bounds that.
status=0
timeout --signal=TERM --kill-after=10 "$TIMEOUT" \
  "$LOADGEN" --server "$ADDR" --wait 30 "$@" || status=$?
if [[ $status -eq 124 ]]; then
  echo "run_loadgen.sh: load generator timed out after $TIMEOUT s" >&2
fi
# CPU the server used over the whole run (user + system, clock ticks).
if [[ -r /proc/$SERVER_PID/stat ]]; then
  read -r -a st <"/proc/$SERVER_PID/stat" || true
  ticks=$(getconf CLK_TCK)
  echo "run_loadgen.sh: server CPU $(( (st[13] + st[14]) / ticks )) s user+sys," \
       "threads ${st[19]}" >&2
fi
exit "$status"
