#!/usr/bin/env bash
# Installs dependencies, builds, and runs kforge's main job on its defaults:
# compiles the glm-5 TP 8 kernel for sm_120a into out/ and inspects it.
# (The gRPC server replaces this once `kforge serve` exists.)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
build=${KFORGE_BUILD_DIR:-build}
"$build/cli/kforge" compile --preset glm-5 --tp 8 --arch sm_120a -o out
for f in out/*.cubin; do "$build/cli/kforge" inspect "$f"; done
