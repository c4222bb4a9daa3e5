#!/usr/bin/env bash
# `pip install ./python` into a fresh venv, as a user does on a machine with
# the build dependencies (scripts/install_deps.sh): pip runs the package's
# PEP 517 backend (scikit-build-core, fetched from PyPI by build isolation),
# which runs the project's CMake build in its Python-package mode
# (python/build/, kept between runs). Debian's grpcio and protobuf come from
# the system site packages (--no-deps). Then, from outside the source tree,
# the installed package: its version, its generated message modules and its
# native library.
#   pip_install_test.sh PYTHON SOURCE_DIR EXPECTED_VERSION
set -euo pipefail
python=$1 src=$2 version=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m venv --system-site-packages "$tmp/venv"
"$tmp/venv/bin/python" -m pip install --quiet --no-deps "$src/python" >"$tmp/pip.log" 2>&1 ||
  { cat "$tmp/pip.log" >&2; exit 1; }
cd "$tmp"
"$tmp/venv/bin/python" - "$tmp/venv" "$version" <<'PY'
import sys
venv, version = sys.argv[1], sys.argv[2]
import kforge
assert kforge.__file__.startswith(venv), f"kforge imported from {kforge.__file__}, not the venv"
import os
native = os.path.join(os.path.dirname(kforge.__file__), "_native", "libkforge_capi.so")
assert os.path.isfile(native), f"{native} is not installed"
assert kforge.__version__ == version, f"__version__ {kforge.__version__}, expected {version}"
from kforge.v1 import service_pb2
assert service_pb2.ARTIFACT_SOURCE_REDIS == 5
spec = kforge.spec_from_preset("glm-5", 8)  # through the native library (C ABI)
assert spec.num_q_heads == 8, spec
print(f"pip_install_test: kforge {kforge.__version__} from {kforge.__file__}: passed")
PY
