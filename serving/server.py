"""Composition root: options + config -> manager, core, front ends, one event loop, shutdown.

Start-up, in TF Serving's order where it matters:

1. log the Session thread-pool sizes and flags that are accepted but not implemented yet;
2. read each model's versions (:meth:`ServableManager.aspire`): aspired versions are ``START``;
3. bind the REST socket (a busy port fails here, before any model is loaded) and start serving:
   status answers ``START``/``LOADING`` until a version is ``AVAILABLE`` -- the API's readiness
   check polls ``GET /v1/models/{name}`` -- and predictions get ``Servable not found``;
4. load the versions on a dedicated thread, then log which versions are available.

The front ends run as tasks on one asyncio loop, so the gRPC front end (``grpc.aio`` on
``--port``, next) is one more entry in ``front_ends`` calling the same
:class:`~serving.predict.Predictor`. Signals are owned here, not by uvicorn: on SIGTERM/SIGINT every
front end stops accepting and finishes its in-flight requests, loading stops after the current
version, the versions are unloaded, and :func:`run` returns 0. A second signal forces the exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

from serving import flags
from serving.config import ModelServerConfig
from serving.errors import Code, ServingError
from serving.executor import BlockingExecutor
from serving.flags import ServerOptions
from serving.manager import ServableManager
from serving.predict import Predictor
from serving.rest import create_app
from serving.servable import Servable

__all__ = ["run", "serve"]

_log = logging.getLogger(__name__)


def run(options: ServerOptions, config: ModelServerConfig) -> int:
    """Serve until a signal arrives; return the process exit code.

    Raises :class:`ServingError` for start-up failures (e.g. the REST port is taken).
    """
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(serve(options, config))
    # uvloop serves HTTP faster; grpc.aio on uvloop must be checked when the gRPC front end lands.
    return uvloop.run(serve(options, config))


async def serve(options: ServerOptions, config: ModelServerConfig) -> int:
    """The server's whole life inside the running event loop."""
    intra_op, inter_op = flags.session_threads(options)
    _log.info(
        "TensorFlow Session thread pools: intra_op_parallelism_threads=%d "
        "inter_op_parallelism_threads=%d (0 = TensorFlow's default)",
        intra_op,
        inter_op,
    )
    for name in flags.unimplemented_flags(options):
        _log.warning("--%s is accepted but not implemented yet; it has no effect", name)

    loader = functools.partial(
        Servable.load,
        tags=flags.saved_model_tags(options),
        intra_op_threads=intra_op,
        inter_op_threads=inter_op,
        method_name_check=options.enable_signature_method_name_check,
    )
    manager = ServableManager(
        loader,
        allow_version_labels_for_unavailable_models=(
            options.allow_version_labels_for_unavailable_models
        ),
    )
    manager.aspire(config)
    request_executor = BlockingExecutor(flags.rest_api_num_threads(options), "session-run")
    load_executor = BlockingExecutor(1, "servable-load")
    predictor = Predictor(manager, request_executor)

    front_ends: list[_RestServer] = []
    if options.rest_api_port:
        app = create_app(
            predictor,
            manager,
            timeout_ms=options.rest_api_timeout_in_ms,
            enable_cors=options.rest_api_enable_cors_support,
        )
        sock = _bind(options.rest_api_host, options.rest_api_port)
        front_ends.append(_RestServer(app, sock))
    # The gRPC front end (grpc.aio on options.port, options.grpc_socket_path) is appended here.
    if not front_ends:
        _log.warning("No front end enabled (--rest_api_port=0 and no gRPC yet); only loading")

    stop = asyncio.Event()
    with _signals_set(stop, front_ends):
        for front_end in front_ends:
            await front_end.start()
        loading = asyncio.ensure_future(load_executor.run(manager.load_aspired))
        loading.add_done_callback(functools.partial(_log_loaded, manager))
        stopped = asyncio.ensure_future(stop.wait())
        waiters: list[asyncio.Future[Any]] = [stopped]
        waiters += [fe.task for fe in front_ends if fe.task is not None]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        crashed = not stop.is_set()
        stopped.cancel()
        _log.info("Shutting down: draining in-flight requests")
        manager.stop_loading()
        for front_end in front_ends:
            await front_end.stop()
        with contextlib.suppress(Exception):
            await loading
        await load_executor.run(manager.unload_all, 30.0)
    request_executor.shutdown()
    load_executor.shutdown()
    _log.info("Server stopped")
    return 1 if crashed else 0


def _log_loaded(manager: ServableManager, loading: asyncio.Future[Any]) -> None:
    if loading.cancelled():
        return
    if loading.exception() is not None:
        _log.error("Loading servables failed: %r", loading.exception())
        return
    for name, versions in manager.available_versions().items():
        if versions:
            _log.info("Model %s: available versions %s", name, versions)
        else:
            _log.warning("Model %s: no version available", name)


@contextlib.contextmanager
def _signals_set(stop: asyncio.Event, front_ends: list[_RestServer]) -> Iterator[None]:
    """SIGTERM/SIGINT: first one stops gracefully, a second one forces the front ends down."""
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            _log.warning("Signal %d again: forcing shutdown", signum)
            for front_end in front_ends:
                front_end.force()
        else:
            _log.info("Signal %d received", signum)
            stop.set()

    handled = (signal.SIGTERM, signal.SIGINT)
    for signum in handled:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        yield
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)


def _bind(host: str, port: int) -> socket.socket:
    """Bind the REST listening socket now, so a busy port fails start-up with one line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServingError(
            Code.UNAVAILABLE,
            f"Failed to start HTTP Server at {host}:{port}: {exc.strerror or exc}",
        ) from None
    return sock


class _QuietSignalsServer(uvicorn.Server):
    """uvicorn without its own signal handling (it re-raises SIGTERM after shutdown, which
    would end the process with -15 instead of exit code 0); :func:`serve` owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _RestServer:
    """The REST front end: uvicorn serving the Starlette app on a pre-bound socket."""

    def __init__(self, app: Any, sock: socket.socket) -> None:
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            server_header=False,
            lifespan="off",
            backlog=2048,
        )
        self._server = _QuietSignalsServer(config)
        self._sock = sock
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start serving; returns once the socket accepts connections."""
        self.task = asyncio.ensure_future(self._server.serve(sockets=[self._sock]))
        while not self._server.started and not self.task.done():
            await asyncio.sleep(0.01)
        if self.task.done():
            self.task.result()  # re-raise a start-up failure
            raise ServingError(Code.UNAVAILABLE, "HTTP server exited during start-up")
        host, port = self._sock.getsockname()[:2]
        _log.info("Exporting HTTP/REST API at %s:%d ...", host, port)

    async def stop(self) -> None:
        """Stop accepting, finish in-flight requests, close connections."""
        self._server.should_exit = True
        if self.task is not None:
            with contextlib.suppress(Exception):
                await self.task

    def force(self) -> None:
        self._server.force_exit = True
