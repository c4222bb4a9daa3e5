#!/usr/bin/env bash
# Copies kforge binaries and the Debian shared libraries they need (gRPC,
# protobuf, abseil, libstdc++ ...) into OUT/bin and OUT/lib, so they run on
# the GPU machine, whose image has other system libraries. glibc and NVRTC
# are left out: the GPU machine has a newer glibc and its own CUDA 13 NVRTC.
# Run there with LD_LIBRARY_PATH=OUT/lib (only for these binaries: torch
# must keep its own libstdc++).
# Usage: tests/gpu/stage_binaries.sh OUT BINARY...
set -euo pipefail
out=$1; shift
mkdir -p "$out/bin" "$out/lib"
for bin in "$@"; do
  cp -f "$bin" "$out/bin/"
  strip --strip-debug "$out/bin/$(basename "$bin")"  # debug info: not needed there, 64 MiB carry limit
  ldd "$bin" | awk '$3 ~ /^\// {print $3}' |
    grep -v -E '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libnvrtc[^/]*)\.so' |
    while read -r lib; do cp -fL "$lib" "$out/lib/"; done
done
du -sh "$out"
