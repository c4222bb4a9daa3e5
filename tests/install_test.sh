#!/usr/bin/env bash
# `cmake --install` into a fresh prefix, then a tiny engine project that
# says find_package(kforge), links kforge::kforge_runtime and
# kforge::kforge_client, builds, runs, and carries no NVRTC.
#   install_test.sh BUILD_DIR
set -euo pipefail
build=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
[[ -x "$tmp/prefix/bin/kforge" ]] || { echo "install_test: no bin/kforge" >&2; exit 1; }
mkdir "$tmp/engine"
cat >"$tmp/engine/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(engine LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(kforge 0.1 REQUIRED)
add_executable(engine main.cc)
target_link_libraries(engine PRIVATE kforge::kforge_runtime kforge::kforge_client)
CMAKE
cat >"$tmp/engine/main.cc" <<'CC'
#include <iostream>

#include "bundle/bundle.h"
#include "model/spec.h"
#include "runtime/client.h"

int main() {
  auto spec = kforge::SpecFromPreset("glm-5", 8);
  if (!spec.ok() || spec->num_q_heads() != 8) return 1;
  auto bundle = kforge::BundleSource::Open("/nonexistent/kforge-bundle");
  if (bundle.ok()) return 1;
  kforge::ServiceClientOptions options;
  std::cout << "engine: glm-5 tp 8 has " << spec->num_q_heads() << " heads; client default "
            << options.address << "\n";
  return 0;
}
CC
cmake -S "$tmp/engine" -B "$tmp/engine/build" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/engine/build" >/dev/null
out=$("$tmp/engine/build/engine")
echo "$out"
[[ "$out" == *"has 8 heads; client default 127.0.0.1:50051"* ]] || { echo "install_test: unexpected output" >&2; exit 1; }
if nm -C "$tmp/engine/build/engine" | grep -qi nvrtc; then
  echo "install_test: the engine binary carries NVRTC symbols" >&2
  exit 1
fi
echo "install_test: passed"
