"""Per-request instrumentation: request id, Server-Timing, metrics, JSON access log.

`ObservabilityMiddleware` is plain ASGI (no `BaseHTTPMiddleware`, which costs a task
and a memory stream per request). For every HTTP request it:

1. takes the caller's `X-Request-ID` when it is 1-128 characters of `[A-Za-z0-9._:-]`,
   else makes one (32 hex digits), and makes a fresh `api.request_context.RequestContext`
   current, so the route can record stages and the serving client can forward the id;
2. tells the loop monitor which route this task serves (blocks name it);
3. adds to the response headers:
   `X-Request-ID`, `Server-Timing` (every recorded stage and `total`, milliseconds,
   https://www.w3.org/TR/server-timing/, e.g.
   `validate;dur=0.120, features;dur=0.010, serving;dur=3.200, total;dur=3.500`), and
   `X-Model-Version` when a model answered the request;
4. afterwards records `api_request_duration_seconds`, the stage histograms (with
   `total`), `api_requests_in_flight` and `api_serving_errors_total`, and writes one
   `api.access` log line.

Installed once, outermost among the app's own middleware (`api.app.create_app`), so it
sees the status of error responses made by the exception handlers. A request that
raises past every handler is recorded as status 500; its answer is made by Starlette's
ServerErrorMiddleware, outside this one, so it carries none of the headers above.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Iterable
from typing import Any, Final

from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.logging_config import AccessLog
from api.loop_monitor import LoopMonitor, route_of
from api.metrics import UNMATCHED_ROUTE, ApiMetrics
from api.request_context import REQUEST_ID_HEADER, RequestContext, bind, unbind

_REQUEST_ID_HEADER: Final = REQUEST_ID_HEADER.encode("ascii")
# Methods used as a metric label as they are; any other token a client sends is "OTHER",
# so a client cannot grow the label's cardinality.
_KNOWN_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_VALID_REQUEST_ID: Final = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")


def request_id_from(scope: Scope) -> str:
    """The caller's `X-Request-ID` if it is acceptable, else a new random one.

    Acceptable: 1-128 characters of letters, digits and `._:-`, so it is safe to echo in
    a header and to write to logs unescaped.
    """
    for name, value in scope["headers"]:
        if name == _REQUEST_ID_HEADER:
            if _VALID_REQUEST_ID.fullmatch(value):
                return str(value.decode("ascii"))
            break
    return os.urandom(16).hex()  # what uuid4().hex draws, without building a UUID


def route_template(scope: Scope) -> str:
    """The path template of the app route `scope` would reach, or `UNMATCHED_ROUTE`.

    For requests answered before routing (413 by the body limit, 503 when overloaded, 422
    for a bad timeout header), so they are counted under their route like the others. Only
    route templates are returned, so a client cannot grow the label's cardinality.
    """
    router = getattr(scope.get("app"), "router", None)
    return _template_in(getattr(router, "routes", ()), scope) or UNMATCHED_ROUTE


def _template_in(routes: Iterable[Any], scope: Scope) -> str | None:
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.NONE:
            continue
        path = getattr(route, "path", None)
        if isinstance(path, str):
            return path
        # FastAPI (>= 0.16x) wraps each included router; its routes carry the templates.
        nested = getattr(getattr(route, "original_router", route), "routes", None)
        found = _template_in(nested, scope) if nested else None
        if found is not None:
            return found
    return None


def server_timing(stages: dict[str, float], total_s: float) -> str:
    """`Server-Timing` header value: each stage then `total`, durations in milliseconds."""
    parts = [f"{name};dur={seconds * 1000:.3f}" for name, seconds in stages.items()]
    parts.append(f"total;dur={total_s * 1000:.3f}")
    return ", ".join(parts)


class ObservabilityMiddleware:
    """ASGI middleware: request id, Server-Timing, model version header, metrics, access log.

    Args:
        app: the ASGI app to wrap.
        metrics: the app's `ApiMetrics`.
        loop_monitor: told which route each request task serves; None to skip.
        access_log: where the per-request JSON line goes.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: ApiMetrics,
        loop_monitor: LoopMonitor | None,
        access_log: AccessLog,
    ) -> None:
        self.app = app
        self._metrics = metrics
        self._monitor = loop_monitor
        self._access_log = access_log
        self._in_flight = metrics.in_flight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ctx = RequestContext(request_id=request_id_from(scope))
        started = ctx.started
        status = 500
        token = bind(ctx)
        task = asyncio.current_task()
        if self._monitor is not None:
            self._monitor.track(task, scope)
        self._in_flight.inc()

        async def send_with_headers(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                # In place, as Starlette's own MutableHeaders(scope=message) does: the
                # message is made for this one send.
                headers = message["headers"] = list(message.get("headers", ()))
                headers.append((_REQUEST_ID_HEADER, ctx.request_id.encode("ascii")))
                if ctx.model_version is not None:
                    headers.append((b"x-model-version", str(ctx.model_version).encode("ascii")))
                timing = server_timing(ctx.stages, time.monotonic() - started)
                headers.append((b"server-timing", timing.encode("ascii")))
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            total = time.monotonic() - started
            self._in_flight.dec()
            if self._monitor is not None:
                self._monitor.untrack(task)
            unbind(token)
            self._record(scope, ctx, status, total)

    def _record(self, scope: Scope, ctx: RequestContext, status: int, total: float) -> None:
        metrics = self._metrics
        route = route_of(scope) or route_template(scope)
        method = scope["method"]
        label = method if method in _KNOWN_METHODS else "OTHER"
        metrics.child(metrics.request_duration, label, route, str(status)).observe(total)
        for name, seconds in ctx.stages.items():
            metrics.child(metrics.stage_duration, route, name).observe(seconds)
        metrics.child(metrics.stage_duration, route, "total").observe(total)
        if ctx.serving_error is not None:
            metrics.child(metrics.serving_errors, ctx.serving_error).inc()
        if self._access_log.enabled:
            client = scope.get("client")
            path = scope["path"]
            self._access_log.write(
                f"{method} {path} {status}",
                {
                    "request_id": ctx.request_id,
                    "method": method,
                    "path": path,
                    "route": route,
                    "status": status,
                    "duration_ms": round(total * 1000, 3),
                    "model_name": ctx.model_name,
                    "model_version": ctx.model_version,
                    "client": f"{client[0]}:{client[1]}" if client else None,
                },
            )
