"""The HTTP server: TF Serving's ``model_servers/http_server.cc``, on Starlette and uvicorn.

:func:`create_app` is the app: every request goes to the
:class:`~serving.model_servers.http_rest_api_handler.HttpRestApiHandler` (TF Serving's
``RestApiRequestDispatcher``), except ``GET <path>`` of ``--monitoring_config_file``, which answers
the Prometheus metrics as TF Serving's HTTP server does. Every error is ``{"error": "<message>"}``
with the HTTP status of :data:`serving.util.errors.HTTP_STATUS` (``ToHTTPStatusCode``), produced by
one exception handler; an unexpected exception is a 500 with ``Internal error: ...``. A request
over one of the request limits (:mod:`serving.model_servers.http_limits`) is answered with the
limit's status (413, 431, 408, 503) in the same body, and its connection closed.

:class:`RestServer` runs it: uvicorn on a socket :func:`bind` bound at start-up, without its own
signal handling (the server owns the signals).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from serving.core.manager import ServableManager
from serving.model_servers.http_limits import HeadLimitedProtocol, LimitCallback, RequestLimitsMiddleware
from serving.model_servers.http_rest_api_handler import (
    CORS_HEADERS,
    CodecExecutor,
    HttpRestApiHandler,
    error_json,
    json_response,
)
from serving.servables.tensorflow.inference_runner import InferenceService
from serving.servables.tensorflow.predict_impl import PredictService
from serving.util import metrics
from serving.util.errors import Code, LimitExceeded, ServingError, from_exception
from serving.util.process_executor import ProcessExecutor
from serving.util.request_limits import RequestLimits

if TYPE_CHECKING:
    from serving.util.tracing import ServingTracing

__all__ = ["JSON_QUEUE", "RestServer", "bind", "bind_unix", "create_app", "json_processes"]

_log = logging.getLogger(__name__)
_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]
#: Large bodies that may wait for a JSON worker process; one more is answered 503. At most
#: 64 MiB of bodies held at the default 1 MiB body limit.
JSON_QUEUE = 64
#: What the JSON worker processes import as they start: the codecs' modules.
_JSON_MODULES = ("serving.util.json_tensor", "serving.util.json_example")


def create_app(
    predictor: PredictService,
    manager: ServableManager,
    *,
    inference: InferenceService,
    timeout_ms: int | None = None,
    enable_cors: bool = False,
    prometheus: tuple[str, Callable[[], bytes]] | None = None,
    limits: RequestLimits | None = None,
    on_limit: LimitCallback | None = None,
    codec_executor: CodecExecutor | None = None,
    tracing: ServingTracing | None = None,
) -> ASGIApp:
    """The REST API over ``predictor`` (predict), ``inference`` (classify, regress) and
    ``manager`` (status, metadata).

    ``timeout_ms`` bounds each ``Session.run`` (``--rest_api_timeout_in_ms``); ``enable_cors``
    adds TF Serving's CORS headers to every response and answers ``OPTIONS`` pre-flights.
    ``prometheus`` = ``(path, render)`` answers ``GET <path>`` with ``render()``, Prometheus text
    (``--monitoring_config_file``; :mod:`serving.util.metrics`), as TF Serving's HTTP server does.
    ``limits`` holds request bodies to their size and time limits (:class:`~serving.model_servers.
    http_limits.RequestLimitsMiddleware`); every request refused for a limit is passed to ``on_limit``.
    ``codec_executor`` decodes large bodies and encodes large answers off the event loop
    (:class:`~serving.model_servers.http_rest_api_handler.HttpRestApiHandler`). ``tracing`` puts a
    SERVER span around each request, continuing the caller's trace (:mod:`serving.util.tracing`).
    """
    limits = limits if limits is not None else RequestLimits()
    report: LimitCallback = on_limit if on_limit is not None else _ignore
    handler = HttpRestApiHandler(
        predictor, inference, manager, timeout_ms, enable_cors, limits, codec_executor
    )
    headers = dict(CORS_HEADERS) if enable_cors else {}

    async def on_serving_error(request: Request, exc: Exception) -> Response:
        error = from_exception(exc)
        if isinstance(error, LimitExceeded):
            # What is left of the request is not read: the connection closes after the answer.
            report(error)
            return json_response(
                error_json(error.message), error.http_status, {**headers, "Connection": "close"}
            )
        return json_response(error_json(error.message), error.http_status, headers)

    async def on_client_disconnect(request: Request, exc: Exception) -> Response:
        # The client went away before its body was in: nothing is wrong with the server and no
        # one is left to answer (the response is dropped). No metric counts it: TF Serving has
        # none, and request_count only counts requests that reached the model.
        _log.info("%s %s: the client disconnected before its request body arrived", request.method, request.url.path)
        return Response(status_code=499)  # nginx's "client closed request"; never sent

    async def on_unexpected_error(request: Request, exc: Exception) -> Response:
        # Starlette re-raises after this response is sent, so the server logs the traceback.
        return json_response(error_json(f"Internal error: {exc}"), 500, headers)

    routes = [Route("/{path:path}", handler.handle, methods=_ALL_METHODS)]
    if prometheus is not None:
        path, render = prometheus

        async def metrics_page(request: Request) -> Response:
            return Response(render(), media_type=metrics.CONTENT_TYPE, headers=dict(headers))

        routes.insert(0, Route(path, metrics_page, methods=["GET"]))
    app = Starlette(
        routes=routes,
        exception_handlers={
            ServingError: on_serving_error,
            ClientDisconnect: on_client_disconnect,
            Exception: on_unexpected_error,
        },
    )
    limited = RequestLimitsMiddleware(app, limits, report, headers)
    return tracing.asgi(limited) if tracing is not None else limited


def json_processes(count: int, timeout_ms: int = 0) -> ProcessExecutor | None:
    """The REST codec's worker processes (``--rest_api_num_json_processes``; ``None`` for 0),
    each request's time with them bounded by ``timeout_ms``
    (``--rest_api_json_process_timeout_in_ms``; <= 0: no bound), not started yet:
    :class:`RestServer` starts and stops them."""
    if count <= 0:
        return None
    return ProcessExecutor(
        count,
        max_queued=JSON_QUEUE,
        name="REST JSON processes",
        preload=_JSON_MODULES,
        timeout_s=timeout_ms / 1000 if timeout_ms > 0 else None,
    )


def _ignore(error: LimitExceeded) -> None:
    """The default ``on_limit``: nothing counts refusals."""


def bind(host: str, port: int) -> socket.socket:
    """The REST listening socket, bound now so that a busy port fails start-up with one line.

    Raises ``UNAVAILABLE`` ``Failed to start HTTP Server at <host>:<port>: <reason>``.
    """
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


def bind_unix(path: str) -> socket.socket:
    """The REST API's UNIX-domain listening socket at ``path`` (``--rest_api_socket_path``), bound
    now. A socket file left by an earlier run is replaced; any other file there fails start-up.

    Raises ``UNAVAILABLE`` ``Failed to start HTTP Server at unix:<path>: <reason>``.
    """
    target = Path(path)
    try:
        if target.is_socket():
            target.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:
        raise ServingError(
            Code.UNAVAILABLE, f"Failed to start HTTP Server at unix:{path}: {exc.strerror or exc}"
        ) from None
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise ServingError(
            Code.UNAVAILABLE, f"Failed to start HTTP Server at unix:{path}: {exc.strerror or exc}"
        ) from None
    return sock


class _QuietSignalsServer(uvicorn.Server):
    """uvicorn without its own signal handling (it re-raises SIGTERM after shutdown, which
    would end the process with -15 instead of exit code 0); :mod:`serving.model_servers.server`
    owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class RestServer:
    """The REST front end: uvicorn serving the Starlette app on a pre-bound socket."""

    def __init__(
        self,
        app: Any,
        sock: socket.socket,
        limits: RequestLimits | None = None,
        on_limit: LimitCallback | None = None,
        json_processes: ProcessExecutor | None = None,
        unix_sock: socket.socket | None = None,
    ) -> None:
        """``unix_sock`` (:func:`bind_unix`) serves the same app beside ``sock``, its file removed on
        stop. ``limits`` bound each request head (:class:`~serving.model_servers.http_limits.
        HeadLimitedProtocol`; the app holds the bodies); refusals are passed to ``on_limit``.
        ``json_processes``, the app's codec worker processes, are started and stopped with
        the server."""
        protocol = functools.partial(
            HeadLimitedProtocol,
            limits=limits if limits is not None else RequestLimits(),
            on_limit=on_limit if on_limit is not None else _ignore,
        )
        config = uvicorn.Config(
            app,
            http=protocol,  # type: ignore[arg-type]  # a protocol factory, as uvicorn calls it
            log_config=None,
            access_log=False,
            server_header=False,
            lifespan="off",
            backlog=2048,
        )
        self._server = _QuietSignalsServer(config)
        self._sock = sock
        self._unix_sock = unix_sock
        self._json_processes = json_processes
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start serving; returns once the socket accepts connections."""
        if self._json_processes is not None:
            await self._json_processes.start()
        sockets = [self._sock, *([self._unix_sock] if self._unix_sock is not None else [])]
        self.task = asyncio.ensure_future(self._server.serve(sockets=sockets))
        # uvicorn sets a plain `started` flag, no event to wait on.
        while not self._server.started and not self.task.done():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        if self.task.done():
            self.task.result()  # re-raise a start-up failure
            raise ServingError(Code.UNAVAILABLE, "HTTP server exited during start-up")
        host, port = self._sock.getsockname()[:2]
        _log.info("Exporting HTTP/REST API at %s:%d ...", host, port)
        if self._unix_sock is not None:
            _log.info("Exporting HTTP/REST API at unix:%s ...", self._unix_sock.getsockname())

    async def stop(self) -> None:
        """Stop accepting, finish in-flight requests, close connections."""
        self._server.should_exit = True
        if self.task is not None:
            with contextlib.suppress(Exception):
                await self.task
        if self._json_processes is not None:  # after the requests that use them are answered
            await self._json_processes.close()
        if self._unix_sock is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._unix_sock.getsockname())  # a directory entry: no I/O to wait on

    def force(self) -> None:
        """Drop in-flight requests now (a second signal)."""
        self._server.force_exit = True
