#!/usr/bin/env bash
# Installs dependencies, builds, and starts the kforge server on its
# embedded defaults: 127.0.0.1:50051, cache in $XDG_CACHE_HOME/kforge (else
# ~/.cache/kforge), one compile worker per core. Extra arguments go to
# `kforge serve` (see `kforge serve --help`). Stop it with Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
build=${KFORGE_BUILD_DIR:-build}
exec "$build/cli/kforge" serve "$@"
