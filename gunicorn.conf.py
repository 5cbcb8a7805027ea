"""gunicorn settings for the API tier (`gunicorn -c gunicorn.conf.py 'api.app:create_app()'`).

Connections: each worker is `api.http_server.worker.ApiUvicornWorker`, uvicorn's worker
running `api.http_server.ApiHttpProtocol`, which enforces gunicorn's `limit_request_line`
(414), `limit_request_fields` and `limit_request_field_size` (431), `worker_connections`
(open connections per worker; the connection idle longest makes room) and `keepalive`
(seconds a connection may stay open without a request, before its first one too), plus
`API_MAX_HEADER_BYTES` (whole request head, default 32768; 431), `API_HEADER_TIMEOUT_S`
(seconds from a request's first byte to the end of its head, default 10; 408) and
`API_SHUTDOWN_DRAIN_S` (on SIGTERM, seconds an idle connection stays open to answer a
request already on its way, with `Connection: close`; default 1, at most half of
`graceful_timeout`), and controlled-delay admission from the accept queue on
(`API_ADMISSION_TARGET_MS`, `API_ADMISSION_INTERVAL_MS`; `http_hardening.admission`) over a
listen backlog (`API_BACKLOG`, 2048). The open-files soft limit is raised to the hard limit here, in the
master, before the listening socket is opened; the workers inherit it.

Workers: `WEB_CONCURRENCY`, else one per CPU of the container's quota (cgroup v2
`cpu.max` / v1 CFS quota, see `api.ops.cpu_budget`), not the host's cores. Each worker is
one uvicorn event loop (`uvicorn_worker.UvicornWorker`); the model is not in these
processes, so OMP/MKL/OpenBLAS thread pools get `cpus // workers` threads (1 with one
worker per CPU), set before anything imports those libraries. `python -m api.ops.doctor`
prints the resulting budget next to the serving tier's threads.

Operational port: `/metrics`, `/docs` and `/openapi.json` are served by a process of their
own (`api.operational`, nice 10) on `API_OPS_BIND` (default `0.0.0.0:9000`), started once
the master is ready and stopped with it; the public port (`API_BIND`) then has only the
probes and the model routes. `API_OPS_BIND=` (empty) serves them from the workers again.

Metrics: the workers share one Prometheus multiprocess directory
(`PROMETHEUS_MULTIPROC_DIR`, see `api.observability.metrics`). When the variable is unset a
fresh temporary directory is made and removed when the master exits, a failed start
included; when it is set, its old `*.db` files are removed at start, as prometheus-client
requires. Both happen first thing here, in the master: prometheus-client picks in-memory or
multiprocess values once, when it is first imported, and importing `api.http_server` below
already imports it (through `api.observability.metrics`).

Start-up mistakes: the reason the API cannot start (a route module that does not import, a
route whose model serving lacks or whose signature does not fit) is the last line printed,
`api: cannot start: <reason>`, after the traceback and gunicorn's own lines
(`api.ops.start_failure`; `API_START_FAILURE_FILE`, made here when unset).

This file is executed by gunicorn only; everything it does is for the server it starts.
"""

import atexit
import contextlib
import gc
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

# --- Prometheus multiprocess directory (before any import of prometheus_client) ------
_MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Marks the directory as prepared by this master, so a config reload (SIGHUP re-reads
# this file) does not wipe the files of running workers.
_PREPARED_ENV = "API_PROMETHEUS_DIR_PREPARED_BY"


def _remove_dir_made_by(path: str, master_pid: int) -> None:
    """At the master's exit, remove the metrics directory it made (forked workers inherit
    this exit handler, and must not remove it while the others still write there)."""
    if os.getpid() == master_pid:
        shutil.rmtree(path, ignore_errors=True)


if os.environ.get(_PREPARED_ENV) != str(os.getpid()):
    if os.environ.get(_MULTIPROC_ENV):
        _dir = Path(os.environ[_MULTIPROC_ENV])
        _dir.mkdir(parents=True, exist_ok=True)
        for _stale in _dir.glob("*.db"):
            _stale.unlink()
    else:
        os.environ[_MULTIPROC_ENV] = tempfile.mkdtemp(prefix="api-prometheus-")
        # atexit, not gunicorn's on_exit hook: that one is not called when the preloaded
        # app fails to build (a configuration error), which left an empty directory behind.
        atexit.register(_remove_dir_made_by, os.environ[_MULTIPROC_ENV], os.getpid())
    os.environ[_PREPARED_ENV] = str(os.getpid())

# --- the operational port (before the app is preloaded: it reads API_OPS_BIND) -------------
# /metrics, /docs and /openapi.json are served by a process of their own on this address,
# not by the workers on the public port (api.operational); empty puts them back there.
_OPS_ENV = "API_OPS_BIND"
os.environ.setdefault(_OPS_ENV, "0.0.0.0:9000")

# Only now: these import prometheus_client (see the module doc).
from api.http_server.limits import raise_open_files_limit  # noqa: E402
from api.ops import start_failure  # noqa: E402
from api.ops.cpu_budget import THREAD_ENV_VARS, available_cpus, threads_per_worker, web_concurrency  # noqa: E402

# --- The reason the API could not start, printed last (api/ops/start_failure.py) ---------
if not os.environ.get(start_failure.FILE_ENV):
    _fd, _reason_file = tempfile.mkstemp(prefix="api-start-failure-")
    os.close(_fd)
    os.environ[start_failure.FILE_ENV] = _reason_file
    atexit.register(lambda path=_reason_file, pid=os.getpid(): os.getpid() == pid and os.unlink(path))
_default_excepthook = sys.excepthook


def _start_failed(kind, exc, tb):
    """The preloaded app failed to build (a MODEL_ROUTES or MODELS__... mistake): the error of the
    user's own module, if one raised, then the reason as the last line, not gunicorn's frames."""
    from api.config.enabled_routes import RouteConfigError

    if isinstance(exc, RouteConfigError):
        if exc.__cause__ is not None:
            traceback.print_exception(exc.__cause__)
    else:
        _default_excepthook(kind, exc, tb)
    start_failure.record(f"{exc}" if isinstance(exc, RouteConfigError) else f"{kind.__name__}: {exc}")
    print(start_failure.last_line(start_failure.recorded() or str(exc)), file=sys.stderr, flush=True)


sys.excepthook = _start_failed

# A container's default soft limit (often 1024) would otherwise cap the connections a
# worker can accept; each worker's `worker_connections` is held below it.
raise_open_files_limit()
_cpus = available_cpus()
workers = web_concurrency(os.environ, _cpus)
for _var in THREAD_ENV_VARS:
    os.environ.setdefault(_var, str(threads_per_worker(_cpus, workers)))

bind = os.environ.get("API_BIND", "0.0.0.0:8000")
# The listening socket's accept queue (gunicorn's default, 2048, kept). A connection that
# waits there is not hidden latency: its arrival is read from the kernel (`TCP_INFO`) when
# its head is, and under a standing queue it is refused 503 from its head at once
# (`http_hardening.admission`), about 0.1 ms of the worker's time. A connection beyond the
# queue is worse off: the kernel drops its SYN and the client retries after 1 s, then 3 s,
# a request neither served nor refused within its budget. Measured at 3x capacity with the
# API and serving pinned to one CPU (`bench.loadgen`, ~510 keep-alive connections opened as
# latency grew): with 256, the queue overflowed about 1,000 times in 8 s (`nstat`
# TcpExtListenOverflows) and 159 requests timed out; with 2048, none overflowed and 92 timed
# out. API_BACKLOG; the kernel caps it at net.core.somaxconn.
backlog = int(os.environ.get("API_BACKLOG", "2048"))
worker_class = "api.http_server.worker.ApiUvicornWorker"
# The app factory does nothing at import and creates its clients, threads and files in
# the lifespan, inside each worker, so preloading is safe and shares the imported code
# pages between workers (copy-on-write after fork).
preload_app = True
# A worker finishing its in-flight requests (and flushing its score events) on SIGTERM
# gets this long.
graceful_timeout = int(os.environ.get("API_GRACEFUL_TIMEOUT_S", "20"))
timeout = 30
keepalive = 5
# Per worker: at this many open connections, one more closes the connection idle longest.
worker_connections = int(os.environ.get("API_WORKER_CONNECTIONS", "1000"))
# The app writes its own JSON access log (api.access, ACCESS_LOG=false turns it off);
# gunicorn's would be a second, unstructured line per request.
accesslog = None
# gunicorn >= 25.1 opens a control socket at one fixed path per user
# (~/.gunicorn/gunicorn.ctl): two API instances on a host would take it from each other,
# and nothing here uses it. (Older gunicorn ignores the unknown setting.)
control_socket_disable = True


def pre_fork(server, worker):
    """Freeze the preloaded heap out of the garbage collector's reach before each fork.

    A collection in a worker writes to the header of every object it scans, so without
    this the first full collection copies every page of the preloaded imports into each
    worker (copy-on-write). Frozen objects are never scanned; the worker collects what it
    allocates itself as usual (https://docs.python.org/3/library/gc.html#gc.freeze).
    """
    gc.freeze()


_operational = {}


def when_ready(server):
    """Start the operational port's process (`api.operational`) with the app's OpenAPI
    document, written from the app the master preloaded (built here without preload)."""
    import subprocess
    import sys

    bind_to = os.environ.get(_OPS_ENV, "")
    if not bind_to:
        return
    app = server.app.wsgi()
    fd, openapi = tempfile.mkstemp(prefix="api-openapi-", suffix=".json")
    with os.fdopen(fd, "w") as out:
        import json

        json.dump(app.openapi(), out)
    _operational["openapi"] = openapi
    _operational["pidfile"] = pidfile = openapi[: -len(".json")] + ".pid"
    command = [sys.executable, "-m", "api.operational", f"--bind={bind_to}", f"--openapi={openapi}"]
    # It detaches (its first process exits at once), so that the master's children are its
    # workers only; it exits by itself once the master is gone.
    subprocess.run([*command, f"--parent={os.getpid()}", f"--pidfile={pidfile}"], check=False, timeout=30)
    server.log.info("operational port (/metrics, /docs, /openapi.json) on %s", bind_to)


def on_exit(server):
    """Stop the operational port's process with the master. A worker's lifespan that refused to
    start (a route's model missing or not fitting) has its reason printed as the last line, after
    gunicorn's "Reason: Worker failed to boot."."""
    import signal

    with contextlib.suppress(OSError, ValueError, KeyError):
        os.kill(int(Path(_operational["pidfile"]).read_text()), signal.SIGTERM)
    for name in ("openapi", "pidfile"):
        with contextlib.suppress(OSError, KeyError):
            os.unlink(_operational[name])
    reason = start_failure.recorded()
    if reason:
        print(start_failure.last_line(reason), file=sys.stderr, flush=True)


def child_exit(server, worker):
    """Drop a dead worker's live gauges (in-flight requests) from the merged metrics."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
