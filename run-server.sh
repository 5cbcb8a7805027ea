#!/usr/bin/env bash
# One container, two apps: the serving tier and the API, supervised together.
#
# 1. Starts tensorflow_model_server if it is on PATH, else our compatible server
#    (python -m serving), with the same flags.
# 2. Waits until every model the config names reports a version AVAILABLE (polls model
#    status until SERVING_READY_TIMEOUT_S; no fixed sleep).
# 3. Starts gunicorn with uvicorn workers (gunicorn.conf.py) for the API, and waits for
#    its /readyz, printing the reason it gives while it is not ready (once per change).
# 4. Supervises: serving that exits is started again after a backoff (1, 2, 4, ... s, at
#    most 30 s), while the API stays up answering 503 serving_unavailable and /readyz
#    fails; more than SERVING_MAX_RESTARTS exits within SERVING_RESTART_WINDOW_S stop the
#    API too and the script exits non-zero, for the orchestrator to act on. The API
#    exiting stops serving and exits non-zero.
#
# Both tiers are sized from the CPUs this container may use (cgroup quota and affinity):
# `python -m api.ops.cpu_budget` splits them between API workers and serving's session threads,
# one TensorFlow thread each, so the two tiers never have more busy threads than CPUs
# (from 2 CPUs up; `make doctor` checks it).
# SIGTERM/SIGINT/SIGHUP stop both: the API first (it drains in-flight requests), then serving,
# and the script exits 0. Each tier runs in a session of its own (setsid), so a signal to this
# script's whole process group (Ctrl-C, a closed terminal, kill -- -PGID) reaches this script
# alone and the stop stays in that order: otherwise serving stopped under requests the API was
# still answering (503 serving_unavailable) and gunicorn's master took SIGINT as a quick
# shutdown (connections reset).
#
# Serving's REST and gRPC ports are bound to SERVING_BIND_HOST, loopback by default: in
# this mode only the API is meant to be reachable from outside the container. With python -m
# serving the API calls it over Unix-domain sockets in a private temporary folder instead
# (REST: --rest_api_socket_path, SERVING_SOCKET_PATH; gRPC: --grpc_socket_path, a unix:
# SERVING_GRPC_TARGETS): no TCP stack between the tiers. SERVING_UNIX_SOCKETS=0, or a
# SERVING_URL / SERVING_GRPC_TARGETS of your own, keeps TCP.
#
# Environment (defaults in brackets):
#   MODEL_CONFIG_FILE [models.config]  REST_API_PORT [8501]  GRPC_PORT [8500]
#   API_PORT [8000]  API_HOST [0.0.0.0]: the interface of the API's port, of its operational
#     port (API_OPS_BIND [${API_HOST}:9000]) and of the OIP gRPC port (OIP__GRPC_HOST [${API_HOST}])
#   WEB_CONCURRENCY [from the CPU budget]: API workers; serving gets the CPUs left
#   MODELS_DIR: when set, the config's "/models/" base_path prefix is rewritten to it
#   SERVING_HOST [127.0.0.1]: where serving's REST API is polled and called
#   SERVING_BIND_HOST [127.0.0.1]: serving's bind address (python -m serving only;
#     0.0.0.0 to expose serving's ports)
#   SERVING_MAX_RESTARTS [5]  SERVING_RESTART_WINDOW_S [60]
#   SERVING_READY_TIMEOUT_S [120]  PYTHON [python3]
#   SERVING_UNIX_SOCKETS [1]: 0 to call serving over TCP on loopback
#   SERVING_ARGS: extra flags for the model server (e.g. --enable_batching); its thread
#     flags win over the CPU budget's
#   MODEL_ROUTES [the examples: examples.fraud.route:route,examples.digits.route:route]: the
#     API's model routes, package.module:attribute, imported from PYTHONPATH and this folder
set -euo pipefail

MODEL_CONFIG_FILE=${MODEL_CONFIG_FILE:-models.config}
REST_API_PORT=${REST_API_PORT:-8501}
GRPC_PORT=${GRPC_PORT:-8500}
API_PORT=${API_PORT:-8000}
API_HOST=${API_HOST:-0.0.0.0}
SERVING_HOST=${SERVING_HOST:-127.0.0.1}
SERVING_READY_TIMEOUT_S=${SERVING_READY_TIMEOUT_S:-120}
SERVING_BIND_HOST=${SERVING_BIND_HOST:-127.0.0.1}
SERVING_MAX_RESTARTS=${SERVING_MAX_RESTARTS:-5}
SERVING_RESTART_WINDOW_S=${SERVING_RESTART_WINDOW_S:-60}
SERVING_UNIX_SOCKETS=${SERVING_UNIX_SOCKETS:-1}
PYTHON=${PYTHON:-python3}
# The examples' routes (examples/, beside this script), for the example models of models.config.
export MODEL_ROUTES=${MODEL_ROUTES:-examples.fraud.route:route,examples.digits.route:route}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

log() { echo "run-server: $*" >&2; }

[[ -f "$MODEL_CONFIG_FILE" ]] || { log "model config file not found: $MODEL_CONFIG_FILE"; exit 2; }

# A port already in use would make the readiness polls below talk to someone else's
# server; refuse to start instead. The operational port too (API_OPS_BIND, below): bound
# by another instance, it failed to bind here and the "API ready" line pointed at the
# other instance's /docs and /metrics.
ops_bind=${API_OPS_BIND-${API_HOST}:9000}
ports=("$GRPC_PORT" "$REST_API_PORT" "$API_PORT")
[[ -n "$ops_bind" ]] && ports+=("${ops_bind##*:}")
for port in "${ports[@]}"; do
  if "$PYTHON" -c "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 0.5)" "$port" 2>/dev/null; then
    log "port $port is already in use (another run-server.sh?); set GRPC_PORT / REST_API_PORT / API_PORT / API_OPS_BIND"
    exit 1
  fi
done
temp_files=()
socket_dir=
# The reason the API could not start, printed as the very last line (api/ops/start_failure.py).
export API_START_FAILURE_FILE=${API_START_FAILURE_FILE:-$(mktemp "${TMPDIR:-/tmp}/api-start-failure.XXXXXX")}
temp_files+=("$API_START_FAILURE_FILE")
trap 'rm -f "${temp_files[@]}"; if [[ -n "$socket_dir" ]]; then rm -rf "$socket_dir"; fi' EXIT
config=$MODEL_CONFIG_FILE
if [[ -n "${MODELS_DIR:-}" ]]; then
  models_dir=$(cd "$MODELS_DIR" && pwd)
  config=$(mktemp "${TMPDIR:-/tmp}/models.config.XXXXXX")
  temp_files+=("$config")
  sed "s#\"/models/#\"${models_dir}/#g" "$MODEL_CONFIG_FILE" > "$config"
fi
# The models to wait for: every model_config_list.config's name, parsed as the protobuf
# text format the file is (api/config/serving_config.py; no TensorFlow on this path).
names=$(cd "$HERE" && "$PYTHON" -m api.config.serving_config "$config") || { log "cannot read $MODEL_CONFIG_FILE"; exit 2; }
mapfile -t model_names <<< "$names"

serving_flags=(--port="$GRPC_PORT" --rest_api_port="$REST_API_PORT" --model_config_file="$config")
# The tiers' Unix-domain sockets (python -m serving only: tensorflow_model_server has no REST
# socket flag). Readiness is still polled on the REST port.
if [[ "$SERVING_UNIX_SOCKETS" == 1 ]] && ! command -v tensorflow_model_server >/dev/null 2>&1; then
  socket_dir=$(mktemp -d "${TMPDIR:-/tmp}/serving-sockets.XXXXXX")
  serving_flags+=(--rest_api_socket_path="$socket_dir/rest.sock" --grpc_socket_path="$socket_dir/grpc.sock")
fi
# python -m serving runs Session runs measured under 500 us on its event loop instead of
# handing them to a thread and back: at low load the fraud model's requests woke serving's
# threads 2.4 times instead of 7.1 (python -m bench --hop). SERVING_ARGS can set it to 0.
if ! command -v tensorflow_model_server >/dev/null 2>&1; then
  serving_flags+=(--session_run_inline_below_us=500)
fi

# The CPU budget of both tiers: sets WEB_CONCURRENCY, the API's thread variables,
# SERVING_BUDGET_FLAGS and SERVING_BUDGET_BATCHING (see api/ops/cpu_budget.py).
budget=$(cd "$HERE" && "$PYTHON" -m api.ops.cpu_budget) || { log "cannot size the tiers from the CPU budget"; exit 2; }
eval "$budget"
export WEB_CONCURRENCY OMP_NUM_THREADS MKL_NUM_THREADS OPENBLAS_NUM_THREADS
read -r -a budget_flags <<< "$SERVING_BUDGET_FLAGS"
serving_flags+=("${budget_flags[@]}")
if [[ -n "$SERVING_BUDGET_BATCHING" ]]; then
  batching=$(mktemp "${TMPDIR:-/tmp}/batching.config.XXXXXX")
  temp_files+=("$batching")
  printf '%s' "$SERVING_BUDGET_BATCHING" > "$batching"
  serving_flags+=(--batching_parameters_file="$batching")
fi
log "CPU budget: API ${WEB_CONCURRENCY} worker(s); serving ${budget_flags[*]:-(flags from SERVING_ARGS)}"
serving_pid=
api_pid=
backoff_pid=
waiter_pid=

# Runs "$@" in a session of its own (see the top: the group's signals are this script's to
# order). The caller is a background child, never a process group leader, so setsid(1)
# calls setsid() and execs without forking: $! stays the tier's pid, to wait on and signal.
# Output still goes to the inherited stdout/stderr (the terminal or the log).
own_session() {
  if command -v setsid >/dev/null 2>&1; then
    exec setsid "$@"
  fi
  exec "$PYTHON" -c 'import os, sys; os.setsid(); os.execvp(sys.argv[1], sys.argv[1:])' "$@"
}

# Starts the model server in the background; sets serving_pid. PROMETHEUS_MULTIPROC_DIR is
# the API's (gunicorn's workers share it): the model server, which also uses
# prometheus-client, must not write its metrics there (nor fail when it does not exist yet).
start_serving() {
  if command -v tensorflow_model_server >/dev/null 2>&1; then
    log "serving tier: tensorflow_model_server (it binds every interface: it has no bind-address flag)"
    (own_session env -u PROMETHEUS_MULTIPROC_DIR tensorflow_model_server "${serving_flags[@]}" ${SERVING_ARGS:-}) &
  else
    log "serving tier: python -m serving on ${SERVING_BIND_HOST} (tensorflow_model_server is not on PATH)"
    (cd "$HERE" && own_session env -u PROMETHEUS_MULTIPROC_DIR "$PYTHON" -m serving "${serving_flags[@]}" \
      --grpc_host="$SERVING_BIND_HOST" --rest_api_host="$SERVING_BIND_HOST" ${SERVING_ARGS:-}) &
  fi
  serving_pid=$!
}

# Serving exit times (in $SECONDS) within the restart window.
serving_exits=()

# Called when serving has exited: 0 after a backoff (restart it), 1 when it has exited
# more than SERVING_MAX_RESTARTS times within SERVING_RESTART_WINDOW_S (give up).
serving_restart_backoff() {
  local t recent=()
  for t in "${serving_exits[@]}" "$SECONDS"; do
    (( SECONDS - t < SERVING_RESTART_WINDOW_S )) && recent+=("$t")
  done
  serving_exits=("${recent[@]}")
  if (( ${#serving_exits[@]} > SERVING_MAX_RESTARTS )); then
    log "serving tier exited ${#serving_exits[@]} times within ${SERVING_RESTART_WINDOW_S}s; giving up"
    return 1
  fi
  local delay=$(( 1 << (${#serving_exits[@]} - 1) ))
  (( delay > 30 )) && delay=30
  log "serving tier exited; restarting it in ${delay}s (the API answers 503 meanwhile)"
  # In the background and waited for, so SIGTERM is handled during the backoff.
  sleep "$delay" &
  backoff_pid=$!
  wait "$backoff_pid" || true
  backoff_pid=
  return 0
}

start_serving

stop_all() {
  # Ignored, not reset: a second signal during the API's drain (make passing on a group's
  # SIGTERM, a second Ctrl-C) killed this shell there, and serving, in a session of its own,
  # was left running on its ports.
  trap '' TERM INT HUP
  [[ -n "$backoff_pid" ]] && { kill "$backoff_pid" 2>/dev/null || true; }
  [[ -n "$waiter_pid" ]] && { kill "$waiter_pid" 2>/dev/null || true; }
  if [[ -n "$api_pid" ]] && kill -0 "$api_pid" 2>/dev/null; then
    kill -TERM "$api_pid" 2>/dev/null || true
    wait "$api_pid" 2>/dev/null || true
  fi
  if kill -0 "$serving_pid" 2>/dev/null; then
    kill -TERM "$serving_pid" 2>/dev/null || true
    wait "$serving_pid" 2>/dev/null || true
  fi
}
# HUP too: a closed terminal stops both tiers cleanly rather than leaving them behind.
trap 'log "stopping"; stop_all; exit 0' TERM INT HUP

# Wait for every model to report a version AVAILABLE.
deadline=$((SECONDS + SERVING_READY_TIMEOUT_S))
for name in "${model_names[@]}"; do
  url="http://${SERVING_HOST}:${REST_API_PORT}/v1/models/${name}"
  until "$PYTHON" -c "import sys, urllib.request as u; sys.exit(b'\"AVAILABLE\"' not in u.urlopen(sys.argv[1], timeout=2).read())" "$url" 2>/dev/null; do
    if ! kill -0 "$serving_pid" 2>/dev/null; then
      wait "$serving_pid" || true
      log "serving tier exited before model '$name' became AVAILABLE"
      serving_restart_backoff || exit 1
      start_serving
      deadline=$((SECONDS + SERVING_READY_TIMEOUT_S))
      continue
    fi
    if (( SECONDS >= deadline )); then
      stop_all
      log "model '$name' not AVAILABLE after ${SERVING_READY_TIMEOUT_S}s (SERVING_READY_TIMEOUT_S); serving's log above says why"
      exit 1
    fi
    sleep 0.2
  done
  log "model '$name' AVAILABLE"
done

if [[ -n "$socket_dir" && -z "${SERVING_URL:-}" ]]; then
  export SERVING_SOCKET_PATH="$socket_dir/rest.sock"
fi
if [[ -n "$socket_dir" && -z "${SERVING_GRPC_TARGETS:-}" ]]; then
  export SERVING_GRPC_TARGETS="unix:$socket_dir/grpc.sock"
fi
# The models serving's config names, for the API's message about a route whose model it lacks.
export SERVING_MODEL_CONFIG_FILE=${SERVING_MODEL_CONFIG_FILE:-$(cd "$(dirname "$config")" && pwd)/$(basename "$config")}
export SERVING_URL=${SERVING_URL:-http://${SERVING_HOST}:${REST_API_PORT}}
# The API's gRPC target follows GRPC_PORT too (used when SERVING_PROTOCOL=grpc).
export SERVING_GRPC_TARGETS=${SERVING_GRPC_TARGETS:-${SERVING_HOST}:${GRPC_PORT}}
export API_BIND="${API_HOST}:${API_PORT}"
# /metrics, /docs, /openapi.json (gunicorn.conf.py's operational port) on the API's interface:
# API_HOST=127.0.0.1 keeps them local too. API_OPS_BIND= (empty) serves them on API_PORT.
export API_OPS_BIND="$ops_bind"
# The OIP gRPC port (OIP__MODELS, OIP__GRPC_PORT) on the same interface.
export OIP__GRPC_HOST="${OIP__GRPC_HOST:-${API_HOST}}"
(cd "$HERE" && own_session "$PYTHON" -m gunicorn -c gunicorn.conf.py 'api.app:create_app()') &
api_pid=$!

# Report readiness once the API itself answers /readyz; meanwhile print the reason it
# gives, once per change (api/ops/readiness_wait.py; it polls every 2 s at most, so its own
# requests do not fill the access log). In the background and waited for together with
# the API, so the API exiting, or SIGTERM, ends the wait at once.
api_url="http://127.0.0.1:${API_PORT}"
ready_timeout_s=$(( deadline + 60 - SECONDS ))
(cd "$HERE" && exec "$PYTHON" -m api.ops.readiness_wait "$api_url/readyz" --timeout-s "$ready_timeout_s") &
waiter_pid=$!
waited=0
wait -n "$waiter_pid" "$api_pid" || waited=$?
if ! kill -0 "$api_pid" 2>/dev/null; then
  stop_all
  log "API exited before it was ready: $(cat "$API_START_FAILURE_FILE" 2>/dev/null || true)"
  exit 1
fi
waiter_pid=
if (( waited != 0 )); then
  stop_all
  log "API not ready within ${ready_timeout_s}s (SERVING_READY_TIMEOUT_S + 60): $(cat "$API_START_FAILURE_FILE" 2>/dev/null || true)"
  exit 1
fi
if [[ "${SERVING_PROTOCOL:-rest}" == "grpc" ]]; then
  serving_at="gRPC $SERVING_GRPC_TARGETS"
elif [[ -n "${SERVING_SOCKET_PATH:-}" ]]; then
  serving_at="unix:$SERVING_SOCKET_PATH"
else
  serving_at="$SERVING_URL"
fi
# /docs, /openapi.json and /metrics: the operational port (gunicorn.conf.py; API_OPS_BIND=
# serves them on the API's own port).
docs_url="${api_url}/docs"
[[ -n "$API_OPS_BIND" ]] && docs_url="http://127.0.0.1:${API_OPS_BIND##*:}/docs"
log "API ready on ${api_url} (serving at ${serving_at}); routes and schemas: ${docs_url}"
if [[ ",${MODEL_ROUTES}," == *",examples.fraud.route:route,"* ]]; then
  log "Try: curl -s -X POST ${api_url}/v1/fraud/score -H 'content-type: application/json' -d @examples/transaction.json"
fi

# Supervise: serving is restarted (with backoff, a bounded number of times); the API
# exiting ends everything. A tier that exits 0 was told to stop (both exit 0 on SIGINT or
# SIGTERM, e.g. a signal sent to the tier's own process): a clean exit is a stop, not a
# crash to restart.
set +e
while true; do
  wait -n "$serving_pid" "$api_pid"
  status=$?
  if (( status == 0 )); then
    log "stopping (a tier exited 0: it was told to stop)"
    stop_all
    exit 0
  fi
  if ! kill -0 "$api_pid" 2>/dev/null; then
    log "the API exited (status $status); stopping serving"
    stop_all
    exit $(( status == 0 ? 1 : status ))
  fi
  if ! kill -0 "$serving_pid" 2>/dev/null; then
    log "serving tier exited (status $status)"
    if ! serving_restart_backoff; then
      stop_all
      exit 1
    fi
    start_serving
  fi
done
