#!/usr/bin/env bash
# Builds the stack's images: the API and the API with the example routes (Dockerfile's `api` and
# `examples` targets) and our model server (Dockerfile.serving).
#
#   deploy/compose/build-images.sh
#
# Both Dockerfiles start FROM python:3.11-slim. With Docker, or podman on a host that can
# reach Docker Hub, that image is pulled as usual. On a podman host that cannot reach any
# container registry (air-gapped CI), a stand-in is made from the Debian archive this host's
# apt already uses: a minbase Debian rootfs (mmdebstrap) with python3 (3.11 on bookworm) and a
# venv at /usr/local, so `python` and `pip` are where python:3.11-slim has them, plus this
# host's CA certificates and a pip config using them (so `pip install` inside a build works
# where the host's egress re-signs TLS). It is tagged docker.io/library/python:3.11-slim
# locally and the Dockerfiles build unchanged. Such a stand-in is for local tests only:
# never push it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=deploy/compose/engine.sh
source deploy/compose/engine.sh
engine_setup

BASE_IMAGE=docker.io/library/python:3.11-slim

build_base_from_debian() {
  local suite sources work
  suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
  sources=$(ls /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 || true)
  [[ -n "$sources" ]] || sources=/etc/apt/sources.list
  work=$(mktemp -d)
  engine_log "building a local stand-in for $BASE_IMAGE from Debian $suite ($sources), about 60 s"
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
    --customize-hook='mkdir -p "$1/usr/local/share/ca-certificates"' \
    --customize-hook='for f in /usr/local/share/ca-certificates/*.crt; do [ -e "$f" ] && cp "$f" "$1/usr/local/share/ca-certificates/"; done; true' \
    --customize-hook='chroot "$1" update-ca-certificates >/dev/null' \
    --customize-hook='printf "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n" > "$1/etc/pip.conf"' \
    --customize-hook='chroot "$1" python3 -m venv /usr/local' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    "$suite" "$work/rootfs.tar" "$sources"
  podman import --quiet \
    --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    "$work/rootfs.tar" "$BASE_IMAGE" >/dev/null
  rm -rf "$work"
}

if [[ "$ENGINE" == podman ]] && ! podman image exists "$BASE_IMAGE"; then
  if ! timeout 60 podman pull --quiet "$BASE_IMAGE" >/dev/null 2>&1; then
    engine_log "cannot pull $BASE_IMAGE (no registry reachable)"
    build_base_from_debian
  fi
fi

started=$SECONDS
engine_log "building the API image, the API image with the examples, and our model server's image (profile build)"
"${COMPOSE[@]}" --profile build build api-image api serving-image
engine_log "images built in $((SECONDS - started)) s"
