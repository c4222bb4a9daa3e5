#!/usr/bin/env bash
# Builds the kforge image (Dockerfile) with a private dockerd and checks it
# as a deployment would use it:
#   1. host network, gRPC and metrics on loopback ports: docker's
#      HEALTHCHECK (kforge health) turns healthy, the server runs as a
#      non-root user, the host's `kforge get` (build/cli/kforge, else the
#      image's CLI) fetches a kernel through it, metrics answer, and
#      `docker stop` during a second compile lets it finish (drain);
#   2. the image's own defaults (0.0.0.0:50051, metrics 0.0.0.0:9464) in a
#      container with no network but its loopback, on the same cache
#      volume: healthy, and the kernel of run 1 is a disk cache hit;
# each container must exit 0 on `docker stop` (SIGTERM). Prints the image
# size and how long each phase took. Needs root (dockerd) and the CUDA
# toolkit in ${KFORGE_CUDA_ROOT:-/usr/local/cuda}.
#
#   scripts/test_image.sh [--fresh] [--git-ref REF] [--target STAGE]
#     --fresh        start from an empty daemon data root (no layer cache)
#     --git-ref REF  build from a commit (git archive) instead of the work tree
#     --target STAGE only build up to STAGE (deps, build, runtime) and stop
#   BUILD_BASE / RUNTIME_BASE: base images to use instead of the local ones
#   made here from Debian bookworm plus this machine's CUDA toolkit.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
# shellcheck source=scripts/docker_common.sh
source scripts/docker_common.sh

git_ref="" target=""
while [ $# -gt 0 ]; do
  case "$1" in
    --fresh) export KF_DOCKER_FRESH=1 ;;
    --git-ref) git_ref=${2:?--git-ref REF}; shift ;;
    --target) target=${2:?--target STAGE}; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "test_image.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done

image=kforge:test
cuda=$(readlink -f "${KFORGE_CUDA_ROOT:-/usr/local/cuda}")
work=$(mktemp -d /var/tmp/kforge-image-test.XXXXXX)
build_log=/tmp/kforge-image-build.log
: >"$build_log"
kf_on_exit 'rm -rf "$work"'

phases=()
phase_start=0 phase_name=""
phase() {
  local now=$SECONDS
  [ -n "$phase_name" ] && phases+=("$(printf '%-42s %5d s' "$phase_name" $((now - phase_start)))")
  phase_name=$1 phase_start=$now
  [ -n "$phase_name" ] && kf_log "== $phase_name"
  return 0
}
fail() {
  kf_log "FAIL: $*"
  exit 1
}

# --- the daemon and the local base images ---------------------------------
phase "start dockerd"
kf_docker_start kforge-image

if [ -z "${BUILD_BASE:-}" ] || [ -z "${RUNTIME_BASE:-}" ]; then
  phase "base images (minbase + CUDA)"
  kf_base_image kforge-local/bookworm-minbase
  ver=$(basename "$cuda")   # cuda-13.0
  ver=${ver#cuda-}
  # Only what the build needs (headers, NVRTC, the driver stub) and what
  # the server needs at run time (NVRTC and its builtins).
  for f in include/nvrtc.h include/cuda.h lib64/libnvrtc.so lib64/stubs/libcuda.so; do
    [ -e "$cuda/$f" ] || fail "$cuda/$f is missing: needs the CUDA toolkit (KFORGE_CUDA_ROOT)"
  done
  mkdir -p "$work/devel/cuda/lib64/stubs" "$work/runtime/cuda/lib64"
  cp -a "$cuda/include" "$work/devel/cuda/"
  cp -a "$cuda"/lib64/libnvrtc.so* "$cuda"/lib64/libnvrtc-builtins.so* "$work/devel/cuda/lib64/"
  cp -a "$cuda/lib64/stubs/libcuda.so" "$work/devel/cuda/lib64/stubs/"
  cp -a "$cuda"/lib64/libnvrtc.so* "$cuda"/lib64/libnvrtc-builtins.so* "$work/runtime/cuda/lib64/"
  for kind in devel runtime; do
    tag=kforge-local/cuda-$kind:$ver
    if ! docker image inspect "$tag" >/dev/null 2>&1; then
      kf_log "making $tag ($(du -sh "$work/$kind" | cut -f1) of $cuda)"
      DOCKER_BUILDKIT=0 docker build --network host -t "$tag" -f - "$work/$kind" \
        >>"$build_log" 2>&1 <<EOF || fail "docker build $tag (log: $build_log)"
FROM kforge-local/bookworm-minbase
COPY cuda /usr/local/cuda-$ver
RUN ln -s cuda-$ver /usr/local/cuda \
 && echo /usr/local/cuda/lib64 > /etc/ld.so.conf.d/cuda.conf && ldconfig
ENV PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
EOF
    fi
  done
  BUILD_BASE=${BUILD_BASE:-kforge-local/cuda-devel:$ver}
  RUNTIME_BASE=${RUNTIME_BASE:-kforge-local/cuda-runtime:$ver}
fi

# --- the image -------------------------------------------------------------
context=$repo
if [ -n "$git_ref" ]; then
  context=$work/context
  mkdir -p "$context"
  git archive "$git_ref" | tar -x -C "$context"
fi
build_args=(--network host --build-arg "BUILD_BASE=$BUILD_BASE" --build-arg "RUNTIME_BASE=$RUNTIME_BASE")
run_build() { # STAGE TAG
  if ! DOCKER_BUILDKIT=0 docker build "${build_args[@]}" --target "$1" -t "$2" \
    -f "$context/Dockerfile" "$context" >>"$build_log" 2>&1; then
    tail -n 40 "$build_log" >&2
    fail "docker build --target $1 (log: $build_log)"
  fi
}
kf_log "bases: $BUILD_BASE, $RUNTIME_BASE; build log: $build_log"
phase "image: deps stage (install_deps.sh)"
run_build deps kforge:test-deps
[ "$target" = deps ] && { phase ""; printf '%s\n' "${phases[@]}"; exit 0; }
phase "image: build stage (build.sh kforge)"
run_build build kforge:test-build
[ "$target" = build ] && { phase ""; printf '%s\n' "${phases[@]}"; exit 0; }
phase "image: runtime stage"
run_build runtime "$image"
image_bytes=$(docker image inspect -f '{{.Size}}' "$image")
base_bytes=$(docker image inspect -f '{{.Size}}' "$RUNTIME_BASE")
[ "$target" = runtime ] && { phase ""; printf '%s\n' "${phases[@]}"; exit 0; }

# --- 1: host network, loopback ports, the host's client --------------------
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
port=$(free_port) metrics_port=$(free_port)
volume=kforge-test-cache-$$
container=kforge-test-$$
kf_on_exit 'docker rm -f "$container" "$container-2" >/dev/null 2>&1; docker volume rm -f "$volume" >/dev/null 2>&1'

wait_healthy() { # CONTAINER
  local i status
  for ((i = 0; i < 90; i++)); do
    status=$(docker inspect -f '{{.State.Health.Status}}' "$1")
    [ "$status" = healthy ] && return 0
    if [ "$(docker inspect -f '{{.State.Running}}' "$1")" != true ]; then
      docker logs "$1" >&2 || true
      fail "$1 exited while waiting for healthy"
    fi
    sleep 1
  done
  docker inspect -f '{{json .State.Health}}' "$1" >&2
  fail "$1 not healthy after 90 s (health: $status)"
}
stop_expect_zero() { # CONTAINER
  docker stop -t 150 "$1" >/dev/null
  local code
  code=$(docker inspect -f '{{.State.ExitCode}}' "$1")
  docker logs "$1" >"$work/$1.log" 2>&1 || true
  if [ "$code" != 0 ]; then
    tail -n 30 "$work/$1.log" >&2
    fail "$1 exited $code after docker stop (SIGTERM), expected 0"
  fi
  kf_log "$1: exit code 0 after docker stop; last log line: $(tail -n 1 "$work/$1.log")"
}
# The client: the host's build if there is one, else the image's CLI in a
# container of its own (not `docker exec`: a process exec'd into the server's
# container dies with the server, mid-drain).
host_cli=$repo/${KFORGE_BUILD_DIR:-build}/cli/kforge
client_get() { # OUT_DIR ARGS...
  local dir=$1
  shift
  mkdir -p "$dir"
  if [ -x "$host_cli" ]; then
    "$host_cli" get --server "127.0.0.1:$port" -o "$dir" "$@"
  else
    docker run --rm --network host -u 0 -v "$dir:/out" "$image" \
      get --server "127.0.0.1:$port" -o /out "$@"
  fi
}
server_stat() { # CONTAINER COUNTER
  docker exec "$1" kforge stats | sed -n "s/^ *\"$2\": \([0-9]*\).*/\1/p"
}

phase "run 1: start until healthy"
# A drain longer than any compile here, so that the stop below must wait.
docker run -d --name "$container" --network host --stop-timeout 150 \
  -e "KFORGE_LISTEN=127.0.0.1:$port" -e "KFORGE_SERVER=127.0.0.1:$port" \
  -e "KFORGE_METRICS_LISTEN=127.0.0.1:$metrics_port" -e KFORGE_SHUTDOWN_GRACE=120s \
  -v "$volume:/var/cache/kforge" "$image" >/dev/null
wait_healthy "$container"
[ "$(docker exec "$container" id -u)" = 10001 ] || fail "the server does not run as uid 10001"
if docker exec "$container" kforge health --server 127.0.0.1:1 --timeout 2s >/dev/null 2>&1; then
  fail "kforge health exited 0 for a port nothing listens on"
fi

phase "run 1: kforge get (compile)"
kf_log "client: $([ -x "$host_cli" ] && echo "$host_cli" || echo "the image's kforge")"
client_get "$work/get1" --preset glm-5 --tp 8 --arch sm_120a
description=$(ls "$work"/get1/*.json)  # one module: its image 0 beside it
cubin=${description%.json}.cubin
[ "$(head -c 4 "$cubin" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] || fail "$cubin is not an ELF file"
kf_log "got $(basename "$cubin") ($(stat -c %s "$cubin") bytes)"
metrics=$(curl -sf "http://127.0.0.1:$metrics_port/metrics") || fail "no metrics on 127.0.0.1:$metrics_port"
grep -q '^kforge_' <<<"$metrics" || fail "the metrics hold no kforge_ series"

phase "run 1: docker stop during a compile"
client_get "$work/get2" --preset glm-5 --tp 8 --arch sm_90a >"$work/get2.txt" 2>&1 &
get_pid=$!
# Stop once the server is compiling, not before.
for ((i = 0; i < 150; i++)); do
  [ "$(server_stat "$container" in_flight_compiles)" -ge 1 ] 2>/dev/null && break
  sleep 0.2
done
[ "$i" -lt 150 ] || fail "the second compile never started"
kf_log "compile in flight; docker stop"
stop_expect_zero "$container"
# The drain, in the server's words: SIGTERM first, the compile's end after.
awk '/SIGTERM: shutting down/ { t = NR } /compiled .*_sm90a / && t { ok = 1 } END { exit !ok }' \
  "$work/$container.log" || {
  cat "$work/$container.log" >&2
  fail "the server's log does not show the sm_90a compile ending after SIGTERM"
}
wait "$get_pid" || { cat "$work/get2.txt" >&2; fail "the in-flight get failed during the drain"; }
ls "$work"/get2/*sm90a.cubin >/dev/null || fail "the in-flight get wrote no sm_90a cubin"
kf_log "in-flight get finished during the drain: $(tail -n 1 "$work/get2.txt")"

# --- 2: the image's defaults, no network but loopback ----------------------
phase "run 2: defaults, start until healthy"
docker run -d --name "$container-2" --network none --stop-timeout 150 \
  -v "$volume:/var/cache/kforge" "$image" >/dev/null
wait_healthy "$container-2"
docker exec "$container-2" bash -c 'exec 3<>/dev/tcp/127.0.0.1/9464' ||
  fail "no metrics listener on the default port 9464"
phase "run 2: kforge get --lookup-only (volume)"
docker exec "$container-2" kforge get --lookup-only --preset glm-5 --tp 8 --arch sm_120a -o /tmp/get ||
  fail "the kernel compiled in run 1 is not in the cache volume"
[ "$(server_stat "$container-2" disk_hits)" = 1 ] || fail "expected one disk cache hit"
phase "run 2: docker stop"
stop_expect_zero "$container-2"
phase ""

echo
echo "image $image: $((image_bytes / 1024 / 1024)) MiB (runtime base $RUNTIME_BASE: $((base_bytes / 1024 / 1024)) MiB, kforge's layers $(((image_bytes - base_bytes) / 1024 / 1024)) MiB)"
printf '%s\n' "${phases[@]}"
echo "test_image: passed"
