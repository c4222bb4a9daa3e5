#!/usr/bin/env bash
# dist/systemd/kforge.service passes `systemd-analyze verify` (with its
# ExecStart pointed at the built binary). Skips (exit 77) where
# systemd-analyze is not installed.
#   systemd_unit_test.sh KFORGE_BINARY SOURCE_DIR
set -euo pipefail
kforge=$1 src=$2
if ! command -v systemd-analyze >/dev/null; then
  echo "systemd_unit_test: systemd-analyze is not installed: the unit is not checked"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s|^ExecStart=/usr/local/bin/kforge |ExecStart=$kforge |" "$src/dist/systemd/kforge.service" \
  >"$tmp/kforge.service"
grep -q "^ExecStart=$kforge serve" "$tmp/kforge.service"
out=$(systemd-analyze verify "$tmp/kforge.service" 2>&1) || { echo "$out" >&2; exit 1; }
# verify also reports problems without failing; the unit must raise none of its own.
if grep -F "kforge.service" <<<"$out"; then
  echo "systemd_unit_test: systemd-analyze has remarks on the unit" >&2
  exit 1
fi
echo "systemd_unit_test: passed"
