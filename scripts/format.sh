#!/usr/bin/env bash
# Formats the C++ and CUDA sources to .clang-format, or with --check lists
# the files that are not (exit 1). tests/golden/ holds generated code that
# is compared byte for byte, so it is left as generated.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cuh' '*.cu' | grep -v '^tests/golden/')
if [[ "${1:-}" == "--check" ]]; then
  bad=()
  for f in "${files[@]}"; do
    clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if [[ ${#bad[@]} -gt 0 ]]; then
    printf 'not formatted (run scripts/format.sh): %s\n' "${bad[@]}" >&2
    echo "0 passed, 1 failed"
    exit 1
  fi
  echo "${#files[@]} files formatted"
  echo "1 passed, 0 failed"
  exit 0
fi
clang-format -i "${files[@]}"
