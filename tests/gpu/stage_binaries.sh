#!/usr/bin/env bash
# Copies kforge binaries and the Debian shared libraries they need (gRPC,
# protobuf, abseil, libstdc++ ...) into OUT/bin and OUT/lib, so they run on
# the GPU machine, whose image has other system libraries. glibc and NVRTC
# are left out: the GPU machine has a newer glibc and its own CUDA 13 NVRTC.
# Run there with LD_LIBRARY_PATH=OUT/lib (only for these binaries: torch
# must keep its own libstdc++).
#
# --beside: a shared library loaded into another process (the Python
# package's libkforge_capi.so, loaded into torch's) goes to OUT itself with
# its dependencies beside it, found through its RPATH $ORIGIN with no
# LD_LIBRARY_PATH; libstdc++ and libgcc_s stay out too (the host process
# has loaded its own).
# Usage: tests/gpu/stage_binaries.sh OUT BINARY...
#        tests/gpu/stage_binaries.sh --beside OUT LIBRARY...
set -euo pipefail
beside=0
if [ "$1" = --beside ]; then beside=1; shift; fi
out=$1; shift
skip='libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libnvrtc[^/]*'
bin_dir=$out/bin lib_dir=$out/lib
if [ $beside = 1 ]; then
  skip="$skip|libstdc\+\+|libgcc_s"
  bin_dir=$out lib_dir=$out
fi
mkdir -p "$bin_dir" "$lib_dir"
for bin in "$@"; do
  cp -f "$bin" "$bin_dir/"
  strip --strip-debug "$bin_dir/$(basename "$bin")"  # debug info: not needed there, 64 MiB carry limit
  ldd "$bin" | awk '$3 ~ /^\// {print $3}' | grep -v -E "/($skip)\.so" |
    while read -r lib; do cp -fL "$lib" "$lib_dir/"; done
done
du -sh "$out"
