#!/usr/bin/env bash
# Serving's health check in compose and Kubernetes: every model the mounted model config names
# has a version AVAILABLE (TF Serving's model status API), so the check follows the config
# instead of a list of names written here.
#
#   bash /config/models-available.sh [CONFIG [PORT]]            # ready: every model AVAILABLE
#   bash /config/models-available.sh --answers [CONFIG [PORT]]  # alive: the REST port answers HTTP
#
# CONFIG [/config/models.config]: TF Serving's ModelServerConfig (text format); the model names
# are its `name:` fields (the only field of that name in ModelConfig), comments left out.
# PORT [8501]: serving's REST port, asked on 127.0.0.1 over bash's /dev/tcp (the official
# image has bash, grep and sed but no curl). Exit 0, or 1 with the reason on stderr.
set -u
mode=ready
if [[ "${1:-}" == --answers ]]; then mode=answers; shift; fi
config=${1:-/config/models.config}
port=${2:-8501}

names=$(sed -e 's/#.*//' "$config" 2>/dev/null \
  | grep -oE "(^|[^_[:alnum:]])name[[:space:]]*:[[:space:]]*[\"'][^\"']+[\"']" \
  | sed -E "s/.*[\"']([^\"']+)[\"']$/\1/")
if [[ -z "$names" ]]; then
  echo "models-available: no model names in $config" >&2
  exit 1
fi

for name in $names; do
  if ! exec 3<>"/dev/tcp/127.0.0.1/$port"; then
    echo "models-available: nothing answers on port $port" >&2
    exit 1
  fi
  printf 'GET /v1/models/%s HTTP/1.0\r\n\r\n' "$name" >&3
  answer=$(cat <&3)
  exec 3<&-
  if [[ "$mode" == answers ]]; then
    [[ "$answer" == HTTP/* ]] && exit 0
    echo "models-available: port $port answered no HTTP" >&2
    exit 1
  fi
  if [[ "$answer" != *'"AVAILABLE"'* ]]; then
    echo "models-available: model '$name' has no version AVAILABLE" >&2
    exit 1
  fi
done
exit 0
