"""The per-request seam for stage timings, the request id and the served model version.

One `RequestContext` exists per HTTP request. `api.middleware.ObservabilityMiddleware`
creates it before the app runs and makes it the current one (a `contextvars.ContextVar`,
so tasks spawned by the request see it too); after the response it turns the context into
the `Server-Timing`, `X-Request-ID` and `X-Model-Version` headers, the Prometheus stage
histograms and the JSON access log line.

What the rest of the API does with it (the contract for the route, scoring and the
serving client):

    ctx = current_request()                     # never None inside a request
    ctx.stage_since_start("validate")           # first line of an endpoint: FastAPI has
                                                # read and validated the body by now
    with ctx.stage("features"):
        row = extract_features(transaction)
    with ctx.stage("serving"):                  # a ServingError leaving the block is
        scores = await scorer.score([row])      # counted by its canonical code
    ctx.set_model(scorer.model_name, scores.version)

    # in the serving client, on every outgoing call:
    headers = outgoing_headers()                # {"x-request-id": ...}: REST header and
                                                # gRPC metadata key alike

Stage names in use: `validate`, `features`, `serving`; `total` is added by the
middleware. Durations are seconds on the monotonic clock (`time.monotonic`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

# The header a request id travels in, both ways, and the gRPC metadata key (metadata
# keys must be lower case).
REQUEST_ID_HEADER = "x-request-id"

_current: ContextVar[RequestContext | None] = ContextVar("api_request_context", default=None)


@dataclass(slots=True)
class RequestContext:
    """What one request did, as it goes.

    Attributes:
        request_id: the caller's `X-Request-ID` when it was acceptable, else a new one
            (32 hex digits). Sent on to serving (`outgoing_headers`).
        started: `time.monotonic()` when the middleware first saw the request, seconds.
        stages: stage name -> duration in seconds, in the order they were recorded.
            Recording a stage twice adds the durations (e.g. a retried serving call).
        model_name / model_version: the servable that answered, once a model did.
        serving_error: canonical code (e.g. "UNAVAILABLE") of the `ServingError` that
            left a `stage(...)` block, if one did.
    """

    request_id: str
    started: float = field(default_factory=time.monotonic)
    stages: dict[str, float] = field(default_factory=dict)
    model_name: str | None = None
    model_version: int | None = None
    serving_error: str | None = None

    def record(self, name: str, seconds: float) -> None:
        """Add `seconds` to stage `name` (created on first use)."""
        self.stages[name] = self.stages.get(name, 0.0) + seconds

    def stage_since_start(self, name: str) -> None:
        """Record stage `name` as the time from the request's start until now.

        For work that happens before the endpoint runs and that the endpoint cannot
        wrap, such as FastAPI receiving, parsing and validating the body: call it first
        thing in the endpoint.
        """
        self.record(name, time.monotonic() - self.started)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the `with` block as stage `name`, whether it returns or raises.

        A `api.serving_client.ServingError` raised in the block also sets
        `serving_error` to its canonical code (see `api.metrics.serving_error_code`),
        which the middleware counts in `api_serving_errors_total`.
        """
        begin = time.monotonic()
        try:
            yield
        except Exception as exc:
            # Imported here: api.metrics pulls in prometheus_client, which this module
            # (imported by the serving client) should not need.
            from api.metrics import serving_error_code

            code = serving_error_code(exc)
            if code is not None:
                self.serving_error = code
            raise
        finally:
            self.record(name, time.monotonic() - begin)

    def set_model(self, name: str, version: int) -> None:
        """Name the servable that answered this request (`X-Model-Version`, access log)."""
        self.model_name = name
        self.model_version = version


def current_request() -> RequestContext | None:
    """The context of the request being handled, or None outside a request."""
    return _current.get()


def bind(ctx: RequestContext) -> object:
    """Make `ctx` current; returns the token for `unbind` (middleware only)."""
    return _current.set(ctx)


def unbind(token: object) -> None:
    """Restore the context that was current before `bind` returned `token`."""
    _current.reset(token)  # type: ignore[arg-type]


def outgoing_headers() -> dict[str, str]:
    """Headers (REST) or metadata (gRPC) that carry the current request id to serving.

    Returns `{"x-request-id": id}` inside a request, `{}` outside one (background work
    such as the event publisher or a startup call).
    """
    ctx = _current.get()
    return {REQUEST_ID_HEADER: ctx.request_id} if ctx is not None else {}
