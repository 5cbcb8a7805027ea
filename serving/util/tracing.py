"""(ours) OpenTelemetry tracing of the model server: it continues the API's trace.

TF Serving has no tracing (tensorflow/serving#1994); this server, on the same contract, continues
the trace its caller sends -- ``traceparent``/``tracestate`` as REST headers or gRPC metadata
(W3C trace context, or what ``OTEL_PROPAGATORS`` names) -- and adds:

    POST /v1/models/{model_name}:predict      SERVER    the REST request (:meth:`ServingTracing.asgi`)
    tensorflow.serving.PredictionService/Predict  SERVER  a gRPC call (:meth:`ServingTracing.grpc_call`)
    |- batch queue                            INTERNAL  with ``--enable_batching``: from the task's
    |                                                   enqueueing to its batch's start, per request
    `- Session run                            INTERNAL  one per ``Session.run``: a batch's is a child
                                                        of its first sampled request, linked to the rest

Imported only when the ``OTEL_*`` variables turn tracing on (``otel_tracing.tracing_enabled``; the
server's composition root, :func:`serving.model_servers.server.build`, decides); off, neither this
module nor OpenTelemetry is loaded and the request path pays one ``is None`` test per hook. No
TensorFlow and no web or RPC framework here: the ASGI wrapper is plain ASGI, the gRPC hook takes
the call's metadata as pairs.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from otel_tracing import tracer_provider

__all__ = ["SERVICE_NAME", "ServingTracing", "rest_route"]

SERVICE_NAME: Final = "tfserve-serving"

# The REST API's paths (http_rest_api_handler's regular expressions), named as routes so a span
# name never carries a model name or version (bounded cardinality).
_REST_PATH = re.compile(
    r"/v1/models/[^/:]+(?P<pin>/versions/\d+|/labels/[^/:]+)?(?P<tail>/metadata|:classify|:regress|:predict)?",
    re.IGNORECASE,
)

AsgiApp = Any


def rest_route(path: str) -> str:
    """The route template of a REST path: ``/v1/models/{model_name}[/versions/{version}]:predict``..."""
    match = _REST_PATH.fullmatch(path)
    if match is None:
        return "other"
    pin = match.group("pin") or ""
    if pin:
        pin = "/versions/{version}" if pin.lower().startswith("/versions/") else "/labels/{label}"
    return "/v1/models/{model_name}" + pin + (match.group("tail") or "").lower()


def _epoch_ns(monotonic_s: float) -> int:
    """A ``time.monotonic()`` instant as nanoseconds since the epoch (what spans are timed in)."""
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)


class ServingTracing:
    """The server's tracer provider and the hooks the front ends and Sessions call.

    Args:
        environ: the ``OTEL_*`` variables (the process environment by default), as
            ``otel_tracing.tracer_provider`` reads them (the SDK reads some from the process environment).
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._provider: TracerProvider = tracer_provider(SERVICE_NAME, environ)
        self._tracer = self._provider.get_tracer("serving")
        self._follow_parent = isinstance(self._provider.sampler, ParentBased)

    def unsampled(self, parent: Context | None) -> bool:
        """Whether spans under ``parent`` (a trace context) would not be recorded, so need not be made.

        True under a ``parentbased_*`` sampler (the default) when ``parent`` holds a valid span
        that is not sampled -- the API's requests at 1 % sampling, 99 in 100. The SDK's
        non-recording spans cost about 10 µs of CPU each (``python -m bench.tracing_hooks``
        measures the API's); the context is kept current instead, so nothing below records.
        """
        if not self._follow_parent or parent is None:
            return False
        context = trace.get_current_span(parent).get_span_context()
        return context.is_valid and not context.trace_flags.sampled

    def shutdown(self) -> None:
        """Export what is queued, stop the export thread."""
        self._provider.shutdown()

    # ---- the front ends -----------------------------------------------------------------------

    def asgi(self, app: AsgiApp) -> AsgiApp:
        """``app`` with a SERVER span around each HTTP request, continuing the caller's trace."""
        fields = propagate.get_global_textmap().fields
        tracer = self._tracer

        async def traced(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            headers = {}
            for name, value in scope["headers"]:
                key = name.decode("latin-1")
                if key in fields:
                    headers[key] = value.decode("latin-1")
            parent = propagate.extract(headers)
            if self.unsampled(parent):
                token = otel_context.attach(parent)
                try:
                    await app(scope, receive, send)
                finally:
                    otel_context.detach(token)
                return
            method, path = scope["method"], scope["path"]
            route = rest_route(path)
            span = tracer.start_span(
                f"{method} {route}",
                context=parent,
                kind=SpanKind.SERVER,
                attributes={"http.request.method": method, "url.path": path, "http.route": route},
            )
            status = 500

            async def send_status(message: dict[str, Any]) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            token = otel_context.attach(trace.set_span_in_context(span))
            try:
                await app(scope, receive, send_status)
            finally:
                otel_context.detach(token)
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
                span.end()

        return traced

    @asynccontextmanager
    async def grpc_call(self, method: str, metadata: Iterable[tuple[str, Any]] | None) -> AsyncIterator[Span]:
        """A SERVER span for one gRPC call, current inside the block.

        Args:
            method: the full method path, ``/tensorflow.serving.PredictionService/Predict``.
            metadata: the call's invocation metadata (key, value) pairs.

        Yields:
            the span; the caller records the status (:meth:`grpc_status`).
        """
        carrier = {key: value for key, value in (metadata or ()) if isinstance(value, str)}
        parent = propagate.extract(carrier)
        if self.unsampled(parent):
            token = otel_context.attach(parent)
            try:
                yield trace.get_current_span(parent)  # non-recording: the status is not kept
            finally:
                otel_context.detach(token)
            return
        service, _, name = method.lstrip("/").partition("/")
        span = self._tracer.start_span(
            method.lstrip("/"),
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name},
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            yield span
        finally:
            otel_context.detach(token)
            span.end()

    @staticmethod
    def grpc_status(span: Span, code_name: str, message: str = "") -> None:
        """Record a gRPC call's status (``OK``, ``NOT_FOUND``...) on its span."""
        span.set_attribute("rpc.grpc.status_code", code_name)
        if code_name != "OK":
            span.set_status(Status(StatusCode.ERROR, message))

    # ---- the Sessions -------------------------------------------------------------------------

    @staticmethod
    def current() -> Context:
        """The caller's trace context, kept by a batching task for its spans on a batch thread."""
        return otel_context.get_current()

    def session_run(self, attributes: Mapping[str, str | int | bool]) -> _SessionSpan:
        """A ``Session run`` span, the current span's child, for one request's run (none when unsampled)."""
        if self.unsampled(otel_context.get_current()):
            return _SessionSpan(trace.INVALID_SPAN)
        return _SessionSpan(self._tracer.start_span("Session run", attributes=attributes))

    def batch_run(self, callers: Sequence[Context | None], attributes: Mapping[str, str | int | bool]) -> _SessionSpan:
        """The ``Session run`` span of a batch: a child of its first sampled request, linked to the rest.

        Safe on a batch thread: nothing is made current.
        """
        spans = [trace.get_current_span(c) for c in callers if c is not None]
        parent = next((s for s in spans if s.get_span_context().trace_flags.sampled), spans[0] if spans else None)
        if parent is not None and self.unsampled(trace.set_span_in_context(parent)):
            return _SessionSpan(trace.INVALID_SPAN)  # no request of the batch is sampled
        others = [s for s in spans if s is not parent]
        span = self._tracer.start_span(
            "Session run",
            context=trace.set_span_in_context(parent) if parent is not None else None,
            attributes=attributes,
            links=[Link(s.get_span_context()) for s in others],
        )
        return _SessionSpan(span)

    def queued(self, caller: Context | None, enqueued: float, dequeued: float, attributes: Mapping[str, int]) -> None:
        """Record a ``batch queue`` span: one request's wait, from ``enqueued`` to ``dequeued``
        (``time.monotonic()`` seconds), as a child of its trace context."""
        if caller is None or self.unsampled(caller):
            return
        span = self._tracer.start_span(
            "batch queue", context=caller, attributes=attributes, start_time=_epoch_ns(enqueued)
        )
        span.end(end_time=_epoch_ns(dequeued))


class _SessionSpan:
    """Ends a Session's span when the block ends; an exception marks it failed."""

    __slots__ = ("_span",)

    def __init__(self, span: Span) -> None:
        self._span = span

    def __enter__(self) -> Span:
        return self._span

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is not None:
            self._span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        self._span.end()
