#!/usr/bin/env bash
# Starts the kforge server on its embedded defaults: 127.0.0.1:50051, cache
# in $XDG_CACHE_HOME/kforge (else ~/.cache/kforge), one compile worker per
# core. Extra arguments go to `kforge serve` (see `kforge serve --help`).
# Stop it with Ctrl-C.
#
# Dependencies are installed and the build configured only when there is no
# build yet (scripts/build.sh); otherwise ninja rebuilds what is stale
# (rerunning cmake if a CMakeLists.txt changed) and does nothing when the
# build is current, so a restart starts at once.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KFORGE_BUILD_DIR:-build}
if [ -f "$build/build.ninja" ]; then
  cmake --build "$build" --target kforge
else
  scripts/build.sh
fi
exec "$build/cli/kforge" serve "$@"
