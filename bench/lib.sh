# Shared by the compile-time bench scripts (sourced, not run).

# Issue 46's preset modules: both presets x TP (PRESET_TPS, default
# "1 2 4 8") x bf16 / fp8_ds_mla on each arch (PRESET_ARCHS, default
# "sm_90a sm_120a"), plus each preset's DSA indexer module on each arch (36
# modules). Calls `$1 LABEL KFORGE_ARGS...` for each, in that order.
for_each_preset_module() {
  local fn=$1 preset arch tp kv
  for preset in deepseek-v3.2 glm-5; do
    for arch in ${PRESET_ARCHS:-sm_90a sm_120a}; do
      for tp in ${PRESET_TPS:-1 2 4 8}; do
        for kv in bf16 fp8_ds_mla; do
          "$fn" "$preset tp$tp $kv $arch" --preset "$preset" --tp "$tp" --kv-dtype "$kv" --arch "$arch"
        done
      done
      "$fn" "$preset dsa-indexer $arch" --preset "$preset" --kind dsa-indexer --arch "$arch"
    done
  done
}

# Starts `$1 serve` on a free loopback port with the cache directory $2,
# its output in $3; sets SERVER_PID and SERVER_ADDRESS once it listens (it
# prints "kforge: serving on ADDR"). Exits 1 with its output when it does
# not start within 10 s.
start_server() {
  "$1" serve --listen 127.0.0.1:0 --cache-dir "$2" >"$3" 2>&1 &
  SERVER_PID=$!
  SERVER_ADDRESS=
  for _ in $(seq 2000); do
    SERVER_ADDRESS=$(sed -n 's/^kforge: serving on \([^ ]*\).*/\1/p' "$3" | head -n 1)
    [[ -n $SERVER_ADDRESS ]] && return 0
    sleep 0.005
  done
  echo "$(basename "$0"): the server did not start:" >&2
  cat "$3" >&2
  exit 1
}

# Stops the server start_server started, if it runs (for an EXIT trap, and
# between modules).
stop_server() {
  if [[ -n ${SERVER_PID:-} ]]; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=
}
