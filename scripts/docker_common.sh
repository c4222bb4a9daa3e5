# shellcheck shell=bash
# Sourceable helpers for scripts that need a Docker daemon of their own
# (scripts/test_image.sh, the wheel test): no registry is reachable from the
# development and CI machines, and several such scripts may run at once, so
# each starts a private dockerd and makes its base image from Debian packages.
#
#   source scripts/docker_common.sh
#   kf_docker_start NAME      # private dockerd; exports DOCKER_HOST; stopped on exit
#   kf_base_image TAG         # Debian bookworm minbase image TAG (made once, cached)
#   kf_on_exit 'command'      # run at exit, before the daemon stops (LIFO)
#   kf_docker_stop            # stop the daemon now (also done at exit)
#
# Each NAME has its own data root (/var/lib/kforge-docker/NAME, kept between
# runs as a layer cache; KF_DOCKER_FRESH=1 wipes it first), exec root,
# pidfile, socket (unix:///run/kforge-docker-NAME.sock), containerd
# namespace and log (/tmp/kforge-docker-NAME.log). There is no bridge and no
# iptables: containers and builds use `--network host`. Needs root. The
# calling script owns the EXIT trap through kf_on_exit: do not set your own
# `trap ... EXIT` after sourcing this file.

KF_DOCKER_NAME=""
KF_DOCKER_PID=""
KF_EXIT_HOOKS=()

kf_log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }

kf_on_exit() { KF_EXIT_HOOKS+=("$1"); }

kf__run_exit_hooks() {
  local rc=$? i
  trap - EXIT
  for ((i = ${#KF_EXIT_HOOKS[@]} - 1; i >= 0; i--)); do
    eval "${KF_EXIT_HOOKS[$i]}" || true
  done
  KF_EXIT_HOOKS=()
  kf_docker_stop || true
  exit "$rc"
}
trap kf__run_exit_hooks EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Installs Debian packages that are missing (apt-get update once, first).
kf_apt_ensure() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  kf_log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

kf_docker_start() {
  local name=${1:?kf_docker_start NAME}
  if [[ ! $name =~ ^[a-z0-9][a-z0-9_-]{0,30}$ ]]; then
    kf_log "kf_docker_start: NAME must match [a-z0-9][a-z0-9_-]{0,30}, got '$name'"
    return 2
  fi
  if [ "$(id -u)" -ne 0 ]; then
    kf_log "kf_docker_start: needs root (dockerd)"
    return 1
  fi
  if [ -n "$KF_DOCKER_PID" ]; then
    kf_log "kf_docker_start: daemon '$KF_DOCKER_NAME' already started by this script"
    return 1
  fi
  kf_apt_ensure docker.io debootstrap
  local data_root=/var/lib/kforge-docker/$name
  local exec_root=/run/kforge-docker-$name.exec
  local pidfile=/run/kforge-docker-$name.pid
  local sock=/run/kforge-docker-$name.sock
  local log=/tmp/kforge-docker-$name.log
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    kf_log "kf_docker_start: a dockerd for '$name' is already running (pid $(cat "$pidfile")); pick another NAME or stop it"
    return 1
  fi
  if [ "${KF_DOCKER_FRESH:-0}" = 1 ]; then
    kf_log "removing $data_root (KF_DOCKER_FRESH=1)"
    rm -rf "$data_root"
  fi
  mkdir -p "$data_root" "$exec_root"
  rm -f "$sock" "$pidfile"
  # A distinct containerd namespace too: if a system containerd runs,
  # every dockerd shares it, and each must see only its own containers.
  dockerd --data-root "$data_root" --exec-root "$exec_root" --pidfile "$pidfile" \
    -H "unix://$sock" --storage-driver=vfs --bridge=none --iptables=false \
    --ip-masq=false --containerd-namespace "kforge-$name" \
    --containerd-plugins-namespace "kforge-$name-plugins" >"$log" 2>&1 &
  KF_DOCKER_PID=$!
  KF_DOCKER_NAME=$name
  export DOCKER_HOST=unix://$sock
  local i
  for ((i = 0; i < 120; i++)); do
    if docker info >/dev/null 2>&1; then
      kf_log "dockerd '$name' up (pid $KF_DOCKER_PID, $DOCKER_HOST, log $log)"
      return 0
    fi
    if ! kill -0 "$KF_DOCKER_PID" 2>/dev/null; then break; fi
    sleep 0.5
  done
  kf_log "kf_docker_start: dockerd '$name' did not come up; last lines of $log:"
  tail -n 20 "$log" >&2
  kf_docker_stop
  return 1
}

kf_docker_stop() {
  [ -n "$KF_DOCKER_PID" ] || return 0
  local pid=$KF_DOCKER_PID i
  KF_DOCKER_PID=""
  if kill -TERM "$pid" 2>/dev/null; then
    for ((i = 0; i < 60; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
      kf_log "dockerd '$KF_DOCKER_NAME' ignored SIGTERM for 30 s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  wait "$pid" 2>/dev/null || true
  kf_log "dockerd '$KF_DOCKER_NAME' stopped"
  unset DOCKER_HOST
  KF_DOCKER_NAME=""
}

# The minbase tarball is made once per machine (debootstrap takes minutes)
# and shared by every script and daemon; a lock keeps two scripts from
# making it at the same time.
KF_BASE_TAR=${KF_BASE_TAR:-$HOME/.cache/kforge/docker/bookworm-minbase.tar}

kf_base_tarball() {
  local dir
  dir=$(dirname "$KF_BASE_TAR")
  mkdir -p "$dir"
  (
    flock 9
    # The tarball's root entry must be 0755: a 0700 "/" (mktemp's mode, as
    # an earlier version of this file left it) lets only root exec anything
    # in the image. Such a tarball is repaired in place.
    if [ -s "$KF_BASE_TAR" ]; then
      [ "$(tar -tvf "$KF_BASE_TAR" | head -n 1 | cut -c1-10)" = drwxr-xr-x ] && exit 0
      kf_log "repairing $KF_BASE_TAR (its / is not mode 0755)"
      local fix
      fix=$(mktemp -d /var/tmp/kforge-minbase.XXXXXX)
      trap 'rm -rf "$fix"' EXIT
      tar --numeric-owner -xpf "$KF_BASE_TAR" -C "$fix"
      chmod 0755 "$fix"
      tar --numeric-owner -C "$fix" -cf "$KF_BASE_TAR.tmp.$$" .
      mv "$KF_BASE_TAR.tmp.$$" "$KF_BASE_TAR"
      exit 0
    fi
    kf_apt_ensure debootstrap
    local root
    root=$(mktemp -d /var/tmp/kforge-minbase.XXXXXX)
    trap 'rm -rf "$root"' EXIT
    kf_log "debootstrap --variant=minbase bookworm (once; cached at $KF_BASE_TAR)"
    debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >"$dir/debootstrap.log" 2>&1 || {
      tail -n 20 "$dir/debootstrap.log" >&2
      exit 1
    }
    # Same sources as a stock Debian image: the release, its updates and
    # security; apt caches emptied.
    cat >"$root/etc/apt/sources.list" <<'EOF'
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
    chmod 0755 "$root"
    tar --numeric-owner -C "$root" -cf "$KF_BASE_TAR.tmp.$$" .
    mv "$KF_BASE_TAR.tmp.$$" "$KF_BASE_TAR"
  ) 9>"$dir/.lock"
}

# The label marks images made from a good tarball (/ mode 0755); an image
# without it is imported again.
KF_BASE_LABEL=org.kforge.minbase=2

kf_base_image() {
  local tag=${1:?kf_base_image TAG}
  if [ "$(docker image inspect -f '{{index .Config.Labels "org.kforge.minbase"}}' "$tag" 2>/dev/null)" \
    = "${KF_BASE_LABEL#*=}" ]; then
    return 0
  fi
  kf_base_tarball || return 1
  kf_log "importing $KF_BASE_TAR as $tag"
  docker import -c 'CMD ["/bin/bash"]' -c "LABEL $KF_BASE_LABEL" - "$tag" <"$KF_BASE_TAR" >/dev/null
}
