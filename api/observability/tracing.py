"""OpenTelemetry tracing of the API tier: one trace per request, continued by the serving tier.

Imported only when the `OTEL_*` variables turn tracing on (`otel_tracing.tracing_enabled`;
`api.observability.wiring` decides); off, nothing here or of OpenTelemetry is loaded. The
tracer provider is made in the lifespan (`Tracing.start`), in each gunicorn worker after the
fork, and shut down (queued spans exported) when the worker stops.

The spans of one model request, all in one trace:

    POST /v1/fraud/score                      SERVER    RequestMiddleware (api.request.middleware)
    |- preprocess                             INTERNAL  the route's preprocess (stage "features")
    |- coalesced Predict                      INTERNAL  one per call to serving, whatever its batch
    |  `- tensorflow.serving.PredictionService/Predict   CLIENT  one per attempt on a replica
    |     `- (the model server's spans: its HTTP or gRPC handling, batch queue, Session run)
    `- postprocess                            INTERNAL

* **The request.** The caller's W3C `traceparent`/`tracestate` (the propagators of
  `OTEL_PROPAGATORS`, by default W3C trace context and baggage) are continued; without them a
  trace starts here. Attributes are HTTP's semantic conventions (`http.request.method`,
  `url.path`, `http.route`, `http.response.status_code`, `client.address`), plus the request id
  (`tfserving.request_id`) and the servable that answered (`tfserving.model_spec.name`,
  `.version`). A 5xx answer marks the span failed. The access log line carries `trace_id` and
  `span_id` beside `request_id`.
* **A coalesced call serves several requests** (`api.serving_client`'s coalescing): one span
  for it, a child of the first sampled request of its batch and linked to every other one, each
  of which gets a link back to it (`Span.add_link`), so from any request's trace the call that
  served it is one click away. Links rather than one child span per request: serving receives
  one call and can continue one trace, so per-request copies would still leave every request
  but one without the serving tier's spans, at N times the spans; links are what OpenTelemetry
  prescribes for one operation started by several (the specification's "Links between spans").
  Its attributes: model, signature, version (asked and answered), `tfserving.batch_size` (rows)
  and `tfserving.coalesced_requests`.
* **Each attempt** is a CLIENT span (`rpc.service`, `rpc.method`, `server.address`: the replica,
  `tfserving.attempt`: 1 for the first try, more for retries on other replicas); its context is
  what the transport sends to serving (`traceparent` as an HTTP header over REST, gRPC metadata
  over gRPC), through the client's metadata provider (`with_trace_context`).

Everything is a plain function of headers too (`start_server_span(name, headers)`), so a front
other than the ASGI middleware (a gRPC server's interceptor-style hook) starts the same span.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from api.serving_client import ClientTracer, MetadataProvider
from otel_tracing import tracer_provider

SERVICE_NAME: Final = "tfserve-api"
_TRACER_NAME: Final = "api"
AttributeValue = str | int | float | bool
Annotate = Callable[[str, AttributeValue], None]


def _ignore(key: str, value: AttributeValue) -> None:
    """The `Annotate` of a span not made."""


#: The `with` block of a span not made (the request is not sampled): reusable, shared.
_NO_SPAN: Final = contextlib.nullcontext(_ignore)


def trace_ids(span: Span) -> tuple[str, str] | None:
    """(trace id, span id) of `span` in W3C hex (32 and 16 digits), or None for no valid span."""
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


class _Attach:
    """Makes a span current for the block and ends it after, recording what left the block."""

    __slots__ = ("_span", "_token")

    def __init__(self, span: Span) -> None:
        self._span = span
        self._token: object = None

    def __enter__(self) -> Annotate:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self._span.set_attribute

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        try:
            if exc is not None:
                self._span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                code = getattr(getattr(exc, "code", None), "name", None)
                if isinstance(code, str):
                    self._span.set_attribute("rpc.grpc.status_code", code)
                self._span.set_attribute("error.type", type(exc).__name__)
        finally:
            self._span.end()
            otel_context.detach(self._token)  # type: ignore[arg-type]  # attach's own token


class Tracing:
    """The API's tracing: the tracer provider of this worker, and the spans of a request.

    Args:
        environ: the `OTEL_*` variables (the process environment by default), as
            `otel_tracing.tracer_provider` reads them (the SDK reads some from the process environment).
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = environ
        self._provider: TracerProvider | None = None
        self._tracer: trace.Tracer = trace.NoOpTracer()
        self._children_follow_parent = False
        self.client = ServingCallTracer(self)

    @property
    def tracer(self) -> trace.Tracer:
        """The tracer spans are made with (a no-op one before `start`)."""
        return self._tracer

    def start(self) -> None:
        """Make the tracer provider and its export thread (in the worker, after the fork)."""
        self._provider = tracer_provider(SERVICE_NAME, self._environ)
        self._tracer = self._provider.get_tracer(_TRACER_NAME)
        self._children_follow_parent = isinstance(self._provider.sampler, ParentBased)

    def unsampled(self, parent: Span) -> bool:
        """Whether a child of `parent` would not be recorded, so need not be made.

        True under a `parentbased_*` sampler (the default; the `OTEL_TRACES_SAMPLER` values
        that can only follow an unsampled parent's decision) below a valid parent that is not
        sampled. Not making those children is the measured reason: at 1 % sampling the SDK's
        non-recording children cost about 10 µs of CPU each (sampler, ids, context), 4 of the 5
        spans of the API's request; their context would only repeat the parent's, which is
        what goes to serving instead (not sampled: serving does not sample either).
        """
        if not self._children_follow_parent:
            return False
        context = parent.get_span_context()
        return context.is_valid and not context.trace_flags.sampled

    def shutdown(self) -> None:
        """Export what is queued and stop the export thread; spans made later are dropped."""
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = None
            self._tracer = trace.NoOpTracer()

    def start_server_span(self, name: str, headers: Mapping[str, str], attributes: Mapping[str, Any]) -> Span:
        """A SERVER span continuing the trace `headers` carry (`traceparent`, ...), not yet current.

        Args:
            name: the span's name (e.g. "POST"; rename it once the route is known).
            headers: request headers or gRPC metadata, lower-case names.
            attributes: its first attributes.
        """
        parent = propagate.extract(headers)
        return self._tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)

    def start_asgi_span(self, scope: Mapping[str, Any]) -> Span:
        """`start_server_span` for an ASGI HTTP request: W3C context from its headers."""
        fields = propagate.get_global_textmap().fields
        headers = {}
        for name, value in scope["headers"]:
            key = name.decode("latin-1")
            if key in fields:
                headers[key] = value.decode("latin-1")
        client = scope.get("client")
        attributes = {"http.request.method": scope["method"], "url.path": scope["path"]}
        if client:
            attributes["client.address"] = client[0]
        return self.start_server_span(scope["method"], headers, attributes)

    @staticmethod
    def activate(span: Span) -> object:
        """Make `span` current in this context; returns the token for `deactivate`."""
        return otel_context.attach(trace.set_span_in_context(span))

    @staticmethod
    def deactivate(token: object) -> None:
        """Undo `activate`."""
        otel_context.detach(token)  # type: ignore[arg-type]  # attach's own token

    @staticmethod
    def end_server_span(
        span: Span, status: int, route: str, extra: Mapping[str, AttributeValue]
    ) -> tuple[str, str] | None:
        """Name the span after its route (`POST /v1/fraud/score`), record the answer, end it.

        Returns:
            its `trace_ids`, for the access log (an unsampled span has them too); None for an
            invalid span (before `start`).
        """
        method = str(getattr(span, "name", ""))  # an SDK span, started as the method alone
        span.update_name(f"{method} {route}")
        span.set_attribute("http.route", route)
        span.set_attribute("http.response.status_code", status)
        for key, value in extra.items():
            span.set_attribute(key, value)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))
        span.end()
        return trace_ids(span)

    def span(self, name: str) -> contextlib.AbstractContextManager[Annotate]:
        """An INTERNAL child of the current span for the `with` block (e.g. "preprocess"); none when `unsampled`."""
        if self.unsampled(trace.get_current_span()):
            return _NO_SPAN
        return _Attach(self._tracer.start_span(name))

    @staticmethod
    def traceparent() -> str | None:
        """The current span's W3C `traceparent` ("00-<trace id>-<span id>-<flags>"), if any."""
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return carrier.get("traceparent")

    def with_trace_context(self, provider: MetadataProvider) -> MetadataProvider:
        """`provider`'s headers plus the current trace context (`traceparent`, `tracestate`, ...).

        Given to the serving client as its metadata provider: the transports call it inside
        each attempt's span, so serving continues the attempt's span.
        """

        def metadata() -> Mapping[str, str]:
            carrier = dict(provider())
            propagate.inject(carrier)
            return carrier

        return metadata


class ServingCallTracer(ClientTracer):
    """The serving client's spans (`api.serving_client.ClientTracer`): coalesced calls and attempts."""

    def __init__(self, tracing: Tracing) -> None:
        self._tracing = tracing

    def caller(self) -> object:
        """The request's current span: parent or link of the coalesced call it joins."""
        return trace.get_current_span()

    def coalesced_call(
        self, callers: Sequence[object], attributes: Mapping[str, AttributeValue]
    ) -> contextlib.AbstractContextManager[Annotate]:
        """One span for a call serving `callers`: child of the first sampled one, linked to the rest."""
        spans = [c for c in callers if isinstance(c, Span)]
        parent = next((s for s in spans if s.get_span_context().trace_flags.sampled), spans[0] if spans else None)
        if parent is not None and self._tracing.unsampled(parent):
            return _NO_SPAN  # no caller is sampled
        others = [s for s in spans if s is not parent]
        context: Context | None = trace.set_span_in_context(parent) if parent is not None else None
        span = self._tracing.tracer.start_span(
            "coalesced Predict",
            context=context,
            attributes=attributes,
            links=[Link(s.get_span_context()) for s in others],
        )
        for other in others:
            other.add_link(span.get_span_context(), {"tfserving.link": "served by coalesced call"})
        return _Attach(span)

    def attempt(
        self, method: str, attributes: Mapping[str, AttributeValue]
    ) -> contextlib.AbstractContextManager[Annotate]:
        """A CLIENT span for one attempt, the current span's child (none when `unsampled`)."""
        if self._tracing.unsampled(trace.get_current_span()):
            return _NO_SPAN
        service = attributes.get("rpc.service") or "tensorflow.serving"
        span = self._tracing.tracer.start_span(f"{service}/{method}", kind=SpanKind.CLIENT, attributes=attributes)
        return _Attach(span)

