#!/usr/bin/env bash
# The vLLM plugin's CPU tier (integrations/vllm/tests/test_vllm_plugin.py)
# against the real vLLM: creates (or reuses) a venv, installs vLLM from
# PyPI, the kforge package (python/) and kforge-vllm (integrations/vllm)
# into it, and runs the tests. Not part of .ci/run / ctest: vLLM with its
# torch is 9.4 GB; a fresh venv took 1109 s in all (1054 s of it pip, no
# pip cache, on 2 busy cores); a reused one 149 s with --keep-kforge (the
# 27 tests 116 s, building vLLM's own MLA layers on the CPU among them).
#   scripts/test_vllm_plugin.sh [--venv DIR] [--keep-kforge]
#     --venv DIR      the venv (default ~/.cache/kforge/vllm-venv)
#     --keep-kforge   reinstall kforge-vllm only, keeping the venv's kforge
#                     package (installed by an earlier run): iterating on the
#                     plugin then rebuilds nothing of kforge
# Needs the kforge build's Python outputs (the native library and the
# message modules): built here if missing (targets kforge_capi,
# kforge_python_proto; the rest of the build is not needed).
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION=0.33.0  # the version the plugin is written and tested against (README)
venv=${KFORGE_VLLM_VENV:-$HOME/.cache/kforge/vllm-venv}
keep_kforge=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --venv) venv=$2; shift 2 ;;
    --keep-kforge) keep_kforge=1; shift ;;
    *) echo "usage: $0 [--venv DIR] [--keep-kforge]" >&2; exit 2 ;;
  esac
done
start=$SECONDS
build=${KFORGE_BUILD_DIR:-build}
if [[ ! -f python/kforge/_native/libkforge_capi.so || ! -f python/kforge/v1/spec_pb2.py ]]; then
  [[ -f "$build/build.ninja" ]] || cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DKFORGE_CUDA_ROOT="${KFORGE_CUDA_ROOT:-/usr/local/cuda}" >/dev/null
  cmake --build "$build" --target kforge_capi kforge_python_proto
fi
if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import vllm, sys; sys.exit(vllm.__version__ != '$VLLM_VERSION')" \
    2>/dev/null; then
  echo "installing vllm==$VLLM_VERSION into $venv (9.4 GB: minutes)"
  "$venv/bin/pip" install -q "vllm==$VLLM_VERSION"
fi
# Not editable: the tests run what pip installs from this tree.
packages=(./python ./integrations/vllm)
if [[ $keep_kforge == 1 ]]; then
  "$venv/bin/python" -c "import kforge" || { echo "--keep-kforge: no kforge in $venv" >&2; exit 1; }
  packages=(./integrations/vllm)
fi
"$venv/bin/pip" install -q --force-reinstall --no-deps "${packages[@]}"
"$venv/bin/pip" install -q "${packages[@]}"  # their dependencies, if missing
echo "installed in $((SECONDS - start)) s"
# vllm.platforms.cuda imports vLLM's extension, which links libcuda.so.1:
# on a machine with no driver the toolkit's stub satisfies the loader.
stub=$(mktemp -d)
trap 'rm -rf "$stub"' EXIT
if ! ldconfig -p | grep -q 'libcuda\.so\.1 '; then
  ln -s "${KFORGE_CUDA_ROOT:-/usr/local/cuda}/lib64/stubs/libcuda.so" "$stub/libcuda.so.1"
fi
tests_start=$SECONDS
(cd integrations/vllm/tests &&
  LD_LIBRARY_PATH="$stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$venv/bin/python" -m unittest -v test_vllm_plugin)
echo "tests: $((SECONDS - tests_start)) s; in all $((SECONDS - start)) s"
