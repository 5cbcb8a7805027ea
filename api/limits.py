"""Admission control for each request, as pure ASGI middleware (no body buffering).

Three checks, outermost first, each answering in the API's error shape
(`api.errors`) before any route runs:

1. `InFlightLimitMiddleware`: at most `MAX_IN_FLIGHT_REQUESTS` requests per worker are
   being handled; one more is answered 503 `overloaded` with `Retry-After` at once.
   There is no queue: a request waits for nothing but its own work, so a burst costs
   a fast refusal rather than a growing backlog whose answers come too late anyway.
   Probes and metrics (`EXEMPT_PATHS`) are never refused.
2. `DeadlineMiddleware`: fixes the request's `Deadline` on arrival from
   `REQUEST_TIMEOUT_S`, lowered by the caller's `X-Request-Timeout-Ms`
   (`api.deadlines`); a malformed header is answered 422. Routes read it with
   `request_deadline(request)`. A body that has not fully arrived by the deadline is
   answered 408 `request_timeout` (uvicorn has no body-read timeout of its own).
3. `BodySizeLimitMiddleware`: a body over `MAX_BODY_BYTES` is answered 413
   `payload_too_large`: at once when `Content-Length` says so, else as soon as the
   streamed (e.g. chunked) bytes counted pass the limit, before the app has buffered
   them. The app's own answer, if it started one, is dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.deadlines import TIMEOUT_HEADER, Deadline, parse_timeout_header
from api.errors import error_response

if TYPE_CHECKING:
    from fastapi import FastAPI

    from api.settings import Settings

# Never refused for load: liveness/readiness must answer while the worker is busy,
# and metrics are how the overload is seen.
EXEMPT_PATHS: Final = frozenset({"/healthz", "/readyz", "/metrics"})

_DEADLINE_KEY: Final = "deadline"  # key in scope["state"], i.e. request.state.deadline
_TIMEOUT_HEADER: Final = TIMEOUT_HEADER.encode("ascii")


def request_deadline(request: object, default_s: float = 30.0) -> Deadline:
    """The request's `Deadline` set by `DeadlineMiddleware`.

    Args:
        request: a Starlette/FastAPI `Request`.
        default_s: used only when the middleware is not installed (e.g. a router
            mounted on a bare app in a test): a deadline this far from now.
    """
    state = getattr(request, "scope", {}).get("state") or {}
    deadline = state.get(_DEADLINE_KEY)
    return deadline if isinstance(deadline, Deadline) else Deadline.after(default_s)


class InFlightLimitMiddleware:
    """Refuse requests past `max_in_flight` at once: 503 `overloaded` + `Retry-After`.

    Args:
        app: the ASGI app to wrap.
        max_in_flight: requests handled concurrently by this worker at most.
        retry_after_s: the `Retry-After` value, seconds.
        exempt_paths: paths never refused nor counted.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_in_flight: int,
        retry_after_s: int = 1,
        exempt_paths: frozenset[str] = EXEMPT_PATHS,
    ) -> None:
        self.app = app
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self._retry_after = str(retry_after_s)
        self._exempt = exempt_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._exempt:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_in_flight:
            response = error_response(
                503,
                "overloaded",
                f"this worker is at its limit of {self.max_in_flight} requests in flight",
                {"Retry-After": self._retry_after},
            )
            await response(scope, receive, send)
            return
        # Single-threaded event loop: no lock needed between the check and the count.
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


class DeadlineMiddleware:
    """Fix each request's `Deadline` on arrival (see module doc).

    Args:
        app: the ASGI app to wrap.
        default_s: the budget of a request that does not lower it, seconds.
    """

    def __init__(self, app: ASGIApp, *, default_s: float) -> None:
        self.app = app
        self.default_s = default_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # Repeated field lines combine into one comma-separated value (RFC 9110 5.3), which a
        # single number never is: a repeated header is refused, not silently half-read.
        values = [v for k, v in scope["headers"] if k == _TIMEOUT_HEADER]
        header = b", ".join(values) if values else None
        try:
            budget = parse_timeout_header(
                header.decode("latin-1") if header is not None else None, self.default_s
            )
        except ValueError as exc:
            detail = [
                {
                    "type": "value_error",
                    "loc": ["header", TIMEOUT_HEADER],
                    "msg": str(exc),
                    "input": header.decode("latin-1")[:64] if header is not None else None,
                }
            ]
            await error_response(422, "validation_error", detail)(scope, receive, send)
            return
        deadline = Deadline.after(budget)
        scope.setdefault("state", {})[_DEADLINE_KEY] = deadline
        body_done = False
        timed_out = False
        response_started = False

        async def receive_within_deadline() -> Message:
            # uvicorn has no body-read timeout: a client that announces a body and
            # never sends it would hold the request forever. Bound the body's arrival
            # by the request's own deadline; after the body, pass through untouched
            # (later receives wait for a disconnect, which may rightly take long).
            nonlocal body_done, timed_out
            if body_done:
                return await receive()
            try:
                async with asyncio.timeout(max(deadline.remaining(), 0.0)):
                    message = await receive()
            except TimeoutError:
                timed_out = True
                raise _BodyTimeout from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal response_started
            if timed_out:
                return  # FastAPI answers a failed body read 400: replaced by our 408
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        try:
            await self.app(scope, receive_within_deadline, guarded_send)
        except Exception:
            if not timed_out:
                raise
        if timed_out and not response_started:
            detail = "request body not received within the request deadline"
            await error_response(408, "request_timeout", detail)(scope, receive, send)


class _BodyTimeout(Exception):
    """Raised into the app from `receive` when the body does not arrive in time."""


class _BodyTooLarge(Exception):
    """Raised into the app from `receive` when the body passes the limit."""


class BodySizeLimitMiddleware:
    """Answer 413 to bodies over `max_bytes`, counting streamed bytes (see module doc).

    Args:
        app: the ASGI app to wrap.
        max_bytes: largest accepted body, bytes.
        path_limits: other limits for some paths (exact match), bytes.
    """

    def __init__(
        self, app: ASGIApp, *, max_bytes: int, path_limits: Mapping[str, int] | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.path_limits = dict(path_limits or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.path_limits.get(scope["path"], self.max_bytes)

        async def too_large() -> None:
            detail = f"request body is larger than {limit} bytes"
            await error_response(413, "payload_too_large", detail)(scope, receive, send)

        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1  # h11/httptools reject a malformed one before us
                if declared > limit:
                    await too_large()
                    return
                if declared >= 0:
                    # The HTTP server delivers exactly Content-Length bytes (uvicorn's
                    # httptools and h11 parsers stop there and refuse a header that
                    # conflicts with Transfer-Encoding), so this body cannot pass the
                    # limit: no counting wrappers around receive and send (the common
                    # case, two closures and two extra awaits per request saved).
                    await self.app(scope, receive, send)
                    return
                break

        received = 0
        exceeded = False
        response_started = False

        async def counting_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    exceeded = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal response_started
            if exceeded:
                return  # the app's answer to a cut-off body is replaced by our 413
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except _BodyTooLarge:
            pass
        except Exception:
            if not exceeded:
                raise
        if exceeded and not response_started:
            await too_large()


def install_limits(
    app: FastAPI, settings: Settings, *, path_body_limits: Mapping[str, int] | None = None
) -> None:
    """Add the three admission middlewares to `app` (in the order of the module doc).

    Call before adding middleware that must see their refusals (observability), since
    Starlette runs the last added outermost.

    Args:
        app: the app.
        settings: MAX_IN_FLIGHT_REQUESTS, REQUEST_TIMEOUT_S, MAX_BODY_BYTES.
        path_body_limits: body limits of routes that take larger uploads, bytes.
    """
    app.add_middleware(
        BodySizeLimitMiddleware, max_bytes=settings.max_body_bytes, path_limits=path_body_limits
    )
    app.add_middleware(DeadlineMiddleware, default_s=settings.request_timeout_s)
    app.add_middleware(InFlightLimitMiddleware, max_in_flight=settings.max_in_flight_requests)
