# shellcheck shell=bash
# Sourced by the compose scripts: picks the container engine and the compose tool.
#
#   source deploy/compose/engine.sh && engine_setup
#
# Sets ENGINE (docker or podman) and COMPOSE (an array: the compose command). A podman API
# service started here is stopped when the sourcing script exits (trap on EXIT).
# - A running Docker engine (`docker info` answers): ENGINE=docker, COMPOSE=`docker compose`
#   (or the standalone `docker-compose`).
# - Otherwise rootful podman from Debian's packages, driven by Debian's docker-compose 1.29
#   through podman's Docker-API socket. As root on a host with apt-get, what is missing is
#   installed and configured here; otherwise the one command to run is printed.
#   What podman needs on these hosts (each found by running this project's stack on them):
#   * containers.conf: `default_ulimits` with nofile at the hard limit the caller already
#     has (a rootful container cannot raise it: "setrlimit RLIMIT_NOFILE: Operation not
#     permitted"), and `runtime = "runc"` (crun refuses hosts with a hybrid cgroup v1/v2
#     layout).
#   * PID 1 is often not systemd in CI containers, so podman's healthcheck timers never
#     fire: the compose test (compose_test.py) runs `podman healthcheck run` while the stack
#     is up.
#   * Debian's podman-compose 1.0.3 mangles healthchecks and ignores --scale and
#     depends_on conditions; docker-compose 1.29 over the socket handles all three.

PODMAN_PACKAGES=(podman runc conmon netavark aardvark-dns iptables catatonit containers-storage
                 uidmap slirp4netns mmdebstrap docker-compose)
PODMAN_SOCKET=/run/podman/podman.sock

engine_log() { echo "compose: $*" >&2; }

_docker_engine_up() {
  command -v docker >/dev/null 2>&1 && [[ -z "${DOCKER_HOST:-}" ]] && docker info >/dev/null 2>&1
}

_install_podman() {
  local missing=()
  local pkg
  for pkg in "${PODMAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    engine_log "no Docker engine and no podman; as root run: apt-get install -y ${PODMAN_PACKAGES[*]}"
    return 2
  fi
  engine_log "installing ${missing[*]} (Debian packages, about 45 s)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; }
}

_configure_podman() {
  local conf=/etc/containers/containers.conf
  local nofile
  nofile=$(ulimit -Hn)
  [[ "$nofile" == unlimited ]] && nofile=1048576
  if ! grep -q '^# tfserve-split compose' "$conf" 2>/dev/null; then
    if [[ -s "$conf" ]] && grep -Eq '^\[(containers|engine)\]' "$conf"; then
      engine_log "$conf already has [containers]/[engine] sections; not changing it"
      engine_log "it needs: default_ulimits = [\"nofile=$nofile:$nofile\"] and runtime = \"runc\""
    else
      mkdir -p /etc/containers
      cat >>"$conf" <<CONF
# tfserve-split compose: nofile at the caller's hard limit (rootful podman cannot raise it),
# runc (crun refuses hybrid cgroup v1/v2 hosts).
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=32768:32768"]

[engine]
runtime = "runc"
CONF
    fi
  fi
  if ! curl -fsS --unix-socket "$PODMAN_SOCKET" http://d/_ping >/dev/null 2>&1; then
    mkdir -p "$(dirname "$PODMAN_SOCKET")"
    podman system service --time=0 "unix://$PODMAN_SOCKET" >/tmp/podman-service.log 2>&1 &
    PODMAN_SERVICE_PID=$!  # stopped by engine_cleanup: only the service this shell started
    local i
    for i in $(seq 1 100); do
      curl -fsS --unix-socket "$PODMAN_SOCKET" http://d/_ping >/dev/null 2>&1 && break
      sleep 0.1
    done
  fi
  export DOCKER_HOST="unix://$PODMAN_SOCKET"
}

engine_cleanup() {
  if [[ -n "${PODMAN_SERVICE_PID:-}" ]]; then
    kill "$PODMAN_SERVICE_PID" 2>/dev/null || true
    wait "$PODMAN_SERVICE_PID" 2>/dev/null || true
    PODMAN_SERVICE_PID=
  fi
}

engine_setup() {
  trap engine_cleanup EXIT
  if _docker_engine_up; then
    ENGINE=docker
    if docker compose version >/dev/null 2>&1; then COMPOSE=(docker compose); else COMPOSE=(docker-compose); fi
  else
    _install_podman || return $?
    _configure_podman
    ENGINE=podman
    COMPOSE=(docker-compose)
  fi
  export ENGINE
  engine_log "engine: $ENGINE ($("$ENGINE" --version | head -n1)); compose: ${COMPOSE[*]} ($("${COMPOSE[@]}" version --short 2>/dev/null || true))"
}
