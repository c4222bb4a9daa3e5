#!/usr/bin/env bash
# Installs what kforge needs to build and test, from Debian packages by name.
# Safe to re-run: apt skips what is already there. The CUDA toolkit (NVRTC,
# cuda.h and the driver stub) is expected in /usr/local/cuda.
set -euo pipefail
packages=(
  cmake ninja-build g++ pkg-config
  libgrpc++-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  libabsl-dev libelf-dev libssl-dev openssl libgtest-dev libgmock-dev clang-format
  clang libclang-rt-dev
  libhiredis-dev redis-server
  python3 python3-grpcio python3-protobuf
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: installing ${missing[*]}" >&2
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
cuda=${KFORGE_CUDA_ROOT:-/usr/local/cuda}
for f in include/nvrtc.h include/cuda.h lib64/libnvrtc.so lib64/stubs/libcuda.so; do
  if [ ! -e "$cuda/$f" ]; then
    echo "install_deps: $cuda/$f is missing: kforge needs the CUDA toolkit (12.8 or newer) in $cuda" >&2
    echo "install_deps: (set KFORGE_CUDA_ROOT to use another location)" >&2
    exit 1
  fi
done
