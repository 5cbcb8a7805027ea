"""The per-request seam: request id, deadline, stage timings and the served model version.

One `RequestContext` exists per HTTP request. `api.request.middleware.RequestMiddleware`
creates it before the app runs and makes it the current one (a `contextvars.ContextVar`,
so tasks spawned by the request see it too); after the response it turns the context into
the `Server-Timing`, `X-Request-ID` and `X-Model-Version` headers, the Prometheus stage
histograms and the JSON access log line.

What the rest of the API does with it (the contract for the routes and scoring):

    ctx = current_context()                     # the middleware's, inside a request
    ctx.stage_since_start("validate")           # first line of an endpoint: FastAPI has
                                                # read and validated the body by now
    with ctx.stage("features"):
        row = extract_features(transaction)
    with ctx.stage("serving"):
        scores = await scorer.score([row], ctx.deadline)   # the request's one Deadline
    ctx.set_model(scorer.model_name, scores.version)

The serving client is given `outgoing_headers` as its metadata provider by the app
(`api.app`): every call to serving carries `{"x-request-id": ...}`, as a REST header
and as gRPC metadata alike.

Stage names in use: `validate`, `features`, `serving`; `total` is added by the
middleware. Durations are seconds on the monotonic clock (`time.monotonic`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass, field

from api.serving_client import Deadline

# The header a request id travels in, both ways, and the gRPC metadata key (metadata
# keys must be lower case).
REQUEST_ID_HEADER = "x-request-id"

# The budget of a context made outside the middleware (a route on a bare app in a test).
DETACHED_BUDGET_S = 30.0

_current: ContextVar[RequestContext | None] = ContextVar("api_request_context", default=None)


@dataclass(slots=True)
class RequestContext:
    """What one request did, as it goes.

    Attributes:
        request_id: the caller's `X-Request-ID` when it was acceptable, else a new one
            (32 hex digits). Sent on to serving (`outgoing_headers`).
        started: `time.monotonic()` when the middleware first saw the request, seconds.
        deadline: when the answer is due (`REQUEST_TIMEOUT_S` after `started`, lowered by
            `X-Request-Timeout-Ms`): the one deadline every step of the request consults.
        stages: stage name -> duration in seconds, in the order they were recorded.
            Recording a stage twice adds the durations (e.g. a retried serving call).
        model_name / model_version: the servable that answered, once a model did.
        arm: the rollout arm the request was assigned (`stable`, `canary`, `pinned`;
            `api.rollouts`), once it was.
        path: the request's path (ASGI `path`), which chooses its errors' shape
            (`api.request.errors.error_document`); set by the middleware.
        credential_id: the client the front door accepted (`key:<id>`, `jwt:<subject>`;
            `api.security.front_door`), None without authentication.
    """

    request_id: str
    started: float
    deadline: Deadline
    stages: dict[str, float] = field(default_factory=dict)
    model_name: str | None = None
    model_version: int | None = None
    arm: str | None = None
    path: str = ""
    credential_id: str | None = None

    @classmethod
    def detached(cls) -> RequestContext:
        """A context for code running outside the middleware: a new id, `DETACHED_BUDGET_S`."""
        started = time.monotonic()
        return cls(new_request_id(), started, Deadline(started + DETACHED_BUDGET_S))

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
        """Time the `with` block as stage `name`, whether it returns or raises."""
        begin = time.monotonic()
        try:
            yield
        finally:
            self.record(name, time.monotonic() - begin)

    def set_model(self, name: str, version: int) -> None:
        """Name the servable that answered this request (`X-Model-Version`, access log)."""
        self.model_name = name
        self.model_version = version

    def set_arm(self, arm: str, model_name: str) -> None:
        """Name the rollout arm this request was assigned and the model it calls
        (`X-Model-Arm`, `Server-Timing`, access log, the rollout metrics)."""
        self.arm = arm
        self.model_name = model_name


def new_request_id() -> str:
    """A fresh request id: 32 hex digits (what `uuid4().hex` draws, without building a UUID)."""
    return os.urandom(16).hex()


def current_request() -> RequestContext | None:
    """The context of the request being handled, or None outside a request."""
    return _current.get()


def current_context() -> RequestContext:
    """The context of the request being handled; a detached one outside the middleware
    (a route mounted on a bare app in a test), so routes never check for None."""
    return _current.get() or RequestContext.detached()


def bind(ctx: RequestContext) -> Token[RequestContext | None]:
    """Make `ctx` current; returns the token for `unbind` (middleware only)."""
    return _current.set(ctx)


def unbind(token: Token[RequestContext | None]) -> None:
    """Restore the context that was current before `bind` returned `token`."""
    _current.reset(token)


def outgoing_headers() -> dict[str, str]:
    """Headers (REST) or metadata (gRPC) that carry the current request id to serving.

    The serving client's `MetadataProvider`. Returns `{"x-request-id": id}` inside a
    request, `{}` outside one (background work such as a startup call).
    """
    ctx = _current.get()
    return {REQUEST_ID_HEADER: ctx.request_id} if ctx is not None else {}
