#!/usr/bin/env bash
# First kernel from a cold server: seconds from starting `kforge serve`
# (an empty cache, its own port) to the answer of one `kforge get` for each
# module asked for, one server a module. Prints one line a module: those
# seconds, then `kforge get`'s own line (the compile seconds the answer
# reports). A timing is never a test assertion (BENCH.md keeps them).
#
#   bench/cold_serve_get.sh KFORGE_BINARY ["GET ARGS"]...
#
# Without modules: glm-5 TP8 bf16 sm_120a, glm-5 TP8 bf16 sm_90a and
# deepseek-v3.2 TP1 fp8_ds_mla sm_90a (the slowest preset module).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
KFORGE=${1:?usage: cold_serve_get.sh KFORGE_BINARY ["GET ARGS"]...}
shift
[[ -x $KFORGE ]] || { echo "cold_serve_get.sh: $KFORGE is not an executable" >&2; exit 2; }
if [[ $# -eq 0 ]]; then
  set -- "--preset glm-5 --tp 8 --kv-dtype bf16 --arch sm_120a" \
    "--preset glm-5 --tp 8 --kv-dtype bf16 --arch sm_90a" \
    "--preset deepseek-v3.2 --tp 1 --kv-dtype fp8_ds_mla --arch sm_90a"
fi
tmp=$(mktemp -d)
trap 'stop_server; rm -rf "$tmp"' EXIT
for module in "$@"; do
  rm -rf "$tmp/cache" "$tmp/out"
  read -r -a args <<<"$module"
  start=$(date +%s.%N)
  start_server "$KFORGE" "$tmp/cache" "$tmp/serve.log"
    address=$SERVER_ADDRESS
  "$KFORGE" get --server "$address" "${args[@]}" -o "$tmp/out" >"$tmp/get.txt" 2>&1 ||
    { echo "cold_serve_get.sh: get $module failed:" >&2; cat "$tmp/get.txt" >&2; exit 1; }
  end=$(date +%s.%N)
  stop_server
  printf '%s s  %s\n' "$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')" \
    "$(tail -n 1 "$tmp/get.txt" | sed "s|$tmp/out/||")"
done
