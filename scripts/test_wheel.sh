#!/usr/bin/env bash
# The wheel where engines run: builds the kforge and kforge-vllm wheels
# (scripts/build_wheel.sh), then in a fresh container from a Debian minbase
# image with only python3, pip and venv installed (no -dev packages, no
# protobuf, abseil or libelf libraries) installs them and runs
# tests/wheel/check_installed.py: import, plan a decode, read a signed
# bundle, and talk to a `kforge serve` over TLS with a token, configured
# only by KFORGE_* variables. Not in .ci/run (a docker daemon and a
# container: minutes).
#   scripts/test_wheel.sh
# Needs root (its own dockerd, scripts/docker_common.sh) and, like the
# README's setup, the build (scripts/build.sh: the server, keygen and
# prebuild it drives). The container reaches the Debian mirror for its
# packages; grpcio and protobuf are fetched here from PyPI for it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# shellcheck source=scripts/docker_common.sh
source scripts/docker_common.sh  # owns the EXIT trap: cleanups go through kf_on_exit
start=$SECONDS
phase() { echo "test_wheel: $1 ($((SECONDS - start)) s)"; }
scripts/build.sh
KFORGE=$root/${KFORGE_BUILD_DIR:-build}/cli/kforge
phase "built kforge"
scripts/build_wheel.sh --out .whl
phase "built the wheels"

work=$(mktemp -d /tmp/kforge_wheel_test.XXXXXX)
server_pid=""
kf_on_exit 'rm -rf "$work"'
kf_on_exit '[[ -z "$server_pid" ]] || kill -TERM "$server_pid" 2>/dev/null'
mkdir -p "$work/wheels" "$work/deps"
cp .whl/*.whl "$work/wheels/"
cp tests/wheel/check_installed.py "$work/"
arch=sm_90a

# TLS and a token, as tests/python_client_test.py makes them.
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${ec[@]}" -days 1 -subj "/CN=kforge wheel test ca" \
  -keyout "$work/ca.key" -out "$work/ca.pem" 2>/dev/null
openssl req "${ec[@]}" -subj /CN=localhost -keyout "$work/server.key" \
  -out "$work/server.csr" 2>/dev/null
echo "subjectAltName=IP:127.0.0.1,DNS:localhost" >"$work/server.ext"
openssl x509 -req -in "$work/server.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" \
  -CAcreateserial -days 1 -extfile "$work/server.ext" -out "$work/server.pem" 2>/dev/null
head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/token"
chmod 600 "$work/server.key" "$work/token"

# A signed one-kernel bundle.
"$KFORGE" keygen --out "$work/signer" >/dev/null
echo "{\"models\": [{\"preset\": \"glm-5\", \"tp\": [8]}], \"archs\": [\"$arch\"]}" >"$work/one.json"
"$KFORGE" prebuild "$work/one.json" --out "$work/bundle" -j 1 --sign "$work/signer.key" >/dev/null

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$KFORGE" serve --listen "127.0.0.1:$port" --cache-dir "$work/cache" --workers 1 \
  --tls-cert "$work/server.pem" --tls-key "$work/server.key" --auth-token-file "$work/token" \
  >"$work/server.log" 2>&1 &
server_pid=$!
phase "server on 127.0.0.1:$port (TLS, token), signed bundle made"

# What the container's pip installs beside the wheel, fetched here for its
# Python (Debian 12: CPython 3.11).
pip_tools=${KFORGE_WHEEL_TOOLS:-$HOME/.cache/kforge/wheel-tools}
"$pip_tools/bin/pip" download -q --only-binary=:all: --python-version 3.11 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$work/deps" grpcio protobuf

kf_docker_start wheel
kf_base_image kforge-bookworm-minbase
phase "docker daemon and base image ready"
chmod -R a+rX "$work/wheels" "$work/deps" "$work/bundle" "$work/check_installed.py" "$work/ca.pem"
docker run --rm --network host -v "$work:/in:ro" \
  -e KFORGE_SERVER="127.0.0.1:$port" -e KFORGE_TLS_CA=/in/ca.pem -e KFORGE_TOKEN_FILE=/in/token \
  -e WHEEL_CHECK_BUNDLE=/in/bundle -e WHEEL_CHECK_TRUST=/in/signer.pub -e WHEEL_CHECK_ARCH="$arch" \
  kforge-bookworm-minbase bash -euo pipefail -c '
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends python3 python3-pip python3-venv >/dev/null
    for p in libprotobuf32 libprotobuf-dev libabsl20220623 libabsl-dev libelf1 libelf-dev \
             libssl-dev libgrpc++1.51; do
      if dpkg-query -W -f="\${Status}" "$p" 2>/dev/null | grep -q "install ok installed"; then
        echo "the test image has $p installed" >&2; exit 1
      fi
    done
    echo "container: $(. /etc/os-release; echo "$PRETTY_NAME"), $(python3 --version), no protobuf/absl/libelf packages"
    python3 -m venv /venv
    /venv/bin/pip install -q --no-index --find-links /in/deps /in/wheels/kforge-*.whl
    # The plugin runs inside a vLLM (with torch) the user has; here only
    # that it installs beside kforge and names it as its dependency.
    /venv/bin/pip install -q --no-index --no-deps /in/wheels/kforge_vllm-*.whl
    /venv/bin/pip show kforge-vllm | grep "^Requires: .*kforge"
    /venv/bin/pip list 2>/dev/null | grep -i -E "^(kforge|grpcio|protobuf)"
    cd / && /venv/bin/python /in/check_installed.py'
phase "container check passed"
kill -TERM "$server_pid"
wait "$server_pid" || { echo "test_wheel: kforge serve exited $? on SIGTERM" >&2; exit 1; }
server_pid=""
kf_docker_stop
echo "test_wheel: passed in $((SECONDS - start)) s"
